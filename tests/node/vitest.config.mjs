// The conformance files call the suite's runConformanceTests() export: its
// own CLI finds no tests under node_modules (vitest's default exclude).
export default { test: { include: ["*.test.mjs"], testTimeout: 30000, hookTimeout: 30000 } }
