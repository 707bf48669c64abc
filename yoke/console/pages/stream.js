// One stream: its info and settings, its events (cursor paging), a live
// tail (paused, filtered by types and JSONata), the append form, and its
// subscriptions.

import { api, get, can, streamUrl } from '../api.js';
import {
  h, link, num, table, time, json, empty, errorBox, route, copyButton, confirmDialog, actionButton,
} from '../dom.js';
import { firstEventCurl } from './streams.js';
import { streamSubscriptions } from './subscriptions.js';

const PAGE = 50;
const TAIL_KEEP = 500;
const TABS = [['events', 'Events'], ['tail', 'Live tail'], ['append', 'Append'], ['subscriptions', 'Subscriptions'], ['settings', 'Settings']];

export async function render(main, params, { signal }) {
  const path = params.get('path') || '/';
  const tab = params.get('tab') || 'events';
  const errors = errorBox();
  main.append(h('div', { class: 'page-head' },
    h('h1', null, h('span', { class: 'muted' }, 'Stream '), h('span', { class: 'path' }, path)),
    copyButton(() => path, 'Copy path')));
  let info;
  try {
    info = await get(streamUrl(path), { signal });
  } catch (err) {
    if (err.code === 'stream_not_found') {
      const curl = firstEventCurl(path);
      main.append(empty(h('p', null, `The stream ${path} does not exist yet: its first event creates it.`),
        h('pre', { class: 'cmd' }, curl), copyButton(() => curl, 'Copy the command')));
      return;
    }
    throw err;
  }
  main.append(h('p', { class: 'facts-line' },
    h('span', null, 'head ', h('strong', { id: 'head' }, num(info.head))),
    h('span', null, 'earliest ', h('strong', null, num(info.earliest))),
    h('span', null, info.closed ? h('span', { class: 'badge bad' }, 'closed') : h('span', { class: 'badge good' }, 'open')),
    info.legal_hold ? h('span', { class: 'badge' }, 'legal hold') : null,
    h('span', null, 'retention ', retentionText(info.retention))));
  main.append(h('nav', { class: 'tabs', 'aria-label': 'Stream sections' }, TABS.map(([key, label]) =>
    link(label, 'stream', { path, tab: key }, { 'aria-current': key === tab ? 'page' : undefined, 'data-tab': key }))));
  main.append(errors);
  const body = h('section', { class: 'tab-body' });
  main.append(body);
  if (tab === 'tail') return tailTab(body, path, info);
  if (tab === 'append') return appendTab(body, path, info);
  if (tab === 'subscriptions') return streamSubscriptions(body, path, signal);
  if (tab === 'settings') return settingsTab(body, path, info);
  return eventsTab(body, path, info, params, signal);
}

function retentionText(r) {
  const parts = [];
  if (r.max_age_s !== null) parts.push(`${num(r.max_age_s)} s`);
  if (r.max_events !== null) parts.push(`${num(r.max_events)} events`);
  return parts.length ? parts.join(', ') : 'forever';
}

function preview(value) {
  const text = JSON.stringify(value);
  return text === undefined ? '' : text.length > 160 ? text.slice(0, 160) + '…' : text;
}

function eventRow(path, e) {
  return h('tr', { 'data-offset': e.offset },
    h('td', { class: 'num' }, link(String(e.offset), 'event', { path, offset: e.offset })),
    h('td', null, h('code', null, e.type)),
    h('td', null, time(e.at)),
    h('td', { class: 'clip mono' }, preview(e.payload)));
}

async function eventsTab(body, path, info, params, signal) {
  const floor = info.earliest - 1;
  let after = params.has('after') ? Number(params.get('after')) : Math.max(floor, info.head - PAGE);
  if (!Number.isFinite(after) || after < floor) after = floor;
  const page = await get(streamUrl(path, 'events', { after, limit: PAGE }), { signal });
  const events = page.events;
  const go = h('input', { type: 'number', min: info.earliest, max: info.head, name: 'offset', id: 'goto', 'aria-label': 'Offset', placeholder: 'offset' });
  const jump = h('form', { class: 'row' }, go, h('button', { type: 'submit', class: 'secondary' }, 'Go to offset'));
  jump.addEventListener('submit', (e) => {
    e.preventDefault();
    const n = Number(go.value);
    if (Number.isInteger(n) && n >= 1) location.hash = route('stream', { path, tab: 'events', after: Math.max(floor, n - 1) });
  });
  const first = events[0];
  const last = events[events.length - 1];
  const pager = h('nav', { class: 'row pager', 'aria-label': 'Event pages' },
    link('Oldest', 'stream', { path, tab: 'events', after: floor }, { class: 'button secondary' }),
    first && first.offset > info.earliest ? link('Older', 'stream', { path, tab: 'events', after: Math.max(floor, first.offset - 1 - PAGE) }, { class: 'button secondary', rel: 'prev' }) : null,
    last && last.offset < info.head ? link('Newer', 'stream', { path, tab: 'events', after: last.offset }, { class: 'button secondary', rel: 'next' }) : null,
    link('Newest', 'stream', { path, tab: 'events' }, { class: 'button secondary' }),
    jump);
  if (!events.length) {
    body.append(pager, empty(info.head ? 'No events after this offset.' : 'No events yet.',
      can('append') ? [' ', link('Append one', 'stream', { path, tab: 'append' })] : null));
    return;
  }
  body.append(
    h('p', { class: 'muted' }, `Offsets ${num(first.offset)}–${num(last.offset)} of ${num(info.head)}`),
    table(['Offset', 'Type', 'At', 'Payload'], events.map((e) => eventRow(path, e)), { id: 'events' }),
    pager);
}

