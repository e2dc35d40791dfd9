"""python -m bench <name> [--quick] ...: run one harness.

  commit     durable appends: group commit vs fsync per record, per sync mode
  throttle   the 250 ms throttle path at 1k/5k/10k streams, with its baselines
  bytes      bytes written for one 20 KB reply vs the snapshot design
  recovery   full replay vs raw decode, checkpoint startup, a long session's load
  fanout     WebSocket push latency to many subscribers, with a stalled client
  memory     RSS of a server holding a registry of 100,000 sessions
  abuse      one user flooding frames vs other users' round trips and pushes
  auth       refused handshakes take the same time whatever was wrong
  scaleout   the JetStream backend next to the local one, and a leader killed mid-run
  leases     the lease bucket after many replies: a sweep's listing, released by purge vs kv.delete
  conflicts  two JetStream workers' appends to one session: what the rebase costs the other sessions
  nats_publish  what a message costs on the scale-out path: atomic batches vs one by one, with the tail
  http_stack the HTTP side: an ASGI stack on trio vs the h11 edge extended (static, SSE fan-out)
  http_producers  external producers over HTTP vs an in-process agent, SSE readers, a reader's resume
  client_reads  the Python client's reader of a busy reply vs durable-streams' SSE and long-poll readers
  page       the web page streaming a 50 KB reply while the user types, beside an older page
  search     full-text search: 100,000 messages indexed, query p50/p99, its fold beside the store's per record
"""
from __future__ import annotations

import importlib
import sys

NAMES = ("commit", "throttle", "bytes", "recovery", "fanout", "memory", "abuse", "auth", "scaleout", "leases", "conflicts", "nats_publish", "http_stack", "http_producers", "client_reads", "page", "search")


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in NAMES:
        print(__doc__)
        return 2
    mod = importlib.import_module(f"bench.{sys.argv[1]}")
    return int(mod.main(sys.argv[2:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
