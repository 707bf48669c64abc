// The Node host: `node host.js FD`, FD one end of a unix socket pair whose
// other end the kernel holds (yoke/hosts/pool.py). It speaks the host
// protocol (docs/advanced/hosts.md#the-protocol): JSON-RPC 2.0, one JSON text per
// line. The kernel sends host.init once (the actors' scripts to import)
// and actor.process per run; every ctx call is an op request back. The
// host holds no database connection and no credentials.

import { AsyncLocalStorage } from "node:async_hooks";
import { createRequire } from "node:module";
import net from "node:net";
import nodeProcess from "node:process";
import { pathToFileURL } from "node:url";
import { format } from "node:util";
import { Context, PortalContext, PortalRequest, YokeError } from "./yoke.js";

const PROTOCOL_VERSION = 1;
const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
const PARSE_ERROR = -32700;
const METHOD_NOT_FOUND = -32601;
const INVALID_PARAMS = -32602;
const OP_FAILED = -32000;
const HANDLER_FAILED = -32001;
const VERSION_MISMATCH = -32003;
const APP_FAILED = -32005;

class Refused extends Error {
  constructor(code, message, data) {
    super(message);
    this.code = code;
    this.data = data;
  }
}

const socket = new net.Socket({ fd: Number(nodeProcess.argv[2]), readable: true, writable: true });
const actors = new Map(); // name -> process(ctx, event)
const portals = new Map(); // name -> {handle, methods} of defineApp({ portals })
const receivers = new Map(); // name -> receive(batch) of defineApp({ receivers })
const waiting = new Map(); // id of an op we sent -> {resolve, reject}
const updates = new Map(); // instance id -> the tail of its state updates in this host
let nextId = 0;
let corked = false;

// Messages sent in one tick share a write (and one wake-up of the kernel).
function send(message) {
  sendLine(JSON.stringify(message));
}

function sendLine(line) {
  if (!corked) {
    corked = true;
    socket.cork();
    nodeProcess.nextTick(() => {
      corked = false;
      socket.uncork();
    });
  }
  socket.write(line + "\n");
}

// What a handler prints with console.* goes to the kernel as run.output
// notifications, naming the run it was printed in (async context): the
// kernel logs it with the run's actor, instance and attempt, and keeps it
// with a failure. Printed outside a run (at import), the run is null.
const currentRun = new AsyncLocalStorage();
const MAX_OUTPUT_CHARS = 4096;
for (const [level, stream] of [["log", "stdout"], ["info", "stdout"], ["debug", "stdout"],
  ["warn", "stderr"], ["error", "stderr"], ["trace", "stderr"]]) {
  console[level] = (...args) => {
    const text = (level === "trace" ? format(...args) + "\n" + new Error().stack : format(...args)) + "\n";
    send({ jsonrpc: "2.0", method: "run.output",
      // Well formed: a cut (or printed) half of a surrogate pair is no JSON the kernel reads.
      params: { run: currentRun.getStore() ?? null, stream, text: text.slice(0, MAX_OUTPUT_CHARS).toWellFormed() } });
  };
}

function answer(id, result) {
  send({ jsonrpc: "2.0", id, result: result ?? null });
}

function fail(id, code, message, data) {
  const error = { code, message };
  if (data !== undefined) error.data = data;
  send({ jsonrpc: "2.0", id, error });
}

// An op of run `run`: resolves to its result, rejects with YokeError.
function op(run, method, params) {
  const id = ++nextId;
  return new Promise((resolve, reject) => {
    let line;
    try {
      line = JSON.stringify({ jsonrpc: "2.0", id, method, params, run });
    } catch (err) {  // a BigInt or a cycle: the handler hears of it, nothing is sent
      reject(new YokeError(`the params of ${method} are not JSON: ${err?.message ?? err}`, "invalid_input",
        { op: method }));
      return;
    }
    waiting.set(id, { resolve, reject });
    sendLine(line);
  });
}

function answered(message) {
  const pending = waiting.get(message.id);
  if (pending === undefined) return;
  waiting.delete(message.id);
  if (message.error === undefined) {
    pending.resolve(message.result);
    return;
  }
  const { message: text, data } = message.error;
  pending.reject(new YokeError(text, data?.code ?? "op_failed", data?.details));
}

