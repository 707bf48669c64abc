// SQL: one read-only query across every actor instance's tables and Yoke's
// own records (POST /v1/sql), the tables a query can name (GET
// /v1/sql/tables), the answer paged here, and the same query's rows
// downloaded as CSV (Accept: text/csv). The query is kept in the address
// (#/sql?q=...), so a link or a reload runs it again. One instance's own
// database has its SQL box on the instance page.

import { api, apiBlob, get } from '../api.js';
import { h, append, clear, route, empty, errorBox, actionButton, num } from '../dom.js';

const PAGE = 50;
const MAX_ROWS = 1000;
const EXAMPLE = 'SELECT actor, count(*) AS instances\nFROM yoke.instances\nGROUP BY actor\nORDER BY actor';
const STREAM = '/your/stream';
// Plain names that are SQL keywords still need quotes.
const KEYWORDS = new Set(['order', 'group', 'select', 'from', 'where', 'table', 'index', 'limit', 'values', 'offset', 'user', 'default', 'check', 'primary']);

function quoted(name) {
  return /^[a-z_][a-z0-9_]*$/.test(name) && !KEYWORDS.has(name) ? name : `"${name.replaceAll('"', '""')}"`;
}

// How a query names the table: "actor".table, or yoke.name.
export function tableName(t) {
  return t.schema === 'yoke' ? `yoke.${quoted(t.name)}` : `"${t.schema.replaceAll('"', '""')}".${quoted(t.name)}`;
}

function starter(t) {
  const name = tableName(t);
  if (t.schema === 'yoke' && t.name === 'events') return `SELECT * FROM ${name} WHERE path = '${STREAM}' LIMIT 100`;
  return `SELECT * FROM ${name} LIMIT 100`;
}

function cell(value) {
  if (value === null || value === undefined) return h('td', { class: 'null' }, 'NULL');
  if (typeof value === 'number') return h('td', { class: 'num mono' }, String(value));
  const text = typeof value === 'object' ? JSON.stringify(value) : String(value);
  return h('td', { class: 'mono clip', title: text.length > 60 ? text : undefined }, text);
}

function fileName() {
  const at = new Date().toISOString().replace(/\.\d+Z$/, '').replace(/[-:]/g, '').replace('T', '-');
  return `yoke-sql-${at}.csv`;
}

function save(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');  // never put in the page: only clicked
  a.href = url;
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

export async function render(main, params, { signal }) {
  const errors = errorBox();
  const status = h('span', { class: 'muted', id: 'query-status', role: 'status' });
  const result = h('div', { id: 'query-result' });
  const input = h('textarea', {
    id: 'query', name: 'query', rows: 7, spellcheck: 'false', autocomplete: 'off',
    'aria-describedby': 'query-help',
  }, params.get('q') || EXAMPLE);
  const limit = h('input', {
    id: 'query-max', name: 'max_rows', type: 'number', min: 1, max: 100000, class: 'short',
    value: Number(params.get('max')) || MAX_ROWS,
  });
  const run = h('button', { type: 'submit', id: 'query-run' }, 'Run');
  const form = h('form', { class: 'card form', id: 'query-form' },
    h('label', { for: 'query' }, 'Read-only SQL across every actor instance and Yoke\'s records'),
    input,
    h('div', { class: 'row wrap' },
      h('label', { for: 'query-max' }, 'At most'), limit, h('span', null, 'rows'),
      run, status),
    h('p', { class: 'muted', id: 'query-help' },
      'Ctrl+Enter (⌘+Enter) runs it. Name an actor\'s tables as ', h('code', null, '"actor".table'),
      ', its state as ', h('code', null, '"actor".yoke_state'), ', Yoke\'s records as ', h('code', null, 'yoke.instances'),
      ' and the other yoke tables; ', h('code', null, 'yoke.events'), ' is read one stream at a time (',
      h('code', null, 'WHERE path = …'), '). Writes are refused.'),
    errors);

  let runs = 0;
  async function execute() {
    const query = input.value;
    const maxRows = Math.min(100000, Math.max(1, Math.floor(Number(limit.value)) || MAX_ROWS));
    const mine = ++runs;
    errors.show(null);
    clear(result);
    status.textContent = 'Running…';
    run.disabled = true;
    history.replaceState(null, '', route('sql', { q: query, max: maxRows === MAX_ROWS ? '' : maxRows }));
    const started = performance.now();
    try {
      const body = { query, max_rows: maxRows };
      const answer = await api('POST', '/v1/sql', body, { signal });
      if (mine !== runs) return;
      status.textContent = '';
      showAnswer(result, answer, body, Math.round(performance.now() - started), signal);
    } catch (err) {
      if (err.name === 'AbortError' || mine !== runs) return;
      status.textContent = '';
      errors.show(err);
    } finally {
      if (mine === runs) run.disabled = false;
    }
  }

  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); form.requestSubmit(); }
  });
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    execute();
  });

  const tables = h('aside', { class: 'card', id: 'tables', 'aria-labelledby': 'tables-title' });
  function start(t) {
    input.value = starter(t);
    input.focus();
    const at = input.value.indexOf(STREAM);
    if (t.schema === 'yoke' && t.name === 'events' && at >= 0) {
      input.setSelectionRange(at, at + STREAM.length);  // the stream to read: typed over
      return;
    }
    execute();
  }
  async function listTables() {
    const tablesErrors = errorBox();
    const refresh = h('button', { type: 'button', class: 'small secondary', id: 'tables-refresh' }, 'Refresh');
    refresh.addEventListener('click', () => listTables());
    clear(tables).append(h('div', { class: 'row' }, h('h2', { id: 'tables-title' }, 'Tables'), refresh), tablesErrors);
    let listed;
    try {
      ({ tables: listed } = await get('/v1/sql/tables', { signal }));
    } catch (err) {
      if (err.name === 'AbortError') throw err;
      tablesErrors.show(err);
      return;
    }
    const schemas = new Map();
    for (const t of listed) {
      if (!schemas.has(t.schema)) schemas.set(t.schema, []);
      schemas.get(t.schema).push(t);
    }
    if (![...schemas.keys()].some((s) => s !== 'yoke')) {
      tables.append(empty('No actor tables yet: an actor\'s ctx.sqlite tables and its state show here once an instance has written them.'));
    }
    for (const [schema, group] of schemas) {
      tables.append(
        h('h3', null, schema === 'yoke' ? 'Yoke\'s records' : h('span', null, 'actor ', h('code', null, schema))),
        h('ul', { class: 'table-list', 'data-schema': schema }, group.map((t) => h('li', null,
          h('button', {
            type: 'button', class: 'link mono', 'data-table': tableName(t),
            title: starter(t), onclick: () => start(t),
          }, schema === 'yoke' ? tableName(t) : t.name),
          t.columns.length ? h('span', { class: 'columns' }, t.columns.map((c) => c.name).join(', ')) : null))));
    }
  }

  main.append(
    h('div', { class: 'page-head' }, h('h1', null, 'SQL')),
    h('div', { class: 'sql-layout' }, tables, h('section', { class: 'sql-main' }, form, result)));
  await listTables();
  if (params.get('q')) await execute();
}

