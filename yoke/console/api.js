// The console is a client of /v1 like any other. The session cookie goes
// with every request (same origin); writes add the session's CSRF token.

let session = null;
let onSignedOut = () => {};

export function useSession(current, signedOut) {
  session = current;
  if (signedOut) onSignedOut = signedOut;
}

export function currentSession() {
  return session;
}

export function can(scope) {
  return !!session && (session.scopes.includes(scope) || session.scopes.includes('admin'));
}

export class ApiError extends Error {
  constructor(status, code, message, detail) {
    super(message);
    this.status = status;
    this.code = code;
    this.detail = detail || {};
  }
}

async function send(method, url, body, options, accept) {
  const headers = { Accept: accept };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (method !== 'GET' && session && session.csrf) headers['X-Yoke-CSRF'] = session.csrf;
  try {
    return await fetch(url, {
      method, headers, credentials: 'same-origin', signal: options.signal,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    throw new ApiError(0, 'unreachable', `the server did not answer (${err.message})`);
  }
}

function parsed(text) {
  try {
    return text ? JSON.parse(text) : null;
  } catch {
    return null;
  }
}

function refusal(response, data, options) {
  const error = (data && data.error) || {};
  if (response.status === 401 && !options.quiet) onSignedOut();
  return new ApiError(response.status, error.code || `http_${response.status}`,
    error.message || response.statusText, error);
}

export async function api(method, url, body, options = {}) {
  const response = await send(method, url, body, options, 'application/json');
  if (response.status === 204) return null;
  const data = parsed(await response.text());
  if (!response.ok) throw refusal(response, data, options);
  return data;
}

// An answer that is not JSON (CSV, say), as a Blob with the response's
// headers; a refusal is still JSON, thrown as an ApiError.
export async function apiBlob(method, url, body, accept, options = {}) {
  const response = await send(method, url, body, options, accept);
  if (!response.ok) throw refusal(response, parsed(await response.text()), options);
  return { blob: await response.blob(), headers: response.headers };
}

export const get = (url, options) => api('GET', url, undefined, options);

function encoded(path) {
  return path === '/' ? '' : path.split('/').map(encodeURIComponent).join('/');
}

// /v1/streams{path}/-/{action}; the info of '/' is /v1/streams/.
export function streamUrl(path, action, query) {
  let url = action ? `/v1/streams${encoded(path)}/-/${action}` : `/v1/streams${encoded(path) || '/'}`;
  if (query) url += '?' + new URLSearchParams(query).toString();
  return url;
}

export function instanceUrl(id, action, query) {
  let url = `/v1/instances/${encodeURIComponent(id)}${action ? '/' + action : ''}`;
  if (query) url += '?' + new URLSearchParams(query).toString();
  return url;
}

export function forkUrl(id, action, query) {
  let url = `/v1/forks/${encodeURIComponent(id)}${action ? '/' + action : ''}`;
  if (query) url += '?' + new URLSearchParams(query).toString();
  return url;
}
