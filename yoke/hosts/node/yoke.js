// The SDK: what an actor's process(ctx, event) gets. Every ctx call is an
// op (a method name and JSON params) that the host sends to the kernel
// (host.js); types in yoke.d.ts, guide in README.md.

import { createHash } from "node:crypto";

// ctx.state.update retries a lost compare-and-set this many times.
const MAX_UPDATE_RETRIES = 1000;

/** An op the kernel refused or failed: `code` is Yoke's stable error code.
 * `instanceof YokeError` holds for an error of any copy of this SDK (the
 * host's, or the npm package a script imports). */
export class YokeError extends Error {
  constructor(message, code, details) {
    super(message);
    this.name = "YokeError";
    this.code = code;
    this.details = details ?? {};
  }

  static [Symbol.hasInstance](value) {
    return value instanceof Error && value.name === "YokeError" && typeof value.code === "string";
  }
}

class State {
  #ops;
  #lock;

  constructor(ops, lock) {
    this.#ops = ops;
    this.#lock = lock;
  }

  async get(fallback = null) {
    const { value } = await this.#ops("state_get", {});
    return value ?? fallback;
  }

  async version() {
    return (await this.#ops("state_get", {})).version;
  }

  /** Overwrite without a version check; returns the new version. */
  async set(value) {
    return (await this.#ops("state_set", { value })).version;
  }

  /** Read, apply fn (to fallback when there is no state yet), compare-and-set;
   * on a concurrent write, read and apply again. Returns the value written. */
  async update(fn, fallback = {}) {
    return this.#lock(async () => {
      for (let i = 0; i < MAX_UPDATE_RETRIES; i++) {
        const { value, version } = await this.#ops("state_get", {});
        const next = await fn(value ?? fallback);
        const { ok } = await this.#ops("state_cas", { expected: version, value: next });
        if (ok) return next;
      }
      throw new Error("ctx.state.update: too much contention");
    });
  }
}

// SQLite values cross the seam as JSON; what JSON (or a JavaScript number)
// cannot carry exactly is tagged (yoke/hosts/wire.py): a BLOB is
// {$blob: base64} (here a Uint8Array), an integer beyond 2**53 - 1
// {$int: "digits"} (here a bigint), an infinite real {$real: "Infinity"} (and
// a whole number beyond 2**53, a double, {$real: "1e+300"}).
const MAX_EXACT = BigInt(Number.MAX_SAFE_INTEGER);

function sqlToWire(value) {
  if (value instanceof Uint8Array) return { $blob: Buffer.from(value.buffer, value.byteOffset, value.byteLength).toString("base64") };
  if (typeof value === "bigint") {
    return value > MAX_EXACT || value < -MAX_EXACT ? { $int: value.toString() } : Number(value);
  }
  if (value === Infinity || value === -Infinity) return { $real: value > 0 ? "Infinity" : "-Infinity" };
  // A whole number beyond 2**53 is a double: JSON would write its digits,
  // read back as an exact (other) integer.
  if (typeof value === "number" && Number.isInteger(value) && !Number.isSafeInteger(value)) {
    return { $real: String(value) };
  }
  return value;
}

function sqlFromWire(value) {
  if (value === null || typeof value !== "object") return value;
  if (typeof value.$blob === "string") {
    const bytes = Buffer.from(value.$blob, "base64");
    return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }
  if (typeof value.$int === "string") return BigInt(value.$int);
  if (typeof value.$real === "string") return Number(value.$real);
  return value;
}

function paramsToWire(params) {
  if (Array.isArray(params)) return params.map(sqlToWire);
  if (params !== null && typeof params === "object") {
    return Object.fromEntries(Object.entries(params).map(([k, v]) => [k, sqlToWire(v)]));
  }
  return params;
}

function rowFromWire(row) {
  return Object.fromEntries(Object.entries(row).map(([k, v]) => [k, sqlFromWire(v)]));
}

class Sqlite {
  #ops;

  constructor(ops) {
    this.#ops = ops;
  }

