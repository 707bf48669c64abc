// The console's entry: sign-in, the header, and the router (#/page?params).

import { api, ApiError, useSession } from './api.js';
import { h, clear, errorBox } from './dom.js';
import * as overview from './pages/overview.js';
import * as streams from './pages/streams.js';
import * as stream from './pages/stream.js';
import * as event from './pages/event.js';
import * as actors from './pages/actors.js';
import * as instance from './pages/instance.js';
import * as fork from './pages/fork.js';
import * as subscriptions from './pages/subscriptions.js';
import * as subscription from './pages/subscription.js';
import * as tokens from './pages/tokens.js';
import * as failures from './pages/failures.js';
import * as failure from './pages/failure.js';
import * as sql from './pages/sql.js';

const PAGES = {
  '': overview, streams, stream, event, actors, instance, fork, subscriptions, subscription, failures, failure, sql, tokens,
};
const main = document.getElementById('main');
let cleanup = null;
let generation = 0;
let session = null;

function parse() {
  const hash = location.hash.replace(/^#\/?/, '');
  const [page, query] = hash.split('?');
  return { page: page || '', params: new URLSearchParams(query || '') };
}

async function show() {
  if (cleanup) {
    try { cleanup(); } catch { /* a page's own teardown */ }
    cleanup = null;
  }
  if (!session) return;
  delete document.body.dataset.ready;
  const { page, params } = parse();
  const module = PAGES[page];
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.dataset.page === page || (page === 'stream' && a.dataset.page === 'streams')
        || (page === 'event' && a.dataset.page === 'streams')
        || ((page === 'instance' || page === 'fork') && a.dataset.page === 'actors')
        || (page === 'subscription' && a.dataset.page === 'subscriptions')
        || (page === 'failure' && a.dataset.page === 'failures')) {
      a.setAttribute('aria-current', 'page');
    } else {
      a.removeAttribute('aria-current');
    }
  }
  // Each page renders into a view of its own: a page still loading when the
  // next one is asked for fills a view no longer shown, then is torn down.
  const mine = ++generation;
  const view = h('div', { class: 'view' });
  clear(main).append(view);
  if (!module) {
    view.append(h('h1', null, 'Not found'), h('p', null, 'No such page. ', h('a', { href: '#/' }, 'Go to the overview.')));
    document.body.dataset.ready = 'not-found';
    return;
  }
  const controller = new AbortController();
  let own = null;
  cleanup = () => {
    controller.abort();
    if (typeof own === 'function') own();
  };
  try {
    own = await module.render(view, params, { signal: controller.signal });
  } catch (err) {
    if (err.name !== 'AbortError') {
      const box = errorBox();
      box.show(err instanceof ApiError ? err : { code: 'error', message: String(err) });
      view.append(box);
    }
  }
  if (mine !== generation) {
    if (typeof own === 'function') own();
    return;
  }
  document.body.dataset.ready = page || 'overview';  // rendered (what tests wait for)
}

function signedIn(current) {
  session = current;
  useSession(current, signedOut);
  document.getElementById('nav').hidden = false;
  const who = clear(document.getElementById('who'));
  const writes = current.scopes.includes('admin') ? 'admin' : current.scopes.join(', ');
  if (current.dev) {
    // yoke serve --dev: requests go without a token, as the API's do; nothing to sign out of.
    who.append(h('span', { class: 'muted', title: 'yoke serve --dev: authentication is off' },
      `${current.tenant} · ${writes} · dev mode`));
  } else {
    who.append(
      h('span', { class: 'muted', title: `token ${current.token_id}` }, `${current.tenant} · ${writes}`),
      h('button', { type: 'button', class: 'small secondary', onclick: signOut }, 'Sign out'),
    );
  }
  overview.startSampling();
  show();
}

function signedOut() {
  if (!session) return;
  session = null;
  useSession(null);
  overview.stopSampling();
  signInPage('Your session ended (signed out, or its token was revoked). Sign in again.');
}

async function signOut() {
  try {
    await api('DELETE', '/ui/session');
  } catch { /* signed out either way */ }
  session = null;
  useSession(null);
  overview.stopSampling();
  location.hash = '#/';
  signInPage();
}

function signInPage(note) {
  if (cleanup) { cleanup(); cleanup = null; }
  generation += 1;  // a page still loading is not shown
  document.getElementById('nav').hidden = true;
  clear(document.getElementById('who'));
  clear(main);
  const errors = errorBox();
  const input = h('input', {
    id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true,
    placeholder: 'yk_tok_…', 'aria-describedby': 'token-help',
  });
  const form = h('form', { class: 'card narrow', id: 'sign-in' },
    h('h1', null, 'Sign in'),
    note ? h('p', { class: 'note' }, note) : null,
    h('p', { id: 'token-help' },
      'Open the console link `yoke serve` printed (it signs you in once), or paste an API token. ',
      'The admin token of a local server is in ', h('code', null, '.yoke/token-PORT'), '.'),
    h('label', { for: 'token' }, 'API token'),
    input,
    errors,
    h('div', { class: 'row end' }, h('button', { type: 'submit' }, 'Sign in')),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    errors.show(null);
    try {
      signedIn(await api('POST', '/ui/session', { token: input.value.trim() }, { quiet: true }));
    } catch (err) {
      errors.show(err);
    }
  });
  main.append(form);
  input.focus();
  document.body.dataset.ready = 'sign-in';
}

// A sign-in link: #code=... (a fragment: it never reaches a server log).
async function redeem() {
  const code = location.hash.slice('#code='.length);
  history.replaceState(null, '', location.pathname + '#/');  // the code is spent either way
  try {
    signedIn(await api('POST', '/ui/session', { code }, { quiet: true }));
  } catch (err) {
    signInPage(`That sign-in link did not work (${err.message}).`);
  }
}

async function start() {
  window.addEventListener('hashchange', () => {
    if (location.hash.startsWith('#code=')) redeem();
    else if (session) show();
  });
  if (location.hash.startsWith('#code=')) {
    await redeem();
    return;
  }
  let current = null;
  try {
    current = await api('GET', '/ui/session', undefined, { quiet: true });
  } catch { /* shown as the sign-in page */ }
  if (current && current.signed_in) signedIn(current);
  else signInPage();
}

start();
