# projections/: the read side. Pure folds (no file or socket I/O): session.py
# (meta + message DAG), registry.py (sorted rows), lifecycle.py (the status
# table), maintenance.py (what startup removes). File I/O only in checkpoint.py
# (index.json, snapshot.json) and recovery.py (reading logs at startup).