  /** Run a statement; returns {rowcount, lastrowid}. Params: null, number,
   * bigint, string, Uint8Array (a BLOB). */
  async exec(sql, params = []) {
    return rowFromWire(await this.#ops("sqlite_exec", { sql, params: paramsToWire(params) }));
  }

  /** Rows as objects: a BLOB is a Uint8Array, an integer beyond 2**53 - 1 a bigint. */
  async query(sql, params = []) {
    return (await this.#ops("sqlite_query", { sql, params: paramsToWire(params) })).map(rowFromWire);
  }
}

/** Epoch seconds, as the ops take times: from a Date, or a number of seconds. */
function epochSeconds(at) {
  return at instanceof Date ? at.getTime() / 1000 : at;
}

function defined(params) {
  return Object.fromEntries(Object.entries(params).filter(([, v]) => v !== undefined));
}

class Schedules {
  #ops;

  constructor(ops) {
    this.#ops = ops;
  }

  /** Create or replace the schedule `name`: at a time (a Date or epoch
   * seconds), after `after_s` seconds, or on a cron expression (UTC). When
   * due, its event is enqueued to this instance, or appended to `stream`. */
  upsert(name, { event, at, after_s, cron, stream } = {}) {
    return this.#ops("schedules_upsert", defined({ name, event, at: epochSeconds(at), after_s, cron, stream }));
  }

  async cancel(name) {
    return (await this.#ops("schedules_cancel", { name })).cancelled;
  }

  list() {
    return this.#ops("schedules_list", {});
  }
}

class ChildInstances {
  #ops;

  constructor(ops) {
    this.#ops = ops;
  }

  /** Create (or find) an instance; its parent is the calling instance. */
  create(actor, { key, config, filter } = {}) {
    return this.#ops("instances_create", defined({ actor, key, config, filter }));
  }
}

class Portals {
  #ops;

  constructor(ops) {
    this.#ops = ops;
  }

  /** Call `method` of the application's portal `portal` with JSON params. */
  call(portal, method, params = null, { timeout_s } = {}) {
    return this.#ops("portal_call", defined({ portal, method, params, timeout_s }));
  }
}

class Conversations {
  #ops;

  constructor(ops) {
    this.#ops = ops;
  }

  /** Store the message and append conversation.message.posted (ids only)
   * to the global stream, in one transaction. */
  postMessage(conversation_id, role, content, metadata = null) {
    return this.#ops("conversations_post", { conversation_id, role, content, metadata });
  }

  /** Messages after `after` (a message's seq), oldest first. */
  messages(conversation_id, { after, limit } = {}) {
    return this.#ops("conversations_messages", defined({ conversation_id, after, limit }));
  }
}

/** What every context has: the tenant, the runtime's clock, appends and
 * the ops that need no instance. `ops(method, params)` sends an op of the
 * run. */
class BaseContext {
  #ops;
  #clock;

  constructor(ops, { tenant, clock }) {
    this.#ops = ops;
    // The runtime's clock at the run's start; it runs on with this
    // process's unless it stands still (a test's virtual clock).
    const reading = clock ?? { now: Date.now() / 1000, runs: true };
    this.#clock = { at: reading.now * 1000, since: reading.runs ? performance.now() : null };
    this.tenant = tenant;
    this.instances = new ChildInstances(ops);
    this.portals = new Portals(ops);
    this.conversations = new Conversations(ops);
  }

  /** The current time by the runtime's clock: what schedules, retries and
   * event times follow, and what a test's virtual clock moves (Date.now()
   * stays the machine's). */
  now() {
    const { at, since } = this.#clock;
    return new Date(since === null ? at : at + performance.now() - since);
  }

  /** Append to one of the tenant's streams (default: the global stream "/");
   * resolves to {offset, id} once durable. */
  append(event, stream = "/") {
    return this.#ops("stream_append", { event, stream });
  }

  /** Any op by name (docs/advanced/hosts.md lists them): schedules_upsert,
   * instances_create, portal_call, conversations_post... */
  call(method, params = {}) {
    return this.#ops(method, params);
  }
}

/** Numbers in [0, 1) from a 64-bit seed (SplitMix64): the same seed, the same numbers. */
function splitmix64(seed) {
  let state = BigInt.asUintN(64, BigInt(Math.floor(Number(seed))));
  return () => {
    state = BigInt.asUintN(64, state + 0x9E3779B97F4A7C15n);
    let z = state;
    z = BigInt.asUintN(64, (z ^ (z >> 30n)) * 0xBF58476D1CE4E5B9n);
    z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94D049BB133111EBn);
    z ^= z >> 31n;
    return Number(z >> 11n) / 2 ** 53;
  };
}

/** The context of one process() call; `lock(fn)` runs fn alone among this
 * instance's state updates in this host. */
export class Context extends BaseContext {
  #seed;
  #draw = null;

  constructor(ops, lock, { tenant, instance, event, attempt, queueRow, clock, trace, seed }) {
    super(ops, { tenant, clock });
    // The run's seed (the kernel keeps it with the run's input): a fork of
    // the instance replays the same draws (docs/advanced/forks.md).
    this.#seed = seed ?? Math.floor(Math.random() * 2 ** 53);
    this.instance = instance;
    this.event = event;
    this.attempt = attempt;
    // The attempt's W3C trace context ({traceparent, tracestate?}) when
    // tracing is on, else null.
    this.trace = trace ?? null;
    this.queueRow = queueRow ?? null; // null: no queue row, no idempotency key
    this.state = new State(ops, lock);
    this.sqlite = new Sqlite(ops);
    this.schedules = new Schedules(ops);
    Object.freeze(this);
  }

  /** A number in [0, 1) drawn from the run's seed: what Math.random()
   * would be, but a fork of the instance replays the same draws. */
  random() {
    if (this.#draw === null) this.#draw = splitmix64(this.#seed);
    return this.#draw();
  }

  /** A key for a call to the outside world: the same on every retry and
   * redrive of this event's queue row (docs/advanced/effects.md); Python's
   * ctx.idempotency_key(name) gives the same key. */
  idempotencyKey(name = "") {
    if (this.queueRow === null) {
      throw new YokeError(
        "ctx.idempotencyKey needs the run's queue row, and this context has none", "invalid_input",
        { field: "queue_row" });
    }
    const text = [this.tenant, this.instance.instance_id, String(this.queueRow), name].join("\x1f");
    return "yk_" + createHash("sha256").update(text, "utf8").digest("hex").slice(0, 32);
  }
}

/** The context of a portal's handle(ctx, request), method(ctx, params) or
 * start(ctx): an actor's, less its instance (state, SQLite, schedules). */
export class PortalContext extends BaseContext {
  constructor(ops, { tenant, portal, clock }) {
    super(ops, { tenant, clock });
    this.portal = portal;
    Object.freeze(this);
  }
}

/** An HTTP request to a portal: `path` below /v1/portals/<name>, the body
 * as bytes, text() or json(). */
export class PortalRequest {
  constructor({ method, path, query, headers, body }) {
    this.method = method;
    this.path = path;
    this.query = query ?? {};
    this.headers = headers ?? {};
    const bytes = Buffer.from(body ?? "", "base64");
    this.body = new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    Object.freeze(this);
  }

  text() {
    return new TextDecoder().decode(this.body);
  }

  /** The body as JSON; a YokeError (invalid_input, a 400) when it is not. */
  json() {
    try {
      return JSON.parse(this.text());
    } catch {
      throw new YokeError("the request body is not JSON", "invalid_input");
    }
  }
}

/** A whole application in TypeScript or JavaScript: its actors (each with
 * its filter, policy and process function), portals and subscriptions. The
 * module's default export; `yoke serve --app dist/app.js` serves it
 * (yoke/applications.py reads what it declares). */
export function defineApp(definition) {
  if (definition === null || typeof definition !== "object" || typeof definition.actors !== "object") {
    throw new TypeError("defineApp takes { actors: { name: { filter, process, ... } }, subscriptions? }");
  }
  return definition;
}
