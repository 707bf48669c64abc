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

async function check(res, what) {
  if (!res.ok && res.status !== 204) throw new Error(`${what}: ${res.status} ${await res.text()}`)
  await res.arrayBuffer()
}

async function createAll() {
  for (let i = 0; i < streams; i += 20) {
    await Promise.all(
      Array.from({ length: Math.min(20, streams - i) }, (_, k) =>
        fetch(url(i + k), { method: "PUT", headers: { "content-type": "application/json" } }).then((r) =>
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
        const res = await fetch(url(i % streams), {
          method: "POST",
          headers: { "content-type": "application/json" },
          body,
        })
        await check(res, "append")
        latencies.push(performance.now() - t)
        messages += batch
        i += producers
      }
    })
  )
  return report(messages, performance.now() - started, latencies)
}

async function read() {
  if (opts.skipfill !== "1") {
  await createAll()
  for (let i = 0; i < streams; i += 10) {
    await Promise.all(
      Array.from({ length: Math.min(10, streams - i) }, async (_, k) => {
        for (let sent = 0; sent < perReader; sent += 100) {
          const n = Math.min(100, perReader - sent)
          const body = "[" + Array.from({ length: n }, (_, j) => message(sent + j)).join(",") + "]"
          await check(
            await fetch(url(i + k), { method: "POST", headers: { "content-type": "application/json" }, body }),
            "fill"
          )
        }
      })
    )
  }
  }
  if (opts.onlyfill === "1") return {}
  const latencies = []
  let messages = 0
  const started = performance.now()
  await Promise.all(
    Array.from({ length: readers }, async (_, r) => {
      let offset = "-1"
      let got = 0
      const t = performance.now()
      while (got < perReader) {
        const res = await fetch(`${url(r % streams)}?offset=${encodeURIComponent(offset)}`)
        if (!res.ok) throw new Error(`read: ${res.status} ${await res.text()}`)
        const items = await res.json()
        got += items.length
        offset = res.headers.get("stream-next-offset")
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
