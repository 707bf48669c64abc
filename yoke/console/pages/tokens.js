// Tokens: list, create (the secret shown once), revoke.

import { api, get, can } from '../api.js';
import { h, table, time, empty, errorBox, confirmDialog, actionButton, copyButton } from '../dom.js';

export async function render(main, params, { signal }) {
  main.append(h('div', { class: 'page-head' }, h('h1', null, 'Tokens')));
  if (!can('admin')) {
    main.append(empty('Listing, creating and revoking tokens needs a token with the admin scope.'));
    return;
  }
  const errors = errorBox();
  const created = h('div', { id: 'new-token', role: 'status' });
  const name = h('input', { id: 'token-name', name: 'name', placeholder: 'billing service', maxlength: 200 });
  const scopes = ['read', 'append', 'admin'].map((s) => h('label', { class: 'check' },
    h('input', { type: 'checkbox', name: 'scopes', value: s, checked: s === 'read' }), ` ${s}`));
  const form = h('form', { class: 'card form', id: 'create-token' }, h('h2', null, 'Create a token'),
    h('label', { for: 'token-name' }, 'Name'), name,
    h('fieldset', null, h('legend', null, 'Scopes (admin includes read and append)'), scopes),
    h('div', { class: 'row end' }, h('button', { type: 'submit' }, 'Create')));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    errors.show(null);
    const chosen = [...form.querySelectorAll('input[name=scopes]:checked')].map((c) => c.value);
    try {
      const token = await api('POST', '/v1/tokens', { name: name.value.trim(), scopes: chosen });
      created.replaceChildren(h('div', { class: 'card secret' },
        h('p', null, h('strong', null, 'Copy the secret now: '), 'it is not shown again.'),
        h('pre', { class: 'cmd', id: 'token-secret' }, token.token),
        copyButton(() => token.token, 'Copy the secret')));
      await list();
    } catch (err) {
      errors.show(err);
    }
  });
  const listing = h('div');
  main.append(form, errors, created, listing);

  async function list() {
    const { tokens } = await get('/v1/tokens', { signal });
    const rows = tokens.filter((t) => !t.revoked).map((t) => h('tr', { 'data-token': t.token_id },
      h('td', { class: 'mono' }, t.token_id),
      h('td', null, t.name || '—'),
      h('td', null, t.scopes.join(', ')),
      h('td', null, time(t.created_at)),
      h('td', null, actionButton('Revoke', async () => {
        if (!await confirmDialog(`Revoke the token ${t.name || t.token_id}? Everything using it is refused from then on.`, 'Revoke')) return;
        await api('DELETE', `/v1/tokens/${encodeURIComponent(t.token_id)}`);
        await list();
      }, errors, { class: 'small danger', 'data-action': 'revoke' }))));
    const revoked = tokens.filter((t) => t.revoked).length;
    listing.replaceChildren(h('h2', null, 'Active tokens'),
      rows.length ? table(['Id', 'Name', 'Scopes', 'Created', ''], rows, { id: 'tokens' }) : empty('No active tokens.'),
      revoked ? h('p', { class: 'muted' }, `${revoked} revoked token${revoked === 1 ? '' : 's'} not shown.`) : null);
  }
  await list();
}
