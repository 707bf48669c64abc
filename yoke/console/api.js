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

export async function api(method, url, body, options = {}) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (method !== 'GET' && session && session.csrf) headers['X-Yoke-CSRF'] = session.csrf;
  let response;
  try {
    response = await fetch(url, {
      method, headers, credentials: 'same-origin', signal: options.signal,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    throw new ApiError(0, 'unreachable', `the server did not answer (${err.message})`);
  }
  if (response.status === 204) return null;
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = (data && data.error) || {};
    if (response.status === 401 && !options.quiet) onSignedOut();
    throw new ApiError(response.status, error.code || `http_${response.status}`,
      error.message || response.statusText, error);
  }
  return data;
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
