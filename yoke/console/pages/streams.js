// Streams: the tenant's streams by path, prefix search, paged.

import { get, streamUrl } from '../api.js';
import { h, link, num, table, time, empty, route, copyButton } from '../dom.js';

const PAGE = 50;

export function firstEventCurl(path = '/demo') {
  const port = location.port || (location.protocol === 'https:' ? '443' : '80');
  return `curl -s -X POST ${location.origin}${streamUrl(path, 'events')} -H "Authorization: Bearer $(cat .yoke/token-${port})" -H 'Content-Type: application/json' -d '{"type":"hello","payload":{"n":1}}'`;
}

export async function render(main, params, { signal }) {
  const prefix = params.get('prefix') || '/';
  const after = params.get('after') || '';
  const search = h('input', { id: 'prefix', name: 'prefix', type: 'search', value: prefix, placeholder: '/orders/', 'aria-label': 'Path prefix' });
  const form = h('form', { class: 'row', role: 'search' }, search, h('button', { type: 'submit' }, 'Search'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    let p = search.value.trim() || '/';
    if (!p.startsWith('/')) p = '/' + p;
    location.hash = route('streams', { prefix: p });
  });
  main.append(h('div', { class: 'page-head' }, h('h1', null, 'Streams'), form));
  const query = { prefix, limit: PAGE + 1 };
  if (after) query.after = after;
  const { streams } = await get('/v1/streams?' + new URLSearchParams(query), { signal });
  const more = streams.length > PAGE;
  const shown = streams.slice(0, PAGE);
  if (!shown.length) {
    const curl = firstEventCurl(prefix === '/' ? '/demo' : prefix.replace(/\/$/, '') || '/demo');
    main.append(empty(
      h('p', null, after ? 'No more streams.' : prefix === '/' ? 'No streams yet. A stream is created by its first event: append one.'
        : `No stream starts with ${prefix}.`),
      h('pre', { class: 'cmd' }, curl), copyButton(() => curl, 'Copy the command')));
    return;
  }
  main.append(table(['Path', 'Head', 'Earliest', 'Events kept', 'State', 'Created'], shown.map((s) => h('tr', null,
    h('td', null, link(s.path, 'stream', { path: s.path })),
    h('td', { class: 'num' }, num(s.head)),
    h('td', { class: 'num' }, num(s.earliest)),
    h('td', { class: 'num' }, num(s.usage.durable_events)),
    h('td', null, s.closed ? h('span', { class: 'badge' }, 'closed') : 'open', s.legal_hold ? h('span', { class: 'badge' }, 'legal hold') : null),
    h('td', null, time(s.created_at)))), { id: 'streams' }));
  main.append(h('nav', { class: 'row pager', 'aria-label': 'Pages' },
    after ? link('First page', 'streams', { prefix }, { class: 'button secondary' }) : null,
    more ? link('Next page', 'streams', { prefix, after: shown[shown.length - 1].path }, { class: 'button secondary', rel: 'next' }) : null));
}
