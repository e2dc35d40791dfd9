"""A session store as one of several workers on a shared NATS JetStream
stream (docs/SCALEOUT.md): the worker (worker.py: leases on the replies it
streams, the tail of other workers' records, the sweeper of dead workers'
replies, checkpoints and snapshots in the stream's object bucket) and how a
worker's store opens (opening.py).

May import: server/domain/ (the store it serves, and the SharedLog
contract it keeps: domain/sharing.py), projections/, eventstore/ (the
JetStream backend). The domain never imports it; server/stores.py picks it
for a config that names a backend. Never imports server/edge/, run.py or
cli.py.
"""
