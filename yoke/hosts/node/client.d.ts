// Types of client.js: Yoke's HTTP API from Node 20 or a browser. The
// answers' types (api.d.ts) are generated from Yoke's OpenAPI document.

import type { Appended, EventPage, Failure, Idle, Instance, InstanceDetail, SubscriptionStatus } from "./api.js";
import type { Json, NewEvent, YokeEvent } from "./yoke.js";

export type * from "./api.js";

export declare const ROUTES: ReadonlyArray<readonly [string, string]>;

/** An error answer: `code` is Yoke's stable error code, `status` the HTTP status. */
export declare class YokeHttpError extends Error {
  readonly status: number;
  readonly code: string;
  readonly details: Record<string, Json>;
}

/** A page of events, their payloads typed `P`. */
export type Page<P = Json> = Omit<EventPage, "events"> & { events: YokeEvent<P>[] };

/** An instance with its state typed `S`. */
export type InstanceWithState<S = Json> = Omit<InstanceDetail, "state"> & { state: { value: S; version: number } };

export declare class YokeClient {
  constructor(options: { url: string; token?: string; tenant?: string; fetch?: typeof fetch });
  append<P = Json>(stream: string, event: NewEvent<P>, options?: { idempotencyKey?: string }): Promise<Appended>;
  appendBatch(stream: string, events: NewEvent[], options?: { idempotencyKey?: string }): Promise<Appended[]>;
  read<P = Json>(stream: string, options?: { after?: number; limit?: number }): Promise<Page<P>>;
  readAll<P = Json>(stream: string, options?: { after?: number; limit?: number }): AsyncGenerator<YokeEvent<P>>;
  /** Live events after `after`; resumes after the last one seen on a dropped connection. */
  tail<P = Json>(stream: string, options?: { after?: number; types?: string[]; signal?: AbortSignal }): AsyncGenerator<YokeEvent<P>>;
  waitIdle(options?: { timeout_s?: number }): Promise<Idle>;
  readonly instances: {
    list(options?: { actor?: string; limit?: number; after?: string }): Promise<Instance[]>;
    find(actor: string, key: string): Promise<Instance | null>;
    get<S = Json>(instanceId: string): Promise<InstanceWithState<S>>;
  };
  readonly subscriptions: { list(stream: string): Promise<SubscriptionStatus[]> };
  readonly failures: {
    list(filter?: { kind?: string; stream?: string; actor?: string; subscription?: string; limit?: number }): Promise<Failure[]>;
    get(failureId: string): Promise<Failure>;
  };
}
