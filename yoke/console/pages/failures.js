// Failures: the inbox of every parked failure (dead letters, halted
// subscriptions, skipped events), filtered; replay or discard the selected
// ones or every one the filter selects.

import { api, get, can } from '../api.js';
import { h, link, table, time, empty, errorBox, confirmDialog, actionButton, route } from '../dom.js';

const FILTERS = ['kind', 'receiver', 'stream', 'actor', 'instance_id', 'subscription'];
const KINDS = ['', 'dead_letter', 'halted', 'skipped'];
const RECEIVERS = ['', 'actor', 'copy', 'webhook', 'call', 'processor'];
const LABEL = { dead_letter: 'dead letter', halted: 'halted', skipped: 'skipped' };

export function failureUrl(id, action) {
  return `/v1/failures/${encodeURIComponent(id)}${action ? '/' + action : ''}`;
}

export function eventCell(f) {
  return f.path !== null ? link(`${f.path} @${f.offset}`, 'event', { path: f.path, offset: f.offset }) : '(sent to the instance)';
}

export function targetCell(f) {
  if (f.kind === 'dead_letter') {
    return h('span', null, f.actor ?? '?', ' ', link(f.instance_id, 'instance', { id: f.instance_id, tab: 'dead' }, { class: 'mono' }));
  }
  return h('span', null, `${f.receiver} `, link(f.subscription, 'subscription', { path: f.path, name: f.subscription }));
}

function reload() {
  window.dispatchEvent(new HashChangeEvent('hashchange'));
}

function filterForm(chosen) {
  const pick = (name, values) => h('select', { name, id: `filter-${name}`, 'aria-label': name },
    values.map((v) => h('option', { value: v, selected: chosen[name] === v ? true : undefined }, v ? v : `any ${name}`)));
  const text = (name, placeholder) => h('input', {
    name, id: `filter-${name}`, value: chosen[name] || '', placeholder, 'aria-label': name, class: 'short',
  });
  const form = h('form', { class: 'row wrap', id: 'failure-filter' },
    pick('kind', KINDS), pick('receiver', RECEIVERS), text('stream', '/orders'), text('actor', 'actor'),
    text('instance_id', 'instance id'), text('subscription', 'subscription'),
    h('button', { type: 'submit' }, 'Filter'),
    link('Clear', 'failures', {}, { class: 'button secondary' }));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const params = {};
    for (const name of FILTERS) {
      const value = form.elements[name].value.trim();
      if (value) params[name] = value;
    }
    location.hash = route('failures', params);
  });
  return form;
}

export async function render(main, params, { signal }) {
  const chosen = {};
  for (const name of FILTERS) if (params.get(name)) chosen[name] = params.get(name);
  main.append(h('div', { class: 'page-head' }, h('h1', null, 'Failures')), filterForm(chosen));
  const { failures } = await get('/v1/failures?' + new URLSearchParams({ ...chosen, limit: 500 }), { signal });
  if (!failures.length) {
    main.append(empty(Object.keys(chosen).length
      ? 'No open failure matches this filter.'
      : 'No failures: nothing is parked. A dead letter, a halted subscription or a skipped event shows here with its error, to replay or discard.'));
    return;
  }
  const errors = errorBox();
  const done = h('p', { class: 'ok', role: 'status', hidden: true });
  const picked = () => [...main.querySelectorAll('input.pick:checked')].map((c) => c.value);
  const reason = h('input', { id: 'discard-reason', name: 'reason', placeholder: 'why (kept in the audit event)', 'aria-label': 'Reason to discard' });
  const needReason = () => {
    const text = reason.value.trim();
    if (!text) throw { code: 'reason_needed', message: 'say why in the reason box first' };
    return text;
  };
  const selected = () => {
    const ids = picked();
    if (!ids.length) throw { code: 'nothing_selected', message: 'select failures first' };
    return ids;
  };
  async function each(ids, verb, act) {
    const what = `${ids.length} failure${ids.length === 1 ? '' : 's'}`;
    if (!await confirmDialog(`${verb} ${what}?`, verb)) return;
    let ok = 0;
    const failed = [];
    for (const id of ids) {
      try { await act(id); ok += 1; } catch (err) { failed.push(`${err.code}: ${err.message}`); }
    }
    done.textContent = `${verb === 'Replay' ? 'Replayed' : 'Discarded'}: ${ok}.${failed.length ? ` Not done: ${failed.length} (${failed[0]}).` : ''}`;
    done.hidden = false;
    setTimeout(reload, 800);
  }
  async function bulk(verb) {
    const body = verb === 'Replay' ? { filter: chosen } : { filter: chosen, reason: needReason() };
    if (!await confirmDialog(`${verb} every failure this filter selects (${failures.length} shown)?`, verb)) return;
    const result = await api('POST', `/v1/failures/${verb === 'Replay' ? 'replay' : 'discard'}`, body);
    done.textContent = `${verb === 'Replay' ? 'Replayed' : 'Discarded'}: ${result.done.length}.${result.failed.length ? ` Not done: ${result.failed.length} (${result.failed[0].error.code}).` : ''}`;
    done.hidden = false;
    setTimeout(reload, 800);
  }
  if (can('admin')) {
    main.append(h('div', { class: 'row wrap', id: 'failure-actions' },
      actionButton('Replay selected', () => each(selected(), 'Replay', (id) => api('POST', failureUrl(id, 'replay'), {})), errors, { class: 'secondary', id: 'replay-selected' }),
      reason,
      actionButton('Discard selected', () => { const r = needReason(); return each(selected(), 'Discard', (id) => api('POST', failureUrl(id, 'discard'), { reason: r })); }, errors, { class: 'secondary', id: 'discard-selected' }),
      actionButton('Replay all', () => bulk('Replay'), errors, { id: 'replay-all' }),
      actionButton('Discard all', () => bulk('Discard'), errors, { class: 'danger', id: 'discard-all' })));
  }
  main.append(errors, done, table([can('admin') ? '' : null, 'Kind', 'Event', 'To', 'Failed', 'Attempts', 'Error'].filter((t) => t !== null),
    failures.map((f) => h('tr', { 'data-id': f.id, 'data-kind': f.kind },
      can('admin') ? h('td', null, h('input', { type: 'checkbox', value: f.id, 'aria-label': `Select failure ${f.id}`, class: 'pick' })) : null,
      h('td', null, link(h('span', { class: 'badge bad' }, LABEL[f.kind] || f.kind), 'failure', { id: f.id })),
      h('td', null, eventCell(f)),
      h('td', null, targetCell(f)),
      h('td', null, time(f.failed_at)),
      h('td', { class: 'num' }, f.attempt_count),
      h('td', { class: 'error-text clip' }, link(f.error || '—', 'failure', { id: f.id })))), { id: 'failures' }));
}
