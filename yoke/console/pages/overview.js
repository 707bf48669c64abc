// Overview: the tenant's live figures as small charts over the last minutes,
// sampled every 2 s from GET /v1/overview while signed in; every figure
// links to the page that explains it.

import { get } from '../api.js';
import { h, svg, link, num, table, errorBox, empty, route } from '../dom.js';

const EVERY_MS = 2000;
const KEEP = 150; // 5 minutes of samples
const samples = [];
let timer = null;
let listeners = new Set();
let lastError = null;

async function sample() {
  try {
    const o = await get('/v1/overview');
    const previous = samples[samples.length - 1];
    const rate = previous ? Math.max(0, (o.offsets - previous.o.offsets) * 1000 / Math.max(1, o.at - previous.o.at)) : 0;
    samples.push({ o, rate });
    if (samples.length > KEEP) samples.shift();
    lastError = null;
  } catch (err) {
    if (err.name === 'AbortError') return;
    lastError = err;
  }
  for (const listener of listeners) listener();
}

export function startSampling() {
  if (timer) return;
  sample();
  timer = setInterval(sample, EVERY_MS);
}

export function stopSampling() {
  clearInterval(timer);
  timer = null;
  samples.length = 0;
}

function sparkline(values, label) {
  const w = 160;
  const hgt = 36;
  const max = Math.max(1, ...values);
  const step = values.length > 1 ? w / (KEEP - 1) : 0;
  const start = w - step * (values.length - 1);
  const points = values.map((v, i) => `${(start + i * step).toFixed(1)},${(hgt - 2 - (v / max) * (hgt - 4)).toFixed(1)}`);
  return svg('svg', { class: 'spark', viewBox: `0 0 ${w} ${hgt}`, role: 'img', 'aria-label': label, preserveAspectRatio: 'none' },
    svg('title', null, label),
    points.length > 1 ? svg('polyline', { points: points.join(' '), fill: 'none', 'stroke-width': 2 }) : null);
}

const FIGURES = [
  { key: 'rate', label: 'Appends per second', value: (s) => s.rate, show: (v) => v.toFixed(1), to: ['streams'] },
  { key: 'tails', label: 'Open tails', value: (s) => s.o.open_tails, to: ['streams'] },
  { key: 'queue', label: 'Queue depth', value: (s) => s.o.queue.pending + s.o.queue.processing, to: ['actors'] },
  { key: 'dead', label: 'Dead letters', value: (s) => s.o.queue.dead, to: ['actors', { dead: 1 }], bad: true },
  { key: 'halted', label: 'Halted subscriptions', value: (s) => s.o.subscriptions.halted, to: ['subscriptions'], bad: true },
  { key: 'fanout', label: 'Fan-out lag', value: (s) => s.o.fanout.lag, to: ['overview-fanout'] },
  { key: 'sublag', label: 'Subscription lag', value: (s) => s.o.subscriptions.lag, to: ['subscriptions'] },
];

export async function render(main) {
  const errors = errorBox();
  const cards = h('div', { class: 'cards' });
  const details = h('div', { class: 'grid2' });
  main.append(
    h('div', { class: 'page-head' }, h('h1', null, 'Overview'),
      h('span', { class: 'muted' }, 'live, every 2 s, last 5 minutes')),
    errors, cards, details);

  function draw() {
    errors.show(lastError);
    const last = samples[samples.length - 1];
    if (!last) return;
    cards.replaceChildren(...FIGURES.map((f) => {
      const values = samples.map(f.value);
      const value = f.value(last);
      const shown = f.show ? f.show(value) : num(value);
      const [page, params] = f.to;
      const href = page === 'overview-fanout' ? '#fanout' : route(page, params);
      return h('a', { class: `card figure${f.bad && value > 0 ? ' bad' : ''}`, href: page === 'overview-fanout' ? '#/' : href, 'data-figure': f.key,
        onclick: page === 'overview-fanout' ? (e) => { e.preventDefault(); document.getElementById('fanout')?.scrollIntoView(); } : undefined },
      h('span', { class: 'figure-label' }, f.label),
      h('span', { class: 'figure-value' }, shown),
      sparkline(values, `${f.label} over the last minutes`));
    }));
    const o = last.o;
    details.replaceChildren(
      h('section', { class: 'card' },
        h('h2', null, 'Subscriptions that need a look'),
        o.subscriptions.attention.length
          ? table(['Stream', 'Subscription', 'State', 'Lag', 'Last error'], o.subscriptions.attention.map((s) => h('tr', null,
            h('td', null, link(s.path, 'stream', { path: s.path })),
            h('td', null, link(s.name, 'subscription', { path: s.path, name: s.name })),
            h('td', null, h('span', { class: s.halted ? 'badge bad' : 'badge' }, s.halted ? 'halted' : 'lagging')),
            h('td', { class: 'num' }, num(s.lag)),
            h('td', { class: 'clip' }, s.last_error || '—'))))
          : empty(`All ${num(o.subscriptions.count)} subscriptions are running and caught up.`)),
      h('section', { class: 'card' },
        h('h2', null, 'Dead letters by instance'),
        o.dead_letters.length
          ? table(['Instance', 'Dead rows'], o.dead_letters.map((d) => h('tr', null,
            h('td', null, link(d.instance_id, 'instance', { id: d.instance_id, tab: 'dead' })),
            h('td', { class: 'num' }, num(d.dead)))))
          : empty('No dead letters.')),
      h('section', { class: 'card', id: 'fanout' },
        h('h2', null, 'Fan-out lag'),
        h('p', { class: 'muted' }, 'Events not yet routed to actor instances (it grows while no process runs the actors).'),
        o.fanout.streams.length
          ? table(['Stream', 'Head', 'Routed through', 'Lag'], o.fanout.streams.map((f) => h('tr', null,
            h('td', null, link(f.path, 'stream', { path: f.path })),
            h('td', { class: 'num' }, num(f.head)), h('td', { class: 'num' }, num(f.through)),
            h('td', { class: 'num' }, num(f.lag)))))
          : empty('Fan-out is caught up.')),
      h('section', { class: 'card' },
        h('h2', null, 'Totals'),
        h('dl', { class: 'facts' },
          h('dt', null, 'Streams'), h('dd', null, link(num(o.streams), 'streams')),
          h('dt', null, 'Offsets assigned'), h('dd', null, num(o.offsets)),
          h('dt', null, 'Queue'), h('dd', null, link(`${num(o.queue.pending)} pending · ${num(o.queue.processing)} processing · ${num(o.queue.dead)} dead`, 'actors')),
          h('dt', null, 'Subscriptions'), h('dd', null, link(num(o.subscriptions.count), 'subscriptions')))),
    );
  }
  listeners.add(draw);
  draw();
  return () => listeners.delete(draw);
}