// The tail over fetch (not EventSource): a refused tail (a bad filter) shows its error code.
function tailTab(body, path, info) {
  const errors = errorBox();
  const types = h('input', { id: 'tail-types', name: 'types', placeholder: 'order.*, invoice.paid', 'aria-label': 'Types' });
  const where = h('input', { id: 'tail-where', name: 'where', placeholder: 'payload.total > 100', 'aria-label': 'JSONata filter' });
  const state = h('span', { class: 'muted', id: 'tail-state', role: 'status' }, 'connecting…');
  const rows = h('tbody', null);
  const pause = h('button', { type: 'button', id: 'tail-pause', class: 'secondary' }, 'Pause');
  const form = h('form', { class: 'row wrap', id: 'tail-filter' },
    h('label', { for: 'tail-types' }, 'Types'), types,
    h('label', { for: 'tail-where' }, 'Where'), where,
    h('button', { type: 'submit' }, 'Apply filter'), pause, state);
  const list = h('div', { class: 'table-wrap' }, h('table', { id: 'tail' },
    h('thead', null, h('tr', null, ['Offset', 'Type', 'At', 'Payload'].map((t) => h('th', { scope: 'col' }, t)))), rows));
  const hint = empty('Waiting for new events. Append one from the Append tab, or with curl:',
    h('pre', { class: 'cmd' }, firstEventCurl(path)));
  body.append(form, errors, hint, list);
  let cursor = info.head;
  let controller = null;
  let paused = false;

  async function follow() {
    controller?.abort();
    controller = new AbortController();
    const mine = controller;
    errors.show(null);
    const query = { after: cursor };
    if (types.value.trim()) query.types = types.value.trim();
    if (where.value.trim()) query.where = where.value.trim();
    let response;
    try {
      response = await fetch(streamUrl(path, 'tail', query), { signal: mine.signal, headers: { Accept: 'text/event-stream' } });
    } catch (err) {
      if (err.name !== 'AbortError') { state.textContent = 'disconnected'; errors.show({ code: 'unreachable', message: err.message }); }
      return;
    }
    if (!response.ok) {
      let error = {};
      try { error = (await response.json()).error || {}; } catch { /* not JSON */ }
      state.textContent = 'stopped';
      errors.show({ code: error.code || `http_${response.status}`, message: error.message || response.statusText });
      return;
    }
    state.textContent = 'live';
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          frame(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
        }
      }
      if (mine === controller) state.textContent = 'ended';
    } catch (err) {
      if (err.name !== 'AbortError') state.textContent = 'disconnected';
    }
  }

  function frame(text) {
    let kind = 'message';
    const data = [];
    for (const line of text.split('\n')) {
      if (line.startsWith('event:')) kind = line.slice(6).trim();
      else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
    }
    if (!data.length) return;
    const value = JSON.parse(data.join('\n'));
    if (kind === 'error') { errors.show(value.error || value); return; }
    if (kind === 'closed') { state.textContent = 'the stream is closed'; return; }
    cursor = Math.max(cursor, value.offset);
    hint.hidden = true;
    rows.prepend(eventRow(path, value));
    while (rows.children.length > TAIL_KEEP) rows.lastElementChild.remove();
  }

  form.addEventListener('submit', (e) => {
    e.preventDefault();
    rows.replaceChildren();
    hint.hidden = false;
    paused = false;
    pause.textContent = 'Pause';
    follow();
  });
  pause.addEventListener('click', () => {
    paused = !paused;
    pause.textContent = paused ? 'Resume' : 'Pause';
    if (paused) { controller?.abort(); state.textContent = 'paused'; } else follow();
  });
  follow();
  return () => controller?.abort();
}

