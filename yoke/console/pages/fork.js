// A fork of an instance (docs/advanced/forks.md): what it replayed, its
// diff against the live instance side by side (state, tables, per input
// the outcomes and effects), its runs, and discarding it. The form that
// makes one and the table of forks are the instance page's Forks tab.

import { api, get, can, forkUrl } from '../api.js';
import { h, link, num, table, time, json, empty, errorBox, confirmDialog, actionButton, copyButton } from '../dom.js';

export function forksTable(forks) {
  return table(['Fork', 'Replayed', 'Edits', 'Runs', 'Failed', 'Code', 'Expires'], forks.map((f) => h('tr', { 'data-fork': f.fork_id },
    h('td', null, link(f.fork_id, 'fork', { id: f.fork_id })),
    h('td', null, f.upto === null ? 'all' : `1..${f.upto}`),
    h('td', { class: 'num' }, f.edits.length),
    h('td', { class: 'num' }, f.summary.runs),
    h('td', { class: 'num' }, f.summary.failed),
    h('td', { class: 'mono' }, f.app ?? 'this application'),
    h('td', null, time(f.expires_at)))), { id: 'forks' });
}

export function forkForm(instanceId) {
  const errors = errorBox();
  const upto = h('input', { id: 'fork-upto', name: 'upto', type: 'number', min: 0, placeholder: 'all' });
  const edits = h('textarea', { id: 'fork-edits', name: 'edits', rows: 3, spellcheck: 'false',
    placeholder: '[{"seq": 2, "action": "replace", "payload": {...}}, {"seq": 3, "action": "drop"}]' });
  const form = h('form', { class: 'card form', id: 'fork-form' },
    h('h2', null, 'Fork this instance'),
    h('p', { class: 'muted' }, 'Replays its kept inputs in a sandbox under this application\'s code: nothing live changes.'),
    h('div', { class: 'row wrap' }, h('label', { for: 'fork-upto' }, 'Through input'), upto),
    h('label', { for: 'fork-edits' }, 'Edits (JSON, optional): replace an input\'s payload, drop it, or insert an event before it'),
    edits, errors, h('div', { class: 'row end' }, h('button', { type: 'submit', id: 'fork-make' }, 'Fork')));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    errors.show(null);
    try {
      const body = {};
      if (upto.value !== '') body.upto = Number(upto.value);
      if (edits.value.trim()) {
        try {
          body.edits = JSON.parse(edits.value);
        } catch (err) {
          throw { code: 'invalid_json', message: `the edits are not JSON: ${err.message}` };
        }
      }
      const made = await api('POST', `/v1/instances/${encodeURIComponent(instanceId)}/forks`, body);
      location.hash = `#/fork?id=${encodeURIComponent(made.fork_id)}`;
    } catch (err) {
      errors.show(err);
    }
  });
  return form;
}

const cell = (v) => h('td', { class: 'mono' }, v === undefined ? '—' : JSON.stringify(v));

function stateRows(state) {
  return [
    ...Object.entries(state.changed).map(([k, v]) => h('tr', { class: 'changed' }, h('td', null, k || '(the whole document)'), cell(v.live), cell(v.fork))),
    ...Object.entries(state.added).map(([k, v]) => h('tr', { class: 'added' }, h('td', null, k), cell(undefined), cell(v))),
    ...Object.entries(state.removed).map(([k, v]) => h('tr', { class: 'removed' }, h('td', null, k), cell(v), cell(undefined))),
  ];
}

function tableRows(t) {
  return [
    ...t.changed.map((r) => h('tr', { class: 'changed' }, cell(r.key), cell(r.live), cell(r.fork))),
    ...t.added.map((r) => h('tr', { class: 'added' }, cell(r.key), cell(undefined), cell(r.row))),
    ...t.removed.map((r) => h('tr', { class: 'removed' }, cell(r.key), cell(r.row), cell(undefined))),
  ];
}

