// Types of the Node host's SDK (yoke.js): what process(ctx, event) gets.
// A TypeScript actor imports them from the npm package this folder is
// (`yoke-sdk`, built with `npm pack`; README.md), or with `import type`
// from this folder:
//
//   import type { Context, YokeEvent } from "yoke-sdk";
//   export async function process(ctx: Context, event: YokeEvent<Order>): Promise<void> { ... }
//
// Field names are Python's and the HTTP API's (snake_case). The op names
// and their params (`Ops`) are checked against the kernel's op list by
// tests/actors/test_node_types.py, so they cannot drift.

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** An event as process() receives it; `P` is its payload's type. */
export interface YokeEvent<P = Json> {
  offset: number;
  id: string;
  at: number; // milliseconds since the epoch
  type: string;
  payload: P;
  metadata: Record<string, Json>;
  source: Json;
  correlation: string | null;
  priority: number;
  group_id: string | null;
  idempotency_key: string | null;
  tenant: string;
  /** null for an event sent straight to the instance (a schedule's). */
  path: string | null;
  ephemeral: boolean;
}

/** An event to append: type, and optionally the rest. */
export interface NewEvent<P = unknown> {
  type: string;
  payload?: P;
  metadata?: Record<string, unknown>;
  /** Defaults to {actor, instance}: who appended it. */
  source?: unknown;
  correlation?: string | null;
  priority?: number;
  group_id?: string | null;
  idempotency_key?: string | null;
  ephemeral?: boolean;
}

export interface Instance {
  instance_id: string;
  tenant: string;
  actor: string;
  key: string | null;
  config: Record<string, Json>;
  filter: Json;
  parent_id: string | null;
  worker_id: string | null;
  created_at: number;
}

/** An instance as ctx.instances.create answers it. */
export interface CreatedInstance extends Omit<Instance, "worker_id"> {
  /** The same as instance_id (what this answer first said). */
  id: string;
}

/** A filter, as Python's Filter: event types (glob patterns), streams, a
 * JSONata `where` and a JSONata `key`. */
export interface Filter {
  types: string[];
  streams?: string[];
  where?: string;
  key?: string;
}

/** The instance's JSON state document, with a version. `T` is yours: any
 * type that survives JSON (interfaces welcome). */
export interface State {
  get<T = Json>(fallback?: T): Promise<T>;
  version(): Promise<number>;
  /** Overwrite without a version check; resolves to the new version. */
  set<T>(value: T): Promise<number>;
  /** Read, apply fn, compare-and-set; on a concurrent write, again.
   * Resolves to the value written. */
  update<T = Json>(fn: (state: T) => T | Promise<T>, fallback?: T): Promise<T>;
}

/** A SQLite value: a BLOB is a Uint8Array; an INTEGER beyond 2**53 - 1 is a
 * bigint (a bigint param within that range is sent as a number). */
export type SqlValue = null | number | bigint | string | boolean | Uint8Array;
export type SqlParams = SqlValue[] | Record<string, SqlValue>;

/** User tables in the instance's own SQLite database (run by the kernel). */
export interface Sqlite {
  exec(sql: string, params?: SqlParams): Promise<{ rowcount: number; lastrowid: number | bigint | null }>;
  query<Row = Record<string, SqlValue>>(sql: string, params?: SqlParams): Promise<Row[]>;
}

export interface ScheduleOptions {
  /** What is enqueued to this instance (or appended to `stream`) when due. */
  event: NewEvent;
  /** When: a Date, or epoch seconds. */
  at?: Date | number;
  /** Or after this many seconds. */
  after_s?: number;
  /** Or on this cron expression (UTC). */
  cron?: string;
  /** Append the event to this stream instead of this instance's queue. */
  stream?: string;
}

export interface Schedule {
  name: string;
  due_at: number; // ms since the epoch
  cron: string | null;
  event: Json;
  stream: string | null;
}

/** Durable timers of this instance. */
export interface Schedules {
  upsert(name: string, options: ScheduleOptions): Promise<{ name: string; due_at: number }>;
  /** Resolves to whether there was one. */
  cancel(name: string): Promise<boolean>;
  list(): Promise<Schedule[]>;
}

