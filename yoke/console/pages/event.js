// One event: its JSON, with copy buttons.

import { get, streamUrl } from '../api.js';
import { h, link, json, copyButton, time } from '../dom.js';

export async function render(main, params, { signal }) {
  const path = params.get('path') || '/';
  const offset = Number(params.get('offset'));
  main.append(h('div', { class: 'page-head' },
    h('h1', null, h('span', { class: 'muted' }, 'Event '), `${offset} of `, link(path, 'stream', { path }, { class: 'path' }))));
  const event = await get(streamUrl(path, `events/${offset}`), { signal });
  const text = JSON.stringify(event, null, 2);
  main.append(
    h('p', { class: 'facts-line' }, h('code', null, event.type), time(event.at), h('span', { class: 'mono' }, event.id)),
    h('div', { class: 'row wrap' },
      copyButton(() => text, 'Copy JSON'),
      copyButton(() => JSON.stringify(event.payload, null, 2), 'Copy payload'),
      copyButton(() => event.id, 'Copy id'),
      offset > 1 ? link('Previous', 'event', { path, offset: offset - 1 }, { class: 'button secondary', rel: 'prev' }) : null,
      link('Next', 'event', { path, offset: offset + 1 }, { class: 'button secondary', rel: 'next' }),
      link('Back to the events', 'stream', { path, tab: 'events', after: Math.max(0, offset - 25) }, { class: 'button secondary' })),
    json(event));
}
