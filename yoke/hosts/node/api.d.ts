// Generated from Yoke's OpenAPI document by yoke/http/typescript_types.py: do not edit.
// The answers of the HTTP API, as yoke-sdk/client returns them.

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** ``{offset, id}`` for one event, ``{results: [...]}`` for a batch. */
export type AppendAnswer = Appended | AppendedBatch;

export interface Appended {
  /** The event's offset in its stream */
  offset: number;
  id: string;
}

export interface AppendedBatch {
  results: Appended[];
}

export interface ErrorBody {
  error: ErrorDetail;
}

/** ``code`` is stable; other keys are details (e.g. requested, earliest, latest). */
export interface ErrorDetail {
  code: string;
  message: string;
}

/** A stored event. */
export interface EventOutput {
  offset: number;
  id: string;
  /** Milliseconds since the epoch */
  at: number;
  type: string;
  /** Any JSON value */
  payload: Json;
  metadata: Record<string, Json>;
  source: Record<string, Json> | null;
  correlation: string | null;
  priority: number;
  group_id: string | null;
  idempotency_key: string | null;
  tenant: string;
  path: string;
  ephemeral: boolean;
}

/** Events with offset > ``after``, ascending; read on from ``next_after``. */
export interface EventPage {
  events: EventOutput[];
  /** The last event's offset (the cursor given when there is none) */
  next_after: number;
}

/** One parked failure (docs/advanced/failures.md). */
export interface Failure {
  /** Opaque and stable while the failure is open */
  id: string;
  kind: "dead_letter" | "halted" | "skipped";
  receiver: "actor" | "copy" | "webhook" | "call" | "processor";
  /** The event's stream (null: sent to the instance directly) */
  path: string | null;
  offset: number | null;
  /** Milliseconds since the epoch */
  failed_at: number;
  attempt_count: number;
  /** The last attempt's error */
  error: string | null;
  /** Every failed attempt, oldest first (the first 50) */
  attempts: FailureAttempt[];
  /** The event (null once retention removed it, or when its stream pins its data handling) */
  event: Record<string, Json> | null;
  actor: string | null;
  instance_id: string | null;
  /** Halted and skipped events: the subscription on path */
  subscription: string | null;
  traceback: string | null;
}

export interface FailureAttempt {
  /** The attempt's number (1: the first) */
  number: number;
  error: string | null;
  /** When it failed, in milliseconds since the epoch */
  at: number | null;
}

export interface FailureList {
  /** Oldest first */
  failures: Failure[];
}

export interface Idle {
  idle: boolean;
  /** What is still busy, when not idle */
  busy?: string;
}

export interface Instance {
  instance_id: string;
  /** The same as instance_id (what this answer first said) */
  id: string;
  tenant: string;
  actor: string;
  key: string | null;
  config: Record<string, Json>;
  filter: Record<string, Json> | null;
  parent_id: string | null;
  /** Milliseconds since the epoch */
  created_at: number;
  /** The worker that owns it (null: none yet) */
  worker_id: string | null;
}

export interface InstanceDetail {
  instance_id: string;
  /** The same as instance_id (what this answer first said) */
  id: string;
  tenant: string;
  actor: string;
  key: string | null;
  config: Record<string, Json>;
  filter: Record<string, Json> | null;
  parent_id: string | null;
  /** Milliseconds since the epoch */
  created_at: number;
  /** The worker that owns it (null: none yet) */
  worker_id: string | null;
  state: InstanceState;
  queue: QueueDepth;
}

export interface InstanceList {
  instances: Instance[];
}

export interface InstanceState {
  /** Any JSON value */
  value: Json;
  version: number;
}

export interface QueueDepth {
  pending: number;
  processing: number;
  dead: number;
}

export interface SubscriptionList {
  subscriptions: SubscriptionStatus[];
}

export interface SubscriptionStatus {
  name: string;
  path: string;
  config: Record<string, Json>;
  /** The offset of its configuration event */
  configured_at: number;
  generation: number;
  processed_through_offset: number;
  head: number;
  lag: number;
  halted: Record<string, Json> | null;
  last_error: string | null;
  /** When last_error happened (ms since the epoch); both are kept after it recovers */
  last_error_at?: number | null;
  attempts: number;
  /** Milliseconds since the epoch, while a retry is pending */
  next_retry_at: number | null;
  delivered: number;
  failures: number;
  /** The process delivering it now (null: none) */
  delivering?: string | null;
  /** Paused by the operator ({reason, offset, at_offset}); resume continues */
  parked?: Record<string, Json> | null;
  state?: "running" | "retrying" | "parked" | "halted";
  /** The source stream lifetime it delivers */
  source_stream_id?: string;
}
