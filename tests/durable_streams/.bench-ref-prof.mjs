import { DurableStreamTestServer } from "@durable-streams/server"
const server = new DurableStreamTestServer({ port: 18822, host: "127.0.0.1", longPollTimeout: 20000, dataDir: "/tmp/prof/refdata" })
await server.start()
console.log("ready")