/** Child instances: their parent_id is this instance. */
export interface ChildInstances {
  create(actor: string, options?: { key?: string | null; config?: Record<string, unknown>; filter?: Filter | null }): Promise<CreatedInstance>;
}

/** Methods of the application's portals (docs/basics/actors.md). */
export interface Portals {
  call<R = Json>(portal: string, method: string, params?: unknown, options?: { timeout_s?: number }): Promise<R>;
}

export interface Message {
  conversation_id: string;
  message_id: string;
  seq: number;
  role: string;
  content: Json;
  metadata: Record<string, Json>;
  at: number;
  offset: number | null;
}

export interface Conversations {
  postMessage(conversation_id: string, role: string, content: unknown, metadata?: Record<string, unknown> | null): Promise<Message>;
  messages(conversation_id: string, options?: { after?: number; limit?: number }): Promise<Message[]>;
}

/** Every op, by name: its params and its answer (docs/advanced/hosts.md).
 * `ctx.call(name, params)` is typed by it; the methods above use it. */
export interface Ops {
  stream_append: { params: { event: NewEvent; stream: string }; result: { offset: number; id: string } };
  state_get: { params: Record<string, never>; result: { value: Json; version: number } };
  state_set: { params: { value: unknown }; result: { version: number } };
  state_cas: { params: { expected: number; value: unknown }; result: { ok: boolean; version: number } };
  sqlite_exec: { params: { sql: string; params?: Json }; result: { rowcount: number; lastrowid: Json } };
  sqlite_query: { params: { sql: string; params?: Json }; result: Record<string, Json>[] };
  instances_create: {
    params: { actor: string; key?: string | null; config?: Record<string, unknown>; filter?: Filter | null };
    result: CreatedInstance;
  };
  portal_call: { params: { portal: string; method: string; params?: unknown; timeout_s?: number }; result: Json };
  schedules_upsert: {
    params: { name: string; event: NewEvent; at?: number; after_s?: number; cron?: string; stream?: string };
    result: { name: string; due_at: number };
  };
  schedules_cancel: { params: { name: string }; result: { cancelled: boolean } };
  schedules_list: { params: Record<string, never>; result: Schedule[] };
  conversations_post: {
    params: { conversation_id: string; role: string; content: unknown; metadata?: Record<string, unknown> | null };
    result: Message;
  };
  conversations_messages: { params: { conversation_id: string; after?: number; limit?: number }; result: Message[] };
}
export type OpName = keyof Ops;

/** The context of one process() call; `P` is the event's payload type. */
export declare class Context<P = Json> {
  readonly tenant: string;
  readonly instance: Instance;
  readonly event: YokeEvent<P>;
  /** 1 on the first try; retries count up. */
  readonly attempt: number;
  /** The event's queue row: the same on every retry (null: none). */
  readonly queueRow: number | null;
  /** The run attempt's W3C trace context when tracing is on, else null
   * (with @opentelemetry/api installed, the handler also runs in it). */
  readonly trace: { traceparent: string; tracestate?: string } | null;
  readonly state: State;
  readonly sqlite: Sqlite;
  readonly schedules: Schedules;
  readonly instances: ChildInstances;
  readonly portals: Portals;
  readonly conversations: Conversations;
  /** A key for a call to the outside world, the same on every retry of this row (docs/advanced/effects.md). */
  idempotencyKey(name?: string): string;
  /** A number in [0, 1) from the run's seed: a fork of the instance replays the same draws (docs/advanced/forks.md). */
  random(): number;
  /** The current time by the runtime's clock (a test's virtual clock moves it; Date.now() stays the machine's). */
  now(): Date;
  /** Append to one of the tenant's streams (default "/"); resolves once durable. */
  append<E = unknown>(event: NewEvent<E>, stream?: string): Promise<{ offset: number; id: string }>;
  /** Any op by its name, with its params (Ops). */
  call<M extends OpName>(method: M, params: Ops[M]["params"]): Promise<Ops[M]["result"]>;
}

/** An op the kernel refused or failed; `code` is Yoke's stable error code
 * (`invalid_event`, `idempotency_conflict`, ...). */
export declare class YokeError extends Error {
  constructor(message: string, code: string, details?: Record<string, unknown>);
  readonly code: string;
  readonly details: Record<string, Json>;
}

