// One subscription: its status and configuration, actions, and its
// configuration history read from the source stream's log.

import { get, streamUrl } from '../api.js';
import { h, link, num, time, json, empty, errorBox } from '../dom.js';
import { receiverText, stateOf, subscriptionActions } from './subscriptions.js';

export async function render(main, params, { signal }) {
  const path = params.get('path') || '/';
  const name = params.get('name') || '';
  const errors = errorBox();
  const s = await get(streamUrl(path, 'subscription', { name }), { signal });
  const [state, tone] = stateOf(s);
  main.append(
    h('div', { class: 'page-head' }, h('h1', null, h('span', { class: 'muted' }, 'Subscription '), h('span', { class: 'name' }, s.name)),
      h('span', null, 'on ', link(path, 'stream', { path, tab: 'subscriptions' }, { class: 'path' }))),
    h('p', { class: 'facts-line' }, h('span', { class: `badge ${tone}`, id: 'sub-state' }, state),
      h('span', null, 'cursor ', h('strong', null, num(s.processed_through_offset))),
      h('span', null, 'head ', h('strong', null, num(s.head))),
      h('span', null, 'lag ', h('strong', null, num(s.lag))),
      h('span', null, 'delivered ', h('strong', null, num(s.delivered))),
      h('span', null, 'failures ', h('strong', null, num(s.failures)))),
    errors,
    subscriptionActions(path, s, errors, { afterRemove: () => { location.hash = `#/subscriptions?path=${encodeURIComponent(path)}`; } }));
  main.append(h('div', { class: 'grid2' },
    h('section', { class: 'card' }, h('h2', null, 'Status'), h('dl', { class: 'facts' },
      h('dt', null, 'Receiver'), h('dd', { class: 'clip' }, receiverText(s.config)),
      h('dt', null, 'On a failing event'), h('dd', null, s.config.on_failing_event || 'halt'),
      h('dt', null, 'Halted'), h('dd', null, s.halted ? `on offset ${s.halted.offset} after ${s.halted.attempts} attempts` : 'no'),
      h('dt', null, 'Last error'), h('dd', { class: 'error-text' }, s.last_error || '—'),
      h('dt', null, 'Last error at'), h('dd', null, s.last_error ? time(s.last_error_at) : '—'),
      h('dt', null, 'Attempts'), h('dd', null, num(s.attempts)),
      h('dt', null, 'Next retry'), h('dd', null, s.next_retry_at ? time(s.next_retry_at) : '—'),
      h('dt', null, 'Delivered by'), h('dd', { class: 'mono' }, s.delivering || 'no process now'),
      h('dt', null, 'Configured at'), h('dd', null, link(`offset ${s.configured_at}`, 'event', { path, offset: s.configured_at })))),
    h('section', { class: 'card' }, h('h2', null, 'Configuration'), json(s.config))));

  const history = h('tbody', null);
  const status = h('p', { class: 'muted', role: 'status' });
  const more = h('button', { type: 'button', class: 'secondary', hidden: true }, 'Look further');
  const historyErrors = errorBox();
  main.append(h('section', { class: 'card' }, h('h2', null, 'Configuration history'),
    h('p', { class: 'muted' }, 'Its control events, read from the log of ', path, '.'),
    h('div', { class: 'table-wrap' }, h('table', { id: 'history' },
      h('thead', null, h('tr', null, ['Offset', 'Change', 'At', 'Details'].map((t) => h('th', { scope: 'col' }, t)))), history)),
    status, more, historyErrors));
  let after = 0;
  let found = 0;
  async function load() {
    more.disabled = true;
    try {
      const page = await get(streamUrl(path, 'subscription/history', { name, after }), { signal });
      for (const change of page.changes) {
        found += 1;
        const details = { ...change.payload };
        delete details.name;
        history.append(h('tr', null,
          h('td', { class: 'num' }, link(String(change.offset), 'event', { path, offset: change.offset })),
          h('td', null, change.type.replace('yoke.subscription.', '')),
          h('td', null, time(change.at)),
          h('td', { class: 'mono clip' }, JSON.stringify(details))));
      }
      after = page.scanned_through;
      const done = after >= page.head;
      status.textContent = done ? `${found} change${found === 1 ? '' : 's'}, the whole log read (offsets ${num(page.from_offset)}–${num(page.head)}).`
        : `${found} change${found === 1 ? '' : 's'} so far; read through offset ${num(after)} of ${num(page.head)}.`;
      more.hidden = done;
    } catch (err) {
      if (err.name !== 'AbortError') historyErrors.show(err);
    } finally {
      more.disabled = false;
    }
  }
  more.addEventListener('click', load);
  await load();
  if (!found && more.hidden) history.append(h('tr', null, h('td', { colspan: 4 }, empty('No control events left in the log (retention removed them).'))));
}
