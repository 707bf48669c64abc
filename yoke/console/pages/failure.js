// One failure: its event, attempts and errors; replay it as it was or with a
// corrected event, or discard it with a reason.

import { api, get, can } from '../api.js';
import { h, link, table, time, json, errorBox, confirmDialog, actionButton, copyButton, route } from '../dom.js';
import { failureUrl, eventCell, targetCell } from './failures.js';

export async function render(main, params, { signal }) {
  const id = params.get('id') || '';
  const f = await get(failureUrl(id), { signal });
  main.append(h('div', { class: 'page-head' },
    h('h1', null, h('span', { class: 'muted' }, 'Failure '), h('span', { class: 'mono' }, f.id)), copyButton(() => f.id, 'Copy id')));
  main.append(h('p', { class: 'facts-line' },
    h('span', null, h('span', { class: 'badge bad' }, f.kind)),
    h('span', null, 'event ', eventCell(f)),
    h('span', null, 'to ', targetCell(f)),
    h('span', null, 'failed ', time(f.failed_at)),
    h('span', null, 'attempts ', h('strong', null, f.attempt_count))));
  const errors = errorBox();
  const done = h('p', { class: 'ok', role: 'status', hidden: true });
  const finished = (text) => {
    done.textContent = text;
    done.hidden = false;
    setTimeout(() => { location.hash = route('failures', {}); }, 800);
  };
  if (can('admin')) {
    const start = f.event ? { payload: f.event.payload } : { payload: null };
    const correction = h('textarea', { id: 'correction', name: 'event', rows: 6, spellcheck: 'false' }, JSON.stringify(start, null, 2));
    const reason = h('input', { id: 'reason', name: 'reason', placeholder: 'why (kept in the audit event)' });
    main.append(h('section', { class: 'card form', id: 'failure-actions' },
      h('div', { class: 'row wrap' },
        actionButton('Replay as it was', async () => {
          if (!await confirmDialog('Replay this failure as it was?', 'Replay')) return;
          const r = await api('POST', failureUrl(f.id, 'replay'), {});
          finished(`Replayed (audit event ${r.audit_path} @${r.audit_offset}).`);
        }, errors, { id: 'replay' })),
      h('label', { for: 'correction' }, 'Corrected event: {"type", "payload", "metadata"}, each optional; the original stays in its stream'),
      correction,
      h('div', { class: 'row wrap' },
        actionButton('Replay corrected', async () => {
          let event;
          try { event = JSON.parse(correction.value); } catch (err) { throw { code: 'invalid_json', message: err.message }; }
          if (!await confirmDialog('Replay this failure with the corrected event?', 'Replay')) return;
          const r = await api('POST', failureUrl(f.id, 'replay'), { event });
          finished(`Replayed corrected (audit event ${r.audit_path} @${r.audit_offset}).`);
        }, errors, { id: 'replay-corrected' })),
      h('label', { for: 'reason' }, 'Reason to discard'),
      h('div', { class: 'row wrap' }, reason,
        actionButton('Discard', async () => {
          const text = reason.value.trim();
          if (!text) throw { code: 'reason_needed', message: 'say why first' };
          if (!await confirmDialog('Discard this failure? It is not delivered again.', 'Discard')) return;
          const r = await api('POST', failureUrl(f.id, 'discard'), { reason: text });
          finished(`Discarded (audit event ${r.audit_path} @${r.audit_offset}).`);
        }, errors, { class: 'danger', id: 'discard' })),
      errors, done));
  }
  main.append(h('div', { class: 'grid2' },
    h('section', { class: 'card' }, h('h2', null, 'Event'), f.event ? json(f.event) : h('p', { class: 'muted' }, 'Not shown: removed by retention, or its stream pins its data handling (read it through /api/workflow-streams).')),
    h('section', { class: 'card' }, h('h2', null, 'Attempts'),
      table(['Attempt', 'At', 'Error'], f.attempts.map((a) => h('tr', null,
        h('td', { class: 'num' }, a.number), h('td', null, time(a.at)), h('td', { class: 'error-text' }, a.error || '—'))), { id: 'attempts' }),
      f.traceback ? h('details', null, h('summary', null, 'Traceback'), h('pre', { class: 'json' }, f.traceback)) : null)));
  main.append(h('p', null, link('All failures', 'failures', {})));
}