/** What an actor's script exports: `process`, typed by its event payload. */
export type Process<P = Json> = (ctx: Context<P>, event: YokeEvent<P>) => Promise<void>;

/** An actor of a TypeScript application (defineApp): what Python's
 * `@app.actor` takes, and its process function. */
export interface ActorDefinition<P = any> {
  /** Which events: types (glob patterns), streams, a JSONata `where`; a JSONata `key` makes one instance per key. */
  filter: Filter;
  /** Runs of one instance at once (default 1). */
  concurrency?: number;
  /** Attempts before the dead letter (default: the deployment's, 5). */
  max_attempts?: number;
  timeout_s?: number;
  /** One instance, made when the application starts. */
  singleton?: boolean;
  retry_base_s?: number;
  retry_max_s?: number;
  /** "atomic": a run's effects commit together with its completion (docs/advanced/effects.md). */
  effects?: "default" | "atomic";
  process: Process<P>;
}

/** A subscription the application declares (as Python's app.subscription). */
export interface SubscriptionDefinition {
  source: string;
  name: string;
  receiver:
    | { kind: "copy"; target: string }
    | { kind: "webhook"; url: string; secret_env: string }
    | { kind: "webhook"; url: string; secret_setting: string }
    /** One of defineApp's `receivers`, called with each batch. */
    | { kind: "call"; function: string };
  tenant?: string;
  filter?: Filter;
  transform?: string;
  start?: "now" | "beginning";
  on_failing_event?: "halt" | "skip";
}

/** The context of a portal's handle or method: an actor's, less its instance. */
export declare class PortalContext {
  readonly tenant: string;
  readonly portal: string;
  readonly instances: ChildInstances;
  readonly portals: Portals;
  readonly conversations: Conversations;
  now(): Date;
  append<E = unknown>(event: NewEvent<E>, stream?: string): Promise<{ offset: number; id: string }>;
  call<M extends OpName>(method: M, params: Ops[M]["params"]): Promise<Ops[M]["result"]>;
}

/** An HTTP request to a portal (`path` below /v1/portals/<name>). */
export declare class PortalRequest {
  readonly method: string;
  readonly path: string;
  readonly query: Record<string, string>;
  readonly headers: Record<string, string>;
  readonly body: Uint8Array;
  text(): string;
  /** The body as JSON; a YokeError (invalid_input: a 400) when it is not. */
  json<T = Json>(): T;
}

/** What a portal's handle answers: a JSON value (200), [status, value], or nothing (204). */
export type PortalAnswer = unknown | [number, unknown] | undefined;

/** A portal of a TypeScript application: mounted at /v1/portals/<name>;
 * `methods` are what actors call with ctx.portals.call(portal, method, params).
 * A YokeError it throws is answered with its code and status (a 400 for
 * invalid_input); any other error is a 500. */
export interface PortalDefinition {
  tenant?: string;
  handle(ctx: PortalContext, request: PortalRequest): Promise<PortalAnswer>;
  methods?: Record<string, (ctx: PortalContext, params: any) => Promise<unknown>>;
  /** A loop started with the executor (a poller, a listener), restarted with
   * backoff when it ends or throws, stopped at shutdown; it runs in a Node
   * host of its own (the pool has one more for each loop). */
  start?(ctx: PortalContext): Promise<void>;
}

export interface AppDefinition {
  name?: string;
  /** The deployment version (halted subscriptions resume on a new one). */
  version?: string;
  actors: Record<string, ActorDefinition>;
  portals?: Record<string, PortalDefinition>;
  /** Functions `call` subscriptions deliver to: returning acknowledges the
   * batch, throwing fails it (retried on the subscription's ladder). */
  receivers?: Record<string, (batch: ReceivedBatch) => Promise<void>>;
  subscriptions?: SubscriptionDefinition[];
}

/** What a call subscription's receiver gets. */
export interface ReceivedBatch {
  events: YokeEvent[];
  path: string;
  name: string;
  stream_id: string;
  attempt: number;
  delivery_id: string;
}

/** The application: the module's default export (`yoke serve --app dist/app.js`). */
export declare function defineApp<A extends AppDefinition>(definition: A): A;
