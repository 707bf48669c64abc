// Types of testing.js: the real engine for Node test runners.

import type { Failure, YokeClient } from "./client.js";
import type { Json } from "./yoke.js";

export interface RunningYoke {
  readonly url: string;
  readonly client: YokeClient;
  output(): string;
  idle(options?: { timeout_s?: number }): Promise<void>;
  state<S = Json>(actor: string, key: string): Promise<S | null>;
  failures(filter?: { kind?: string; actor?: string; stream?: string }): Promise<Failure[]>;
  stop(): Promise<void>;
}

/** `yoke serve --dev` with `app` on a temporary SQLite file and a free port. */
export declare function startYoke(options?: {
  app?: string;
  env?: Record<string, string>;
  yoke?: string;
  timeoutMs?: number;
}): Promise<RunningYoke>;
