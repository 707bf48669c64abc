// Actors: the actor types with instances, and the instances (paged by id).

import { get } from '../api.js';
import { h, link, table, time, empty, num } from '../dom.js';

const PAGE = 100;

export async function render(main, params, { signal }) {
  const actor = params.get('actor') || '';
  const after = params.get('after') || '';
  const deadOnly = params.get('dead') === '1';
  main.append(h('div', { class: 'page-head' }, h('h1', null, 'Actors'),
    h('nav', { class: 'row' },
      link('All instances', 'actors', {}, { class: 'button secondary', 'aria-current': !actor && !deadOnly ? 'page' : undefined }),
      link('With dead letters', 'actors', { dead: 1 }, { class: 'button secondary', 'aria-current': deadOnly ? 'page' : undefined }))));
  if (deadOnly) {
    const overview = await get('/v1/overview', { signal });
    if (!overview.dead_letters.length) {
      main.append(empty('No instance has dead letters.'));
      return;
    }
    main.append(table(['Instance', 'Dead rows'], overview.dead_letters.map((d) => h('tr', null,
      h('td', null, link(d.instance_id, 'instance', { id: d.instance_id, tab: 'dead' })),
      h('td', { class: 'num' }, num(d.dead)))), { id: 'dead-instances' }));
    return;
  }
  const query = { limit: PAGE + 1 };
  if (actor) query.actor = actor;
  if (after) query.after = after;
  const { instances } = await get('/v1/instances?' + new URLSearchParams(query), { signal });
  const more = instances.length > PAGE;
  const shown = instances.slice(0, PAGE);
  if (!actor && !after) {
    const types = [...new Set(shown.map((i) => i.actor))].sort();
    if (types.length) {
      main.append(h('section', { class: 'card' }, h('h2', null, 'Actor types'),
        h('ul', { class: 'chips', id: 'actor-types' }, types.map((t) => h('li', null, link(t, 'actors', { actor: t }))))));
    }
  } else if (actor) {
    main.append(h('p', null, 'Instances of ', h('code', null, actor), ' · ', link('all actors', 'actors')));
  }
  if (!shown.length) {
    main.append(empty(actor ? `No instance of ${actor}.` : 'No actor instances yet. Instances are created by the application (`yoke serve --app module:app`) when a routed event arrives, or with POST /v1/instances.'));
    return;
  }
  main.append(table(['Instance', 'Actor', 'Key', 'Created', 'Worker'], shown.map((i) => h('tr', null,
    h('td', null, link(i.id, 'instance', { id: i.id }, { class: 'mono' })),
    h('td', null, link(i.actor, 'actors', { actor: i.actor })),
    h('td', { class: 'clip' }, i.key ?? '—'),
    h('td', null, time(i.created_at)),
    h('td', { class: 'mono clip' }, i.worker_id ?? '—'))), { id: 'instances' }));
  if (more || after) {
    main.append(h('nav', { class: 'row pager', 'aria-label': 'Pages' },
      after ? link('First page', 'actors', { actor }, { class: 'button secondary' }) : null,
      more ? link('Next page', 'actors', { actor, after: shown[shown.length - 1].id }, { class: 'button secondary', rel: 'next' }) : null));
  }
}
