// Subscriptions: per stream, every subscription's receiver, state, cursor,
// lag, failures and last error, with resume, move the cursor and remove.

import { api, get, can, streamUrl } from '../api.js';
import { h, link, num, ago, table, empty, errorBox, confirmDialog, actionButton, route } from '../dom.js';

export function receiverText(config) {
  const r = config.receiver || config;
  if (r.kind === 'copy') return `copy → ${r.target}`;
  if (r.kind === 'webhook') return `webhook → ${r.url}`;
  if (r.kind === 'call') return `call ${r.function}`;
  if (r.kind === 'processor') return `processor ${r.processor}`;
  return r.kind || JSON.stringify(r);
}

export function stateOf(s) {
  if (s.halted) return ['halted', 'bad'];
  if (s.attempts > 0) return ['retrying', 'warn'];
  if (!s.delivering) return ['not delivered here', ''];
  return [s.lag ? 'running' : 'caught up', 'good'];
}

function reload() {
  window.dispatchEvent(new HashChangeEvent('hashchange'));
}

// Resume, move the cursor, remove: for one subscription, errors shown in place.
export function subscriptionActions(path, s, errors, { afterRemove } = {}) {
  if (!can('admin')) return null;
  const url = (action) => streamUrl(path, action, { name: s.name });
  const offset = h('input', { type: 'number', min: 0, name: 'after_offset', value: s.processed_through_offset, 'aria-label': `New cursor of ${s.name}`, class: 'short' });
  const alsoResume = h('input', { type: 'checkbox', name: 'resume', checked: !!s.halted });
  const move = h('form', { class: 'row inline-form', hidden: true },
    h('label', null, 'deliver after offset ', offset), h('label', null, alsoResume, ' and resume'),
    h('button', { type: 'submit', class: 'small' }, 'Move'));
  move.addEventListener('submit', async (e) => {
    e.preventDefault();
    errors.show(null);
    const after = Number(offset.value);
    if (!await confirmDialog(`Move the cursor of ${s.name} to ${after}? It delivers again from offset ${after + 1} (or skips ahead).`, 'Move cursor')) return;
    try {
      await api('POST', url('subscription/cursor'), { after_offset: after, resume: alsoResume.checked });
      reload();
    } catch (err) { errors.show(err); }
  });
  return h('div', { class: 'row wrap actions' },
    s.halted ? actionButton('Resume', async () => {
      if (!await confirmDialog(`Resume ${s.name}? It retries the event it halted on (offset ${s.halted.offset}).`, 'Resume')) return;
      await api('POST', url('subscription/resume'));
      reload();
    }, errors, { class: 'small', 'data-action': 'resume' }) : null,
    h('button', { type: 'button', class: 'small secondary', 'data-action': 'cursor', onclick: () => { move.hidden = !move.hidden; if (!move.hidden) offset.focus(); } }, 'Move cursor'),
    actionButton('Remove', async () => {
      if (!await confirmDialog(`Remove the subscription ${s.name}? Deliveries stop; its history stays in the log.`, 'Remove')) return;
      await api('DELETE', url('subscription'));
      if (afterRemove) afterRemove(); else reload();
    }, errors, { class: 'small danger', 'data-action': 'remove' }),
    move);
}

// The last error, and how long ago it happened (kept after the subscription
// recovers: a running one that failed lately says so).
function lastErrorCell(s) {
  if (!s.last_error) return h('td', { class: 'error-text clip' }, '—');
  const at = s.last_error_at;
  return h('td', { class: 'error-text clip', title: at ? new Date(at).toISOString() : null },
    at ? `${ago(at)}: ` : '', s.last_error);
}

export async function streamSubscriptions(body, path, signal) {
  const { subscriptions } = await get(streamUrl(path, 'subscriptions'), { signal });
  if (!subscriptions.length) {
    body.append(empty(`No subscriptions on ${path}. Configure one with POST ${streamUrl(path, 'subscriptions')}, e.g. {"name": "mirror", "receiver": {"kind": "copy", "target": "/archive"}}, or \`yoke subscriptions add\`.`));
    return;
  }
  const errors = errorBox();
  body.append(errors, table(['Subscription', 'Receiver', 'State', 'Cursor', 'Lag', 'Delivered', 'Failures', 'Last error', ''],
    subscriptions.map((s) => {
      const [state, tone] = stateOf(s);
      return h('tr', { 'data-name': s.name },
        h('td', null, link(s.name, 'subscription', { path, name: s.name })),
        h('td', { class: 'clip' }, receiverText(s.config)),
        h('td', null, h('span', { class: `badge ${tone}` }, state), s.config.on_failing_event === 'skip' ? h('span', { class: 'badge' }, 'skips failing events') : null),
        h('td', { class: 'num' }, num(s.processed_through_offset)),
        h('td', { class: 'num' }, num(s.lag)),
        h('td', { class: 'num' }, num(s.delivered)),
        h('td', { class: 'num' }, num(s.failures)),
        lastErrorCell(s),
        h('td', null, subscriptionActions(path, s, errors)));
    }), { id: 'subscriptions' }));
}

export async function render(main, params, { signal }) {
  const path = params.get('path') || '';
  const input = h('input', { id: 'sub-path', name: 'path', value: path || '/', 'aria-label': 'Stream path', placeholder: '/orders' });
  const form = h('form', { class: 'row' }, input, h('button', { type: 'submit' }, 'Show its subscriptions'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    let p = input.value.trim() || '/';
    if (!p.startsWith('/')) p = '/' + p;
    location.hash = route('subscriptions', { path: p });
  });
  main.append(h('div', { class: 'page-head' }, h('h1', null, 'Subscriptions'), form));
  if (path) {
    main.append(h('h2', null, 'On ', link(path, 'stream', { path }, { class: 'path' })));
    await streamSubscriptions(main, path, signal);
    return;
  }
  const overview = await get('/v1/overview', { signal });
  const subs = overview.subscriptions;
  main.append(h('p', { class: 'facts-line' },
    h('span', null, 'subscriptions ', h('strong', null, num(subs.count))),
    h('span', null, 'halted ', h('strong', { class: subs.halted ? 'bad' : '' }, num(subs.halted))),
    h('span', null, 'total lag ', h('strong', null, num(subs.lag)))));
  if (!subs.count) {
    main.append(empty('No subscriptions in this tenant yet. A subscription copies a stream\'s events to another stream, calls a function or posts webhooks: POST /v1/streams/{path}/-/subscriptions or `yoke subscriptions add`.'));
    return;
  }
  main.append(h('h2', null, 'Halted or lagging'));
  if (!subs.attention.length) {
    main.append(empty('Every subscription is running and caught up. Pick a stream above to see its subscriptions.'));
    return;
  }
  main.append(table(['Stream', 'Subscription', 'State', 'Lag', 'Last error'], subs.attention.map((s) => h('tr', null,
    h('td', null, link(s.path, 'subscriptions', { path: s.path })),
    h('td', null, link(s.name, 'subscription', { path: s.path, name: s.name })),
    h('td', null, h('span', { class: s.halted ? 'badge bad' : 'badge warn' }, s.halted ? 'halted' : 'lagging')),
    h('td', { class: 'num' }, num(s.lag)),
    h('td', { class: 'error-text clip' }, s.last_error || '—'))), { id: 'attention' }));
}
