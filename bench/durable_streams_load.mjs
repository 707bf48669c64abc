// The load generator of bench/durable_streams.py: the same protocol traffic
// against any Durable Streams server. Prints one JSON line per scenario.
//
//   node bench/durable_streams_load.mjs BASE_URL SCENARIO [key=value ...]
//
// Scenarios (100 streams named <run>-<i>, 256-byte JSON messages):
//   a  producers concurrent writers, one message per POST, for seconds
//   b  the same with a batch of `batch` messages per POST
//   c  readers concurrent clients, each reading `messages` messages from
//      the beginning of one stream (following Stream-Next-Offset)
// Stream creation (a, b) and filling (c) are not timed.
//
// Requests go through node:http with keep-alive connections, not fetch:
// fetch (undici) took about 7 us of CPU per message in (b), more than either
// server, on the same two cores.
import http from "node:http"

const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity })

// One request: its status, headers and whole body (a Buffer).
function request(method, target, { headers = {}, body } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request(target, { method, agent, headers }, (res) => {
      const chunks = []
      res.on("data", (chunk) => chunks.push(chunk))
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }))
      res.on("error", reject)
    })
    req.on("error", reject)
    req.end(body)
  })
}

const [base, scenario, ...rest] = process.argv.slice(2)
const opts = Object.fromEntries(rest.map((kv) => kv.split("=")))
const streams = Number(opts.streams ?? 100)
const producers = Number(opts.producers ?? 64)
const batch = scenario === "a" ? 1 : Number(opts.batch ?? 100)
const seconds = Number(opts.seconds ?? 10)
const readers = Number(opts.readers ?? 200)
const perReader = Number(opts.messages ?? 1000)
const run = opts.run ?? `bench-${Date.now()}`
const url = (i) => `${base}/v1/stream/${run}-${scenario}-${i}`

// A 256-byte JSON message (its serialized form).
function message(n) {
  const head = JSON.stringify({ n, at: Date.now(), pad: "" })
  return JSON.stringify({ n, at: Date.now(), pad: "x".repeat(256 - head.length) })
}

function check(res, what) {
  if (res.status < 200 || res.status > 299) throw new Error(`${what}: ${res.status} ${res.body}`)
}

async function createAll() {
  for (let i = 0; i < streams; i += 20) {
    await Promise.all(
      Array.from({ length: Math.min(20, streams - i) }, (_, k) =>
        request("PUT", url(i + k), { headers: { "content-type": "application/json" } }).then((r) =>
          check(r, "create")
        )
      )
    )
  }
}

function percentile(sorted, p) {
  if (!sorted.length) return 0
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]
}

async function write() {
  await createAll()
  const latencies = []
  let messages = 0
  const started = performance.now()
  const deadline = started + seconds * 1000
  await Promise.all(
    Array.from({ length: producers }, async (_, p) => {
      let i = p
      while (performance.now() < deadline) {
        const body = batch === 1 ? message(i) : "[" + Array.from({ length: batch }, (_, k) => message(i * batch + k)).join(",") + "]"
        const t = performance.now()
        const res = await request("POST", url(i % streams), {
          headers: { "content-type": "application/json" },
          body,
        })
        check(res, "append")
        latencies.push(performance.now() - t)
        messages += batch
        i += producers
      }
    })
  )
  return report(messages, performance.now() - started, latencies)
}

async function read() {
  // Fill: each stream gets perReader messages, in batches of 100.
  await createAll()
  for (let i = 0; i < streams; i += 10) {
    await Promise.all(
      Array.from({ length: Math.min(10, streams - i) }, async (_, k) => {
        for (let sent = 0; sent < perReader; sent += 100) {
          const n = Math.min(100, perReader - sent)
          const body = "[" + Array.from({ length: n }, (_, j) => message(sent + j)).join(",") + "]"
          check(
            await request("POST", url(i + k), { headers: { "content-type": "application/json" }, body }),
            "fill"
          )
        }
      })
    )
  }
  const latencies = []
  let messages = 0
  const started = performance.now()
  await Promise.all(
    Array.from({ length: readers }, async (_, r) => {
      let offset = "-1"
      let got = 0
      const t = performance.now()
      while (got < perReader) {
        const res = await request("GET", `${url(r % streams)}?offset=${encodeURIComponent(offset)}`)
        check(res, "read")
        const items = JSON.parse(res.body)
        got += items.length
        offset = res.headers["stream-next-offset"]
        if (!items.length) throw new Error("read: an empty page before the end")
      }
      latencies.push(performance.now() - t)
      messages += got
    })
  )
  return report(messages, performance.now() - started, latencies)
}

function report(messages, ms, latencies) {
  latencies.sort((x, y) => x - y)
  return {
    scenario,
    messages,
    seconds: ms / 1000,
    msgs_per_s: messages / (ms / 1000),
    p50_ms: percentile(latencies, 50),
    p99_ms: percentile(latencies, 99),
    requests: latencies.length,
  }
}

const result = scenario === "c" ? await read() : await write()
console.log(JSON.stringify(result))
agent.destroy()
