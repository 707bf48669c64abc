// Building the page. Text is always set as text (never parsed as HTML), and
// links only ever point inside the console (#/...), so nothing a stream,
// event, name or error holds can become markup or a javascript: URL.

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  setProps(el, props);
  append(el, children);
  return el;
}

const SVG = 'http://www.w3.org/2000/svg';

export function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  append(el, children);
  return el;
}

function setProps(el, props) {
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'href') el.setAttribute('href', internal(v));
    else if (k === 'value' || k === 'checked' || k === 'disabled' || k === 'indeterminate') el[k] = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function internal(href) {
  return typeof href === 'string' && href.startsWith('#') ? href : '#/';
}

// #/page?name=value: every value percent-encoded.
export function route(page, params) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null && v !== '') query.set(k, String(v));
  }
  const q = query.toString();
  return `#/${page}${q ? '?' + q : ''}`;
}

export function link(text, page, params, props) {
  return h('a', { ...props, href: route(page, params) }, text);
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

export function json(value) {
  return h('pre', { class: 'json' }, JSON.stringify(value, null, 2));
}

export function time(ms) {
  if (ms === null || ms === undefined) return '—';
  const d = new Date(ms);
  return h('time', { datetime: d.toISOString(), title: d.toISOString() }, d.toLocaleString());
}

export function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.round(s / 60)}m ago`;
  if (s < 86400) return `${Math.round(s / 3600)}h ago`;
  return `${Math.round(s / 86400)}d ago`;
}

export function num(n) {
  return typeof n === 'number' ? n.toLocaleString('en-US') : String(n ?? '—');
}

// A table that scrolls sideways on a narrow screen.
export function table(headers, rows, props) {
  return h('div', { class: 'table-wrap' },
    h('table', props,
      h('thead', null, h('tr', null, headers.map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', null, rows)));
}

// Where an operation's failure is shown: code and message, in place.
export function errorBox() {
  const box = h('p', { class: 'error', role: 'alert', hidden: true });
  box.show = (err) => {
    if (!err) { box.hidden = true; box.replaceChildren(); return; }
    box.replaceChildren(h('code', null, err.code || 'error'), ' ', err.message || String(err));
    box.hidden = false;
  };
  return box;
}

export function copyButton(getText, label = 'Copy') {
  const button = h('button', { type: 'button', class: 'small secondary' }, label);
  button.addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText(getText());
      button.textContent = 'Copied';
    } catch {
      button.textContent = 'Select and copy';
    }
    setTimeout(() => { button.textContent = label; }, 1500);
  });
  return button;
}

export function confirmDialog(text, action = 'Confirm') {
  const dialog = document.getElementById('confirm');
  document.getElementById('confirm-text').textContent = text;
  document.getElementById('confirm-ok').textContent = action;
  dialog.returnValue = '';
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), { once: true });
  });
}

// A button whose click runs an operation: disabled meanwhile, its error shown in errors.
export function actionButton(label, run, errors, props) {
  const button = h('button', { type: 'button', ...props }, label);
  button.addEventListener('click', async () => {
    errors.show(null);
    button.disabled = true;
    try {
      await run();
    } catch (err) {
      errors.show(err);
    } finally {
      button.disabled = false;
    }
  });
  return button;
}

export function empty(...children) {
  return h('div', { class: 'empty' }, children);
}
