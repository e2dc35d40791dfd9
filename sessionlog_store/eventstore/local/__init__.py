"""The local engine: a JSONL log per session under a data root, with group
commit and the write-ahead journal.

- fsio.py: the seam under every file operation (FileOps; tests swap in a
  simulated disk), the root's lock, atomic writes.
- log.py: the layout (`sessions/<id>/log.jsonl`), torn-tail repair, reads.
- journal.py: the journal's frames, invariants and the start's write-back.
- commit.py: EventStore and its committer (group commit).
- opening.py: opening a data root's store (lock, format, journal write-back) and closing it.
- batch.py: a batch of lines, a session's log state, the write path's timing.
- logfiles.py: the logs' open descriptors (an LRU), their writes and syncs.
- segments.py: the journal's segment files.
- logwriter.py: journaled batches' lines into their logs; the written position.
- rounds.py: the journal's rounds (the logs synced, covered segments removed).
- storeformat.py: the root's FORMAT stamp, read before anything else.

May import: the contract and shared modules of eventstore/ (backend,
events, record, errors, ids) and each other; never eventstore/jetstream/,
projections/ or server/.
"""
