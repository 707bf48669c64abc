// One actor instance: config and filter, state, queue rows, dead letters
// (redrive and drop, one or in bulk), schedules, its kept inputs, its forks
// (and a form to make one), and a read-only SQL box over its SQLite database.

import { api, get, can, instanceUrl } from '../api.js';
import { forkForm, forksTable } from './fork.js';
import {
  h, link, num, table, time, json, empty, errorBox, confirmDialog, actionButton, copyButton,
} from '../dom.js';

const TABS = [['state', 'State'], ['queue', 'Queue'], ['dead', 'Dead letters'], ['schedules', 'Schedules'], ['inputs', 'Inputs'],
  ['forks', 'Forks'], ['sql', 'SQL']];

export async function render(main, params, { signal }) {
  const id = params.get('id') || '';
  const tab = params.get('tab') || 'state';
  const shown = await get(instanceUrl(id), { signal });
  main.append(h('div', { class: 'page-head' },
    h('h1', null, h('span', { class: 'muted' }, 'Instance '), h('span', { class: 'mono' }, shown.id)), copyButton(() => shown.id, 'Copy id')));
  main.append(h('p', { class: 'facts-line' },
    h('span', null, 'actor ', link(shown.actor, 'actors', { actor: shown.actor })),
    shown.key !== null ? h('span', null, 'key ', h('code', null, shown.key)) : null,
    h('span', null, 'pending ', h('strong', null, num(shown.queue.pending))),
    h('span', null, 'processing ', h('strong', null, num(shown.queue.processing))),
    h('span', null, 'dead ', h('strong', { id: 'dead-count', class: shown.queue.dead ? 'bad' : '' }, num(shown.queue.dead)))));
  main.append(h('nav', { class: 'tabs', 'aria-label': 'Instance sections' }, TABS.map(([key, label]) =>
    link(label, 'instance', { id, tab: key }, { 'aria-current': key === tab ? 'page' : undefined, 'data-tab': key }))));
  const body = h('section', { class: 'tab-body' });
  main.append(body);
  if (tab === 'queue') return queueTab(body, id, signal);
  if (tab === 'dead') return deadTab(body, id, signal);
  if (tab === 'schedules') return schedulesTab(body, id, signal);
  if (tab === 'inputs') return inputsTab(body, id, params, signal);
  if (tab === 'forks') return forksTab(body, id, signal);
  if (tab === 'sql') return sqlTab(body, id);
  body.append(h('div', { class: 'grid2' },
    h('section', { class: 'card' }, h('h2', null, 'State ', h('span', { class: 'muted' }, `version ${shown.state.version}`)),
      shown.state.version ? json(shown.state.value) : empty('No state written yet.'),
      h('div', { class: 'row' }, copyButton(() => JSON.stringify(shown.state.value, null, 2), 'Copy state'))),
    h('section', { class: 'card' }, h('h2', null, 'Configuration'), h('dl', { class: 'facts' },
      h('dt', null, 'Created'), h('dd', null, time(shown.created_at)),
      h('dt', null, 'Worker'), h('dd', { class: 'mono' }, shown.worker_id ?? '—'),
      h('dt', null, 'Parent'), h('dd', null, shown.parent_id ? link(shown.parent_id, 'instance', { id: shown.parent_id }) : '—')),
      h('h3', null, 'Config'), json(shown.config), h('h3', null, 'Filter'), json(shown.filter))));
}

function rowsTable(rows, select) {
  return table([select ? '' : null, 'Row', 'Status', 'Attempts', 'Event', 'Stream', 'Last error', 'Next try'].filter((t) => t !== null),
    rows.map((r) => h('tr', { 'data-qid': r.qid },
      select ? h('td', null, h('input', { type: 'checkbox', value: r.qid, 'aria-label': `Select row ${r.qid}`, class: 'pick' })) : null,
      h('td', { class: 'num' }, r.qid),
      h('td', null, h('span', { class: r.status === 'dead' ? 'badge bad' : 'badge' }, r.status)),
      h('td', { class: 'num' }, r.attempts),
      h('td', null, h('code', null, r.event?.type ?? '—')),
      h('td', null, r.path ? link(`${r.path} @${r.offset}`, 'event', { path: r.path, offset: r.offset }) : '—'),
      h('td', { class: 'error-text' }, r.last_error ? h('details', null, h('summary', null, r.last_error), h('pre', { class: 'json' }, r.last_traceback || '')) : '—'),
      h('td', null, r.status === 'pending' ? time(r.available_at) : '—'))), { class: 'rows' });
}

async function queueTab(body, id, signal) {
  const { rows } = await get(instanceUrl(id, 'queue', { limit: 200 }), { signal });
  const live = rows.filter((r) => r.status !== 'dead');
  body.append(live.length ? rowsTable(live, false) : empty('The queue is empty: every routed event has been processed.'));
}

