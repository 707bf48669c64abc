// A test kit for Node test runners (node:test, Vitest): the real engine,
// `yoke serve --dev` with your application, on a temporary SQLite file and
// a free port; a client on it; helpers to wait for idle and look at state
// and failures; stop() removes it all. `yoke` is found on PATH (or
// YOKE_BIN: the command, e.g. a virtualenv's bin/yoke).

import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, rm } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { YokeClient } from "./client.js";

async function freePort() {
  const server = net.createServer();
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const { port } = server.address();
  server.close();
  await once(server, "close");
  return port;
}

/** Start Yoke with `app` (a JavaScript application module, or a Python
 * `module:attribute`); resolves once it is ready. `env`: more settings
 * (YOKE_*). */
export async function startYoke({ app, env = {}, yoke = process.env.YOKE_BIN ?? "yoke", timeoutMs = 60_000 } = {}) {
  const dir = await mkdtemp(path.join(os.tmpdir(), "yoke-test-"));
  const port = await freePort();
  const args = ["serve", "--dev", "--host", "127.0.0.1", "--port", String(port)];
  if (app) args.push("--app", /\.[cm]?js$/.test(app) ? path.resolve(app) : app);
  const child = spawn(yoke, args, {
    env: { ...process.env, YOKE_DATABASE_URL: `sqlite:///${dir}/yoke.db`, YOKE_DATA_DIR: dir, YOKE_ACCESS_LOG: "0", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout.on("data", (chunk) => { output += chunk; });
  child.stderr.on("data", (chunk) => { output += chunk; });
  const exited = once(child, "exit");
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`yoke serve exited (${child.exitCode}):\n${output}`);
    try {
      if ((await fetch(url + "/readyz")).ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`yoke serve was not ready within ${timeoutMs} ms:\n${output}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  const client = new YokeClient({ url });
  return {
    url,
    client,
    /** What the server printed so far (its log: the actors' output too). */
    output: () => output,
    /** Until the actors are idle; throws saying what is busy after timeout_s. */
    async idle({ timeout_s = 30 } = {}) {
      const answer = await client.waitIdle({ timeout_s });
      if (!answer.idle) throw new Error(answer.busy);
    },
    /** The ctx.state of the instance of `actor` with `key` (null: none). */
    async state(actor, key) {
      const found = await client.instances.find(actor, key);
      return found === null ? null : (await client.instances.get(found.instance_id)).state.value;
    },
    failures: (filter) => client.failures.list(filter),
    /** Stop the server and remove its files. */
    async stop() {
      if (child.exitCode === null) {
        child.kill("SIGTERM");
        await exited;
      }
      await rm(dir, { recursive: true, force: true });
    },
  };
}