// The answer: a summary (rows, time, a note when the server stopped at
// max_rows), one page of rows, the pager, and the CSV export of the query.
function showAnswer(result, answer, body, ms, signal) {
  const total = answer.rows.length;
  const pages = Math.max(1, Math.ceil(total / PAGE));
  let page = 0;
  const exportErrors = errorBox();
  const exported = h('p', { class: 'ok', role: 'status', hidden: true, id: 'query-exported' });
  const exportButton = actionButton('Export CSV', async () => {
    exported.hidden = true;
    const { blob, headers } = await apiBlob('POST', '/v1/sql', body, 'text/csv', { signal });
    const name = fileName();
    save(blob, name);
    exported.textContent = `Downloaded ${name}${headers.get('x-yoke-truncated') === 'true' ? ` (the first ${num(body.max_rows)} rows: more matched)` : ''}.`;
    exported.hidden = false;
  }, exportErrors, { class: 'secondary small', id: 'query-export' });
  const tbody = h('tbody', null);
  const range = h('span', { id: 'query-range', role: 'status' });
  const previous = h('button', { type: 'button', class: 'secondary small', id: 'query-previous' }, 'Previous');
  const next = h('button', { type: 'button', class: 'secondary small', id: 'query-next' }, 'Next');
  function show() {
    const from = page * PAGE;
    const to = Math.min(total, from + PAGE);
    tbody.replaceChildren(...answer.rows.slice(from, to).map((r) => h('tr', null, r.map(cell))));
    range.textContent = total ? `rows ${num(from + 1)}–${num(to)} of ${num(total)}` : 'no rows';
    previous.disabled = page === 0;
    next.disabled = page >= pages - 1;
  }
  previous.addEventListener('click', () => { if (page > 0) { page -= 1; show(); } });
  next.addEventListener('click', () => { if (page < pages - 1) { page += 1; show(); } });
  append(result, [
    h('div', { class: 'row wrap result-head' },
      h('span', { id: 'query-summary' }, h('strong', null, num(total)), ` row${total === 1 ? '' : 's'} · ${num(ms)} ms`),
      exportButton),
    answer.truncated
      ? h('p', { class: 'note', id: 'query-truncated' },
        `Truncated: more rows matched than the ${num(body.max_rows)} asked for. Raise "At most", or narrow the query (WHERE, LIMIT, GROUP BY).`)
      : null,
    exportErrors, exported,
    h('div', { class: 'table-wrap' }, h('table', { id: 'query-rows' },
      h('thead', null, h('tr', null, answer.columns.map((c) => h('th', { scope: 'col' }, c)))), tbody)),
    total ? null : empty('The query matched no rows.'),
    total > PAGE ? h('nav', { class: 'row pager', 'aria-label': 'Result pages', id: 'query-pager' }, previous, range, next)
      : h('p', { class: 'muted' }, range)]);
  show();
}
