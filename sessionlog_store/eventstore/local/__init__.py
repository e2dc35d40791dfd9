"""The local engine: a JSONL log per session under a data root, with group
commit and the write-ahead journal.

- fsio.py: the seam under every file operation (FileOps; tests swap in a
  simulated disk), the root's lock, atomic writes.
- log.py: the layout (`sessions/<id>/log.jsonl`), torn-tail repair, reads.
- journal.py: the journal's frames, invariants and the start's write-back.
- commit.py: the committer (group commit), the log writer and the rounds.
- storeformat.py: the root's FORMAT stamp, read before anything else.

May import: the contract and shared modules of eventstore/ (backend,
events, record, errors, ids) and each other; never eventstore/jetstream/,
projections/ or server/.
"""
