// Types of client.js: Yoke's HTTP API from Node 20 or a browser.

import type { Json, NewEvent, YokeEvent } from "./yoke.js";

export declare const ROUTES: ReadonlyArray<readonly [string, string]>;

/** An error answer: `code` is Yoke's stable error code, `status` the HTTP status. */
export declare class YokeHttpError extends Error {
  readonly status: number;
  readonly code: string;
  readonly details: Record<string, Json>;
}

export interface Appended {
  offset: number;
  id: string;
}

export interface EventPage<P = Json> {
  events: YokeEvent<P>[];
  next_after: number;
}

export interface InstanceView {
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

export interface InstanceDetail<S = Json> extends InstanceView {
  state: { value: S; version: number };
  queue: { pending: number; processing: number; dead: number };
}

export interface SubscriptionView {
  name: string;
  path: string;
  state: "running" | "retrying" | "halted" | "parked";
  processed_through_offset: number;
  head: number;
  lag: number;
  attempts: number;
  last_error: string | null;
  [field: string]: Json;
}

export interface FailureView {
  id: string;
  kind: "dead_letter" | "halted" | "skipped";
  error: string;
  traceback?: string | null;
  [field: string]: Json | undefined;
}

export declare class YokeClient {
  constructor(options: { url: string; token?: string; tenant?: string; fetch?: typeof fetch });
  append<P = Json>(stream: string, event: NewEvent<P>, options?: { idempotencyKey?: string }): Promise<Appended>;
  appendBatch(stream: string, events: NewEvent[], options?: { idempotencyKey?: string }): Promise<Appended[]>;
  read<P = Json>(stream: string, options?: { after?: number; limit?: number }): Promise<EventPage<P>>;
  readAll<P = Json>(stream: string, options?: { after?: number; limit?: number }): AsyncGenerator<YokeEvent<P>>;
  /** Live events after `after`; resumes after the last one seen on a dropped connection. */
  tail<P = Json>(stream: string, options?: { after?: number; types?: string[]; signal?: AbortSignal }): AsyncGenerator<YokeEvent<P>>;
  waitIdle(options?: { timeout_s?: number }): Promise<{ idle: boolean; busy: string }>;
  readonly instances: {
    list(options?: { actor?: string; limit?: number; after?: string }): Promise<InstanceView[]>;
    find(actor: string, key: string): Promise<InstanceView | null>;
    get<S = Json>(instanceId: string): Promise<InstanceDetail<S>>;
  };
  readonly subscriptions: { list(stream: string): Promise<SubscriptionView[]> };
  readonly failures: {
    list(filter?: { kind?: string; stream?: string; actor?: string; subscription?: string; limit?: number }): Promise<FailureView[]>;
    get(failureId: string): Promise<FailureView>;
  };
}
