// Types of the Node host's SDK (yoke.js): what process(ctx, event) gets.
// A TypeScript actor imports them with `import type` (erased when
// compiled, so the compiled script needs nothing at run time):
//
//   import type { Context, YokeEvent } from "<this folder>/yoke.js";
//   export async function process(ctx: Context, event: YokeEvent): Promise<void> { ... }

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** An event as process() receives it. */
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
export interface NewEvent {
  type: string;
  payload?: Json;
  metadata?: Record<string, Json>;
  correlation?: string;
  priority?: number;
  group_id?: string;
  idempotency_key?: string;
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

/** The instance's JSON state document, with a version. */
export interface State {
  get<T extends Json = Json>(fallback?: T): Promise<T>;
  version(): Promise<number>;
  /** Overwrite without a version check; resolves to the new version. */
  set(value: Json): Promise<number>;
  /** Read, apply fn, compare-and-set; on a concurrent write, again.
   * Resolves to the value written. */
  update<T extends Json = Json>(fn: (state: T) => T | Promise<T>, fallback?: T): Promise<T>;
}

/** A SQLite value: a BLOB is a Uint8Array; an INTEGER beyond 2**53 - 1 is a
 * bigint (a bigint param within that range is sent as a number). */
export type SqlValue = null | number | bigint | string | boolean | Uint8Array;

/** User tables in the instance's own SQLite database (run by the kernel). */
export interface Sqlite {
  exec(sql: string, params?: SqlValue[] | Record<string, SqlValue>): Promise<{ rowcount: number; lastrowid: number | bigint | null }>;
  query<Row = Record<string, SqlValue>>(sql: string, params?: SqlValue[] | Record<string, SqlValue>): Promise<Row[]>;
}

/** The context of one process() call. */
export declare class Context {
  readonly tenant: string;
  readonly instance: Instance;
  readonly event: YokeEvent;
  /** 1 on the first try; retries count up. */
  readonly attempt: number;
  /** The event's queue row: the same on every retry. */
  readonly queueRow: number;
  readonly state: State;
  readonly sqlite: Sqlite;
  /** A key for a call to the outside world, the same on every retry of this row (docs/advanced/effects.md). */
  idempotencyKey(name?: string): string;
  /** The current time by the runtime's clock (a test's virtual clock moves it; Date.now() stays the machine's). */
  now(): Date;
  /** Append to one of the tenant's streams (default "/"); resolves once durable. */
  append(event: NewEvent, stream?: string): Promise<{ offset: number; id: string }>;
  /** Any op by name, with its JSON params (docs/advanced/hosts.md lists them). */
  call<R = Json>(method: string, params?: Record<string, Json>): Promise<R>;
}

/** An op the kernel refused or failed; `code` is Yoke's stable error code
 * (`invalid_event`, `idempotency_conflict`, ...). */
export declare class YokeError extends Error {
  readonly code: string;
  readonly details: Record<string, Json>;
}

/** What an actor's script exports. */
export type Process = (ctx: Context, event: YokeEvent) => Promise<void>;
