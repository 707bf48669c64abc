// A client of Yoke's HTTP API (/v1) for Node 20 and browsers (fetch and
// web streams, no dependencies): append (single, batch, idempotency keys),
// read with paging, tail with SSE and resume, instances, subscriptions,
// failures, and waiting for the actors to be idle. Types in client.d.ts;
// the routes it uses (ROUTES) are checked against Yoke's OpenAPI document
// by tests/actors/test_node_client.py.

/** The routes this client calls: [method, OpenAPI path]. */
export const ROUTES = [
  ["post", "/v1/streams{path}/-/events"],
  ["get", "/v1/streams{path}/-/events"],
  ["get", "/v1/streams{path}/-/tail"],
  ["get", "/v1/streams{path}/-/subscriptions"],
  ["get", "/v1/instances"],
  ["get", "/v1/instances/{instance_id}"],
  ["get", "/v1/failures"],
  ["get", "/v1/failures/{failure_id}"],
  ["get", "/v1/idle"],
];

/** An error answer: `code` is Yoke's stable error code, `status` the HTTP
 * status. `instanceof YokeError` (the SDK's) holds for it too. */
export class YokeHttpError extends Error {
  constructor(status, body) {
    super(body?.error?.message ?? `HTTP ${status}`);
    this.name = "YokeError";
    this.status = status;
    this.code = body?.error?.code ?? `http_${status}`;
    this.details = body?.error?.details ?? {};
  }
}

function streamUrl(path, tail) {
  if (typeof path !== "string" || !path.startsWith("/")) throw new TypeError("a stream path starts with '/'");
  return "/v1/streams" + path.split("/").map(encodeURIComponent).join("/") + "/-/" + tail;
}

function queryOf(params) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params ?? {})) {
    if (value === undefined || value === null) continue;
    for (const each of Array.isArray(value) ? value : [value]) query.append(name, String(each));
  }
  const text = query.toString();
  return text ? "?" + text : "";
}

export class YokeClient {
  #url;
  #headers;
  #fetch;
  #tenant;

  /** `url`: the server (http://127.0.0.1:8080); `token`: a bearer token
   * (none under `yoke serve --dev`); `tenant`: with an admin token, the
   * tenant to act in. */
  constructor({ url, token, tenant, fetch: fetchFn } = {}) {
    if (typeof url !== "string") throw new TypeError("new YokeClient({ url }) needs the server's URL");
    this.#url = url.replace(/\/+$/, "");
    this.#headers = token ? { authorization: `Bearer ${token}` } : {};
    this.#fetch = fetchFn ?? globalThis.fetch.bind(globalThis);
    this.#tenant = tenant;
    this.instances = {
      list: (options = {}) => this.#get("/v1/instances", options).then((r) => r.instances),
      find: async (actor, key) => (await this.#get("/v1/instances", { actor, key })).instances[0] ?? null,
      get: (instanceId) => this.#get(`/v1/instances/${encodeURIComponent(instanceId)}`),
    };
    this.subscriptions = {
      list: (stream) => this.#get(streamUrl(stream, "subscriptions")).then((r) => r.subscriptions),
    };
    this.failures = {
      list: (filter = {}) => this.#get("/v1/failures", filter).then((r) => r.failures),
      get: (failureId) => this.#get(`/v1/failures/${encodeURIComponent(failureId)}`),
    };
  }

  async #request(method, path, { query, body, headers } = {}) {
    const response = await this.#fetch(this.#url + path + queryOf({ ...query, tenant: this.#tenant }), {
      method,
      headers: { ...this.#headers, ...(body === undefined ? {} : { "content-type": "application/json" }), ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await response.text();
    const parsed = text ? JSON.parse(text) : null;
    if (!response.ok) throw new YokeHttpError(response.status, parsed);
    return parsed;
  }

  #get(path, query) {
    return this.#request("GET", path, { query });
  }

  /** Append one event; resolves to {offset, id} once durable. The same
   * `idempotencyKey` again appends nothing and answers the original. */
  append(stream, event, { idempotencyKey } = {}) {
    return this.#request("POST", streamUrl(stream, "events"), {
      body: event, headers: idempotencyKey ? { "idempotency-key": idempotencyKey } : {},
    });
  }

  /** Append a batch, all or nothing; resolves to one {offset, id} per event. */
  async appendBatch(stream, events, { idempotencyKey } = {}) {
    const answer = await this.#request("POST", streamUrl(stream, "events"), {
      body: events, headers: idempotencyKey ? { "idempotency-key": idempotencyKey } : {},
    });
    return answer.results;
  }

  /** One page: events after `after` (ascending), and `next_after`. */
  read(stream, { after = 0, limit = 1000 } = {}) {
    return this.#get(streamUrl(stream, "events"), { after, limit });
  }

  /** Every event after `after`, page by page. */
  async *readAll(stream, { after = 0, limit = 1000 } = {}) {
    for (;;) {
      const page = await this.read(stream, { after, limit });
      yield* page.events;
      if (page.events.length === 0) return;
      after = page.events[page.events.length - 1].offset;
    }
  }

  /** Events after `after` as they are appended (SSE), resuming after the
   * last one seen when the connection drops, until `signal` aborts or the
   * stream is closed or deleted. `types`: only these event types. */
  async *tail(stream, { after = 0, types, signal } = {}) {
    let last = after;
    for (;;) {
      try {
        for await (const message of this.#events(streamUrl(stream, "tail") + queryOf({ after: last, types, tenant: this.#tenant }),
          { "last-event-id": String(last) }, signal)) {
          if (message.event === "message") {
            const event = JSON.parse(message.data);
            last = event.offset;
            yield event;
          } else if (message.event === "closed" || message.event === "deleted") {
            return;
          } else if (message.event === "error") {
            const body = JSON.parse(message.data);
            throw new YokeHttpError(200, body);
          }
        }
      } catch (err) {
        if (signal?.aborted || err instanceof YokeHttpError) throw err;
        await new Promise((resolve) => setTimeout(resolve, 250)); // dropped: resume after `last`
      }
    }
  }

  async *#events(path, headers, signal) {
    const response = await this.#fetch(this.#url + path, {
      headers: { ...this.#headers, accept: "text/event-stream", ...headers }, signal,
    });
    if (!response.ok) throw new YokeHttpError(response.status, await response.json().catch(() => null));
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let message = { event: "message", data: [] };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, end).replace(/\r$/, "");
        buffer = buffer.slice(end + 1);
        if (line === "") {
          if (message.data.length) yield { event: message.event, data: message.data.join("\n") };
          message = { event: "message", data: [] };
        } else if (!line.startsWith(":")) {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "data") message.data.push(text);
          else if (field === "event") message.event = text;
        }
      }
    }
  }

  /** Until fan-out has caught up and no actor's queue row is pending or
   * running (admin scope; `yoke serve --dev` needs none): {idle, busy}. */
  waitIdle({ timeout_s = 10 } = {}) {
    return this.#get("/v1/idle", { timeout_s });
  }
}