// One state update of an instance at a time in this host (other hosts'
// are caught by the compare-and-set).
function lockFor(instanceId) {
  return (fn) => {
    const run = (updates.get(instanceId) ?? Promise.resolve()).then(fn);
    const tail = run.catch(() => {});
    updates.set(instanceId, tail);
    tail.then(() => {
      if (updates.get(instanceId) === tail) updates.delete(instanceId);
    });
    return run;
  };
}

async function load(script) {
  try {
    return await import(pathToFileURL(script).href);
  } catch (err) {
    throw new Refused(APP_FAILED, `cannot load ${script}: ${err?.name ?? "Error"}: ${err?.message ?? err}`,
      { traceback: String(err?.stack ?? err) });
  }
}

// @opentelemetry/api as the application resolves it (null when it has none):
// a run's handler then runs in the attempt's trace context, so the spans
// the application makes join the run's trace (docs/advanced/tracing.md).
let otel = null;
function findOtel(script) {
  if (otel !== null) return;
  try {
    otel = createRequire(script)("@opentelemetry/api");
  } catch {
    otel = null;
  }
}

// The attempt's context as an @opentelemetry/api Context: read from the W3C
// traceparent here (whatever propagator the application registered, or none).
const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
function traceContext(carrier) {
  const found = TRACEPARENT.exec(carrier?.traceparent ?? "");
  if (found === null) return null;
  const spanContext = { traceId: found[1], spanId: found[2], traceFlags: parseInt(found[3], 16), isRemote: true };
  if (carrier.tracestate && typeof otel.createTraceState === "function") {
    spanContext.traceState = otel.createTraceState(carrier.tracestate);
  }
  return otel.trace.setSpanContext(otel.ROOT_CONTEXT, spanContext);
}

async function init(params) {
  if (params.protocol !== PROTOCOL_VERSION) {
    throw new Refused(VERSION_MISMATCH, `this host speaks protocol ${PROTOCOL_VERSION}, not ${params.protocol}`,
      { supported: [PROTOCOL_VERSION] });
  }
  // memory_limit_bytes: the kernel already started Node with --max-old-space-size.
  for (const [name, script] of Object.entries(params.actors ?? {})) {
    findOtel(script);
    const module = await load(script);
    // An application's module (defineApp) holds every actor's process;
    // a script of one actor exports it.
    const handler = [module.default?.actors?.[name]?.process, module.process, module.default, module.default?.process]
      .find((f) => typeof f === "function");
    // Missing (a script without it, or code reloaded without that actor):
    // its runs fail with the reason; the host serves the others.
    actors.set(name, handler ?? `${script} exports no process(ctx, event) function for ${name}`);
  }
  // Portals of an application's module (defineApp({ portals })).
  for (const [name, script] of Object.entries(params.portals ?? {})) {
    const module = await load(script);
    const portal = module.default?.portals?.[name];
    portals.set(name, typeof portal?.handle === "function" ? portal
      : `${script} defines no portal ${JSON.stringify(name)} with a handle(ctx, request) function`);
  }
  // Subscription receivers of an application's module (defineApp({ receivers })).
  for (const [name, script] of Object.entries(params.receivers ?? {})) {
    const receiver = (await load(script)).default?.receivers?.[name];
    receivers.set(name, typeof receiver === "function" ? receiver
      : `${script} defines no receiver ${JSON.stringify(name)} function`);
  }
  return { protocol: PROTOCOL_VERSION, language: "node", pid: nodeProcess.pid, actors: [...actors.keys()].sort(),
    portals: [...portals.keys()].sort(), receivers: [...receivers.keys()].sort(), node: nodeProcess.version };
}

// A portal's handle(ctx, request) ("request"), one of its methods
// ("method") or its start(ctx) loop ("start"), with a portal context whose
// ops are the run's.
async function portalCall(params) {
  const portal = portals.get(params.portal);
  if (portal === undefined) {
    throw new Refused(INVALID_PARAMS, `no portal named ${JSON.stringify(params.portal)} in this host`);
  }
  if (typeof portal === "string") throw new Refused(HANDLER_FAILED, portal, { type: "Error", traceback: portal });
  const ctx = new PortalContext((method, p) => op(params.run, method, p), {
    tenant: params.tenant, portal: params.portal, clock: params.clock,
  });
  try {
    return await currentRun.run(params.run, async () => {
      if (params.kind === "start") {  // a loop: it runs until the host is killed (shutdown)
        await portal.start(ctx);
        return { body: null };
      }
      if (params.kind === "method") {
        const fn = portal.methods?.[params.method];
        if (typeof fn !== "function") throw new Error(`portal ${params.portal} has no method ${params.method}`);
        return { body: (await fn(ctx, params.params)) ?? null };
      }
      const answer = await portal.handle(ctx, new PortalRequest(params.request));
      if (answer === undefined || answer === null) return { status: 204, body: null };
      if (Array.isArray(answer) && answer.length === 2 && Number.isInteger(answer[0])) {
        return { status: answer[0], body: answer[1] ?? null };
      }
      return { status: 200, body: answer };
    });
  } catch (err) {
    if (err instanceof YokeError) {  // refused with a code: the route answers it (a 400, a 404...)
      throw new Refused(OP_FAILED, err.message, { code: err.code, details: err.details });
    }
    const type = err?.name ?? typeof err;
    throw new Refused(HANDLER_FAILED, `${type}: ${err?.message ?? String(err)}`,
      { type, traceback: String(err?.stack ?? err) });
  }
}