function appendTab(body, path, info) {
  if (!can('append')) {
    body.append(empty('This session\'s token has no append scope: it can read this stream, not append to it.'));
    return;
  }
  const errors = errorBox();
  const done = h('p', { class: 'ok', role: 'status', hidden: true });
  const type = h('input', { id: 'append-type', name: 'type', required: true, placeholder: 'order.placed' });
  const payload = h('textarea', { id: 'append-payload', name: 'payload', rows: 8, spellcheck: 'false' }, '{\n  \n}');
  const key = h('input', { id: 'append-key', name: 'key', placeholder: 'optional: makes a retry safe' });
  const form = h('form', { class: 'card form', id: 'append' },
    h('label', { for: 'append-type' }, 'Type'), type,
    h('label', { for: 'append-payload' }, 'Payload (JSON)'), payload,
    h('label', { for: 'append-key' }, 'Idempotency key'), key,
    errors, done,
    h('div', { class: 'row end' }, h('button', { type: 'submit' }, 'Append')));
  if (info.closed) body.append(h('p', { class: 'note' }, 'This stream is closed: appends are refused.'));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    errors.show(null);
    done.hidden = true;
    let value;
    try {
      value = payload.value.trim() ? JSON.parse(payload.value) : null;
    } catch (err) {
      errors.show({ code: 'invalid_json', message: `the payload is not JSON: ${err.message}` });
      return;
    }
    const event = { type: type.value.trim() };
    if (value !== null) event.payload = value;
    if (key.value.trim()) event.idempotency_key = key.value.trim();
    try {
      const appended = await api('POST', streamUrl(path, 'events'), event);
      done.replaceChildren('Appended at offset ', link(String(appended.offset), 'event', { path, offset: appended.offset }), '.');
      done.hidden = false;
    } catch (err) {
      errors.show(err);
    }
  });
  body.append(form);
  type.focus();
}

function settingsTab(body, path, info) {
  const errors = errorBox();
  body.append(h('div', { class: 'grid2' },
    h('section', { class: 'card' }, h('h2', null, 'Info'), h('dl', { class: 'facts' },
      h('dt', null, 'Stream id'), h('dd', { class: 'mono' }, info.stream_id),
      h('dt', null, 'Created'), h('dd', null, time(info.created_at)),
      h('dt', null, 'Head'), h('dd', null, num(info.head)),
      h('dt', null, 'Earliest'), h('dd', null, num(info.earliest)),
      h('dt', null, 'Closed'), h('dd', null, info.closed ? 'yes' : 'no'),
      h('dt', null, 'Legal hold'), h('dd', null, info.legal_hold ? 'on' : 'off'),
      h('dt', null, 'Retention'), h('dd', null, retentionText(info.retention)),
      h('dt', null, 'Pinned'), h('dd', null, info.pinned ? 'yes (retention and limits fixed at creation)' : 'no'))),
    h('section', { class: 'card' }, h('h2', null, 'Limits and usage'), json({ limits: info.limits, usage: info.usage, metadata: info.metadata }))));
  if (!can('admin')) {
    body.append(h('p', { class: 'muted' }, 'Closing, retention and legal hold need a token with the admin scope.'));
    return;
  }
  const reload = () => window.dispatchEvent(new HashChangeEvent('hashchange'));
  const age = h('input', { id: 'retention-age', name: 'max_age_s', type: 'number', min: 0, step: 'any', value: info.retention.max_age_s ?? '' });
  const count = h('input', { id: 'retention-events', name: 'max_events', type: 'number', min: 1, value: info.retention.max_events ?? '' });
  const retention = h('form', { class: 'card form', id: 'retention' }, h('h2', null, 'Retention'),
    h('label', { for: 'retention-age' }, 'Keep events for at most (seconds; empty: no limit)'), age,
    h('label', { for: 'retention-events' }, 'Keep at most this many events (empty: no limit)'), count,
    h('div', { class: 'row end' }, h('button', { type: 'submit' }, 'Set retention')));
  retention.addEventListener('submit', async (e) => {
    e.preventDefault();
    errors.show(null);
    const body = {
      max_age_s: age.value === '' ? null : Number(age.value),
      max_events: count.value === '' ? null : Number(count.value),
    };
    if (!await confirmDialog(`Set the retention of ${path}? Events older or beyond it are removed for good (unless a legal hold is on).`, 'Set retention')) return;
    try {
      await api('PUT', streamUrl(path, 'retention'), body);
      reload();
    } catch (err) { errors.show(err); }
  });
  const actions = h('section', { class: 'card' }, h('h2', null, 'Actions'), h('div', { class: 'row wrap' },
    actionButton(info.legal_hold ? 'Lift the legal hold' : 'Put on legal hold', async () => {
      if (!await confirmDialog(info.legal_hold ? `Lift the legal hold on ${path}? Retention applies again.` : `Put ${path} on legal hold? Retention removes nothing while it is on.`, info.legal_hold ? 'Lift' : 'Hold')) return;
      await api('PUT', streamUrl(path, 'legal-hold'), { on: !info.legal_hold });
      reload();
    }, errors, { class: 'secondary', id: 'legal-hold' }),
    info.closed ? null : actionButton('Close the stream', async () => {
      if (!await confirmDialog(`Close ${path}? Appends are refused from then on; tails end once they have read everything. This cannot be undone.`, 'Close')) return;
      await api('POST', streamUrl(path, 'close'));
      reload();
    }, errors, { class: 'danger', id: 'close-stream' })));
  body.append(errors, h('div', { class: 'grid2' }, retention, actions));
}
