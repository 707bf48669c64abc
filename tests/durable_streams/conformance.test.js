// The official Durable Streams conformance suite against a running Yoke
// server: DS_BASE_URL (e.g. http://127.0.0.1:8931) and DS_LONG_POLL_MS (the
// server's YOKE_PROTOCOL_LONG_POLL_S in ms). Run by test_conformance.py.
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.DS_BASE_URL
if (!baseUrl) throw new Error("DS_BASE_URL is required")

runConformanceTests({
  baseUrl,
  longPollTimeoutMs: Number(process.env.DS_LONG_POLL_MS ?? 20000),
})
