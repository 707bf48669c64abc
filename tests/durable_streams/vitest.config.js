import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["*.test.js"],
    testTimeout: 30000,
    hookTimeout: 30000,
    // One file; its tests run in order against one server.
    fileParallelism: false,
  },
})