// A subscription receiver: returning acknowledges the batch, throwing fails it.
async function receiverCall(params) {
  const receiver = receivers.get(params.receiver);
  if (receiver === undefined) {
    throw new Refused(INVALID_PARAMS, `no receiver named ${JSON.stringify(params.receiver)} in this host`);
  }
  if (typeof receiver === "string") throw new Refused(HANDLER_FAILED, receiver, { type: "Error", traceback: receiver });
  try {
    await receiver(params.batch);
  } catch (err) {
    const type = err?.name ?? typeof err;
    throw new Refused(HANDLER_FAILED, `${type}: ${err?.message ?? String(err)}`,
      { type, traceback: String(err?.stack ?? err) });
  }
  return null;
}

async function run(params) {
  const handler = actors.get(params.actor);
  if (handler === undefined) {
    throw new Refused(INVALID_PARAMS, `no actor named ${JSON.stringify(params.actor)} in this host`);
  }
  if (typeof handler === "string") throw new Refused(HANDLER_FAILED, handler, { type: "Error", traceback: handler });
  const ctx = new Context((method, p) => op(params.run, method, p), lockFor(params.instance.instance_id), {
    tenant: params.tenant, instance: params.instance, event: params.event, attempt: params.attempt,
    queueRow: params.queue_row, clock: params.clock, trace: params.trace, seed: params.seed,
  });
  let call = () => handler(ctx, params.event);
  const traced = otel === null ? null : traceContext(params.trace);
  if (traced !== null) {
    const untraced = call;
    call = () => otel.context.with(traced, untraced);
  }
  try {
    await currentRun.run(params.run, call);
  } catch (err) {
    const type = err?.name ?? typeof err;
    throw new Refused(HANDLER_FAILED, `${type}: ${err?.message ?? String(err)}`,
      { type, traceback: String(err?.stack ?? err) });
  }
  return null;
}

async function handle(message) {
  const { id, method, params } = message;
  try {
    if (method === "host.init") answer(id, await init(params ?? {}));
    else if (method === "actor.process") answer(id, await run(params ?? {}));
    else if (method === "portal.call") answer(id, await portalCall(params ?? {}));
    else if (method === "receiver.call") answer(id, await receiverCall(params ?? {}));
    else fail(id, METHOD_NOT_FOUND, `unknown method ${JSON.stringify(method)}`);
  } catch (err) {
    if (err instanceof Refused) fail(id, err.code, err.message, err.data);
    else fail(id, HANDLER_FAILED, `${err?.name}: ${err?.message}`, { type: err?.name, traceback: String(err?.stack) });
  }
}

function received(line) {
  let message;
  try {
    message = JSON.parse(line);
  } catch {
    message = null;
  }
  if (message === null || typeof message !== "object" || Array.isArray(message)) {
    fail(null, PARSE_ERROR, "not a JSON object");
  } else if ("method" in message) {
    handle(message);
  } else {
    answered(message);
  }
}

let buffered = "";
socket.setEncoding("utf8");
socket.on("data", (chunk) => {
  buffered += chunk;
  let end;
  while ((end = buffered.indexOf("\n")) >= 0) {
    const line = buffered.slice(0, end);
    buffered = buffered.slice(end + 1);
    if (line.trim()) received(line);
  }
  if (buffered.length > MAX_MESSAGE_BYTES) nodeProcess.exit(1); // the kernel sends no such message
});
// The kernel closed its end: this host is done.
socket.on("end", () => nodeProcess.exit(0));
socket.on("error", () => nodeProcess.exit(0));
