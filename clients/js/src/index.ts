// sessionlog's TypeScript client (README.md): over HTTP (Client) and over the
// WebSocket (SocketClient), exact resume built in.
export { ApiError, ConnectionLost } from "./errors.js"
export { Client, type ClientOptions, type ListQuery } from "./http.js"
export { Reply, type ReplyOptions, type Ended } from "./producer.js"
export { readText, type Chunk, type ReadOptions } from "./reading.js"
export { SocketClient, type SocketOptions, type MessageSubscription, PROTOCOL } from "./socket.js"
export * from "./types.js"
