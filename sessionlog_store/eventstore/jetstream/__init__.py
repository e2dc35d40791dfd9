"""The JetStream backend: the event log on a replicated NATS JetStream
stream, shared by several workers.

- natsio.py: NATS I/O (an asyncio loop in a thread, bridged to trio), the
  stream's creation, publishes that wait for their answer, reading a subject.
- streamlog.py: JetStreamLog, the backend (a subject per session, the fence,
  rebases, the tail of other workers' records).
- session.py: what the log knows of one session (StreamSession).
- leases.py: in-flight ownership across workers (a KV bucket) and the sweep.
- objects.py: checkpoints and snapshots in the object bucket.
- control.py: stop requests between workers (core NATS).
- imports.py: a session's log put on the stream byte for byte (migrate).
- projects.py: the project log on the stream.

May import: the contract and shared modules of eventstore/ (backend,
events, record, errors, ids) and each other, and nats-py (the `nats` extra,
imported only here); never eventstore/local/, projections/ or server/.
"""