function diffView(d) {
  const against = d.against === 'live' ? 'Live' : d.against;
  const parts = [h('p', { id: 'diff-verdict', class: d.changed ? 'bad' : 'ok' },
    d.changed ? 'The fork differs from ' + (d.against === 'live' ? 'the live instance.' : d.against + '.') : 'No difference.')];
  if (d.nondeterministic) {
    parts.push(h('p', { class: 'note' }, 'The same code and the same inputs differ: the handler reads something outside ctx (the wall clock, random numbers). Use ctx.now() and ctx.random().'));
  }
  const stateDiff = stateRows(d.state);
  if (stateDiff.length) parts.push(h('h2', null, 'State'), table(['Key', against, 'Fork'], stateDiff, { id: 'diff-state', class: 'side-by-side' }));
  for (const [name, t] of Object.entries(d.tables)) {
    parts.push(h('h2', null, 'Table ', h('code', null, name)), table(['Key', against, 'Fork'], tableRows(t), { class: 'side-by-side diff-table' }));
  }
  const perInput = [
    ...d.outcomes.map((o) => h('tr', null, h('td', { class: 'num' }, o.seq), h('td', null, 'outcome'),
      h('td', null, `${o.live ?? '—'}${o.live_error ? ': ' + o.live_error : ''}`), h('td', null, `${o.fork ?? '—'}${o.fork_error ? ': ' + o.fork_error : ''}`))),
    ...d.effects.flatMap((e) => [
      ...e.changed.map((c) => h('tr', null, h('td', { class: 'num' }, e.seq), h('td', null, c.op), cell(c.live), cell(c.fork))),
      ...e.only_live.map((x) => h('tr', null, h('td', { class: 'num' }, e.seq), h('td', null, x.op), cell(x.params), cell(undefined))),
      ...e.only_fork.map((x) => h('tr', null, h('td', { class: 'num' }, e.seq), h('td', null, x.op), cell(undefined), cell(x.params))),
    ]),
  ];
  if (perInput.length) parts.push(h('h2', null, 'Inputs'), table(['Input', 'What', against, 'Fork'], perInput, { id: 'diff-inputs', class: 'side-by-side' }));
  return parts;
}

export async function render(main, params, { signal }) {
  const id = params.get('id') || '';
  const fork = await get(forkUrl(id), { signal });
  main.append(h('div', { class: 'page-head' },
    h('h1', null, h('span', { class: 'muted' }, 'Fork '), h('span', { class: 'mono' }, fork.fork_id)), copyButton(() => fork.fork_id, 'Copy id')));
  main.append(h('p', { class: 'facts-line' },
    h('span', null, 'of ', link(`${fork.actor}/${fork.key}`, 'instance', { id: fork.instance_id })),
    h('span', null, 'inputs ', h('strong', null, fork.upto === null ? 'all' : `1..${fork.upto}`), ` (${num(fork.summary.inputs)} kept)`),
    h('span', null, 'runs ', h('strong', null, num(fork.summary.runs)), `, ${fork.summary.failed} failed`),
    h('span', null, 'code ', h('code', null, fork.app ?? 'this application')),
    h('span', null, 'expires ', time(fork.expires_at))));
  if (fork.edits.length) main.append(h('details', { class: 'card' }, h('summary', null, `${fork.edits.length} edit(s)`), json(fork.edits)));
  const errors = errorBox();
  if (can('append')) {
    main.append(h('div', { class: 'row' }, actionButton('Discard', async () => {
      if (!await confirmDialog(`Discard ${fork.fork_id}?`, 'Discard')) return;
      await api('DELETE', forkUrl(id));
      location.hash = `#/instance?id=${encodeURIComponent(fork.instance_id)}&tab=forks`;
    }, errors, { class: 'danger', id: 'fork-discard' })), errors);
  }
  const [d, runs] = await Promise.all([get(forkUrl(id, 'diff'), { signal }), get(forkUrl(id, 'runs', { limit: 200 }), { signal })]);
  main.append(h('section', { class: 'card', id: 'diff' }, ...diffView(d)));
  main.append(h('h2', null, 'Runs'), runs.runs.length ? table(['Input', 'Type', 'Outcome', 'Live', 'Ops'], runs.runs.map((r) => h('tr', null,
    h('td', { class: 'num' }, r.inserted ? '+' : r.seq),
    h('td', null, h('code', null, r.event?.type ?? '—'), r.edited ? h('span', { class: 'muted' }, ' edited') : null),
    h('td', null, r.outcome === 'done' ? h('span', { class: 'badge' }, 'done')
      : h('details', null, h('summary', { class: 'bad' }, r.error), h('pre', { class: 'json' }, r.traceback || ''))),
    h('td', null, r.live_outcome ?? '—'),
    h('td', null, r.ops.length ? r.ops.map((o) => o.op).join(', ') : '—'))), { id: 'runs' }) : empty('No runs.'));
}
