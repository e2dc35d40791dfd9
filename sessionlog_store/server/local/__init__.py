"""server/local/: a session store on the local engine (eventstore/local/): how
it opens (opening.py: recovery, the abort sweep, maintenance: startup.py)
and what it keeps beside its logs (keeper.py: reads of a session's log file,
index.json and the snapshots in caches.py, the check of the log prefixes a
start skipped). It may import the domain, the projections and the local
engine; the domain never imports it (tests/test_layout.py)."""