async function deadTab(body, id, signal) {
  const errors = errorBox();
  const done = h('p', { class: 'ok', role: 'status', hidden: true });
  const { rows } = await get(instanceUrl(id, 'dlq', { limit: 500 }), { signal });
  if (!rows.length) {
    body.append(empty('No dead letters. A row is dead-lettered after its last attempt failed; it shows here with its error.'));
    return;
  }
  const reload = () => window.dispatchEvent(new HashChangeEvent('hashchange'));
  const picked = () => [...body.querySelectorAll('input.pick:checked')].map((c) => Number(c.value));
  async function run(kind, qids) {
    const what = qids ? `${qids.length} selected dead row${qids.length === 1 ? '' : 's'}` : 'every dead row';
    const verb = kind === 'redrive' ? 'Redrive' : 'Drop';
    const text = kind === 'redrive' ? `${verb} ${what}? They go back to the queue with their attempts reset.` : `${verb} ${what}? They are deleted for good.`;
    if (!await confirmDialog(text, verb)) return;
    const result = await api('POST', instanceUrl(id, `dlq/${kind}`), qids ? { qids } : {});
    done.textContent = kind === 'redrive' ? `Redriven: ${result.redriven}.` : `Dropped: ${result.dropped}.`;
    done.hidden = false;
    setTimeout(reload, 600);
  }
  if (can('admin')) {
    body.append(h('div', { class: 'row wrap', id: 'dead-actions' },
      actionButton('Redrive selected', () => { const q = picked(); if (!q.length) throw { code: 'nothing_selected', message: 'select rows first' }; return run('redrive', q); }, errors, { class: 'secondary', id: 'redrive-selected' }),
      actionButton('Drop selected', () => { const q = picked(); if (!q.length) throw { code: 'nothing_selected', message: 'select rows first' }; return run('drop', q); }, errors, { class: 'secondary', id: 'drop-selected' }),
      actionButton('Redrive all', () => run('redrive', null), errors, { id: 'redrive-all' }),
      actionButton('Drop all', () => run('drop', null), errors, { class: 'danger', id: 'drop-all' })));
  }
  body.append(errors, done, rowsTable(rows, can('admin')));
}

async function schedulesTab(body, id, signal) {
  const { schedules } = await get(instanceUrl(id, 'schedules'), { signal });
  if (!schedules.length) {
    body.append(empty('No schedules. An actor sets them with ctx.schedules.upsert(name, at= / after_s= / cron=, event=...).'));
    return;
  }
  body.append(table(['Name', 'Due', 'Cron', 'Event', 'Appends to'], schedules.map((s) => h('tr', null,
    h('td', null, s.name), h('td', null, time(s.due_at)), h('td', null, s.cron ? h('code', null, s.cron) : '—'),
    h('td', { class: 'mono clip' }, JSON.stringify(s.event)),
    h('td', null, s.stream ? link(s.stream, 'stream', { path: s.stream }) : 'its own queue'))), { id: 'schedules' }));
}

function sqlTab(body, id) {
  const errors = errorBox();
  const result = h('div', { id: 'sql-result' });
  const input = h('textarea', { id: 'sql', name: 'sql', rows: 5, spellcheck: 'false' }, "SELECT name, sql FROM sqlite_master WHERE type = 'table'");
  const rows = h('input', { id: 'sql-rows', name: 'max_rows', type: 'number', min: 1, max: 10000, value: 500 });
  const form = h('form', { class: 'card form', id: 'sql-form' },
    h('label', { for: 'sql' }, 'Read-only SQL on this instance\'s SQLite database (its ctx.sqlite tables and _yoke_state)'), input,
    h('div', { class: 'row wrap' }, h('label', { for: 'sql-rows' }, 'At most'), rows, h('span', null, 'rows, 2 s'),
      h('button', { type: 'submit' }, 'Run')),
    h('p', { class: 'muted' }, 'Ctrl+Enter runs it. Writes, DDL, ATTACH and pragmas that set anything are refused.'),
    errors);
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); form.requestSubmit(); }
  });
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    errors.show(null);
    result.replaceChildren();
    try {
      const answer = await api('POST', instanceUrl(id, 'sql'), { sql: input.value, max_rows: Number(rows.value) || 500 });
      result.append(
        h('p', { class: 'muted' }, `${answer.rows.length} row${answer.rows.length === 1 ? '' : 's'}${answer.truncated ? ' (more matched: raise the limit)' : ''}`),
        table(answer.columns, answer.rows.map((r) => h('tr', null, r.map((v) => h('td', { class: 'mono' }, v === null ? 'NULL' : typeof v === 'object' ? JSON.stringify(v) : String(v)))))));
    } catch (err) {
      errors.show(err);
    }
  });
  body.append(form, result);
}

async function inputsTab(body, id, params, signal) {
  const after = Number(params.get('after') || 0);
  const page = await get(instanceUrl(id, 'inputs', { after, limit: 100 }), { signal });
  if (!page.inputs.length) {
    body.append(empty('No inputs kept. Every event, message and schedule firing a run finished with is kept here in order (unless the actor keeps none).'));
    return;
  }
  body.append(table(['#', 'Kind', 'Event', 'Type', 'Outcome', 'Attempts', 'Ops', 'Processed', 'Code'],
    page.inputs.map((i) => h('tr', { 'data-seq': i.seq },
      h('td', { class: 'num' }, i.seq),
      h('td', null, i.kind),
      h('td', null, i.path ? link(`${i.path} @${i.offset}`, 'event', { path: i.path, offset: i.offset }) : '—'),
      h('td', null, h('code', null, i.event?.type ?? '—')),
      h('td', null, i.outcome === 'done' ? h('span', { class: 'badge' }, 'done')
        : h('span', { class: 'badge bad', title: i.error || '' }, 'dead')),
      h('td', { class: 'num' }, i.attempts),
      h('td', null, i.ops.length ? h('details', null, h('summary', null, i.ops.map((o) => o.op).join(', ')), json(i.ops)) : '—'),
      h('td', null, time(i.processed_at)),
      h('td', { class: 'mono' }, i.code_version ?? '—'))), { id: 'inputs' }));
  if (page.next_after !== null) body.append(h('p', null, link('Next page', 'instance', { id, tab: 'inputs', after: page.next_after })));
}

async function forksTab(body, id, signal) {
  const { forks } = await get(`/v1/forks?${new URLSearchParams({ instance_id: id })}`, { signal });
  if (can('append')) body.append(forkForm(id));
  body.append(forks.length ? forksTable(forks) : empty('No forks of this instance. A fork replays its kept inputs in a sandbox, under this code or another, edited or not, and shows what differs.'));
}
