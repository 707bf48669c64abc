// The protocol's TypeScript client (@durable-streams/client, pinned in
// package.json) against a running Yoke server (DS_BASE_URL). Run by
// test_node_client.py on both backends.
import { expect, test } from "vitest"
import { DurableStream, IdempotentProducer } from "@durable-streams/client"

const base = process.env.DS_BASE_URL
if (!base) throw new Error("DS_BASE_URL is required")
const unique = (prefix) => `${base}/v1/stream/${prefix}-${Math.random().toString(36).slice(2, 10)}`

async function until(check, what, timeoutMs = 20000) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (await check()) return
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

test("create, append, catch-up read, resume from an offset", async () => {
  const url = unique("js-json")
  const ds = await DurableStream.create({ url, contentType: "application/json" })
  await ds.append(JSON.stringify({ n: 1 }))
  const first = (await ds.head()).offset
  await ds.append(JSON.stringify({ n: 2 }))
  await ds.append(JSON.stringify({ n: 3 }))

  const all = await ds.stream({ live: false })
  expect(await all.json()).toEqual([{ n: 1 }, { n: 2 }, { n: 3 }])
  expect(all.upToDate).toBe(true)

  const rest = await ds.stream({ offset: first, live: false })
  expect(await rest.json()).toEqual([{ n: 2 }, { n: 3 }])
  expect(rest.offset > first).toBe(true)
})

for (const live of ["long-poll", "sse"]) {
  test(`live read (${live}) sees appends as they commit`, async () => {
    const url = unique(`js-live-${live}`)
    const ds = await DurableStream.create({ url, contentType: "application/json" })
    await ds.append(JSON.stringify({ n: 0 }))
    const seen = []
    const res = await ds.stream({ offset: "-1", live })
    const stop = res.subscribeJson((batch) => {
      seen.push(...batch.items)
    })
    try {
      await until(() => seen.length === 1, "the first message")
      for (let n = 1; n <= 5; n++) await ds.append(JSON.stringify({ n }))
      await until(() => seen.length === 6, "the live messages")
      expect(seen).toEqual([0, 1, 2, 3, 4, 5].map((n) => ({ n })))
    } finally {
      stop()
      res.cancel()
    }
  })
}

test("bytes round-trip, and SSE delivers them base64-encoded", async () => {
  const url = unique("js-bytes")
  const ds = await DurableStream.create({ url, contentType: "application/octet-stream" })
  const data = new Uint8Array(300).map((_, i) => i % 256)
  await ds.append(data)
  const res = await ds.stream({ live: false })
  expect(Array.from(await res.body())).toEqual(Array.from(data))

  const chunks = []
  const live = await ds.stream({ offset: "-1", live: "sse" })
  const stop = live.subscribeBytes((chunk) => {
    chunks.push(...chunk.data)
  })
  try {
    await until(() => chunks.length >= 300, "the SSE bytes")
    expect(chunks).toEqual(Array.from(data))
  } finally {
    stop()
    live.cancel()
  }
})

test("the idempotent producer: batches, retries deduplicated, fencing, close", async () => {
  const url = unique("js-producer")
  const ds = await DurableStream.create({ url, contentType: "application/json" })
  const producer = new IdempotentProducer(ds, "writer-1", { epoch: 0, lingerMs: 5 })
  for (let i = 0; i < 200; i++) producer.append(JSON.stringify({ i }))
  await producer.flush()
  const items = await (await ds.stream({ live: false })).json()
  expect(items.map((m) => m.i)).toEqual([...Array(200).keys()])

  // A retry of a batch the server already took is answered 204, not appended.
  const retry = await fetch(url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      "producer-id": "writer-1",
      "producer-epoch": "0",
      "producer-seq": "0",
    },
    body: JSON.stringify([{ i: "again" }]),
  })
  expect(retry.status).toBe(204)

  // A new epoch fences the old one.
  const next = new IdempotentProducer(ds, "writer-1", { epoch: 1, lingerMs: 5 })
  next.append(JSON.stringify({ i: "epoch 1" }))
  await next.flush()
  const zombie = await fetch(url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      "producer-id": "writer-1",
      "producer-epoch": "0",
      "producer-seq": "999",
    },
    body: JSON.stringify({ i: "zombie" }),
  })
  expect(zombie.status).toBe(403)
  expect(zombie.headers.get("producer-epoch")).toBe("1")

  await next.close(JSON.stringify({ i: "last" }))
  const head = await ds.head()
  expect(head.streamClosed).toBe(true)
  const final = await (await ds.stream({ live: false })).json()
  expect(final.length).toBe(202)
  expect(final.slice(-2)).toEqual([{ i: "epoch 1" }, { i: "last" }])
})
