"""`sessionlog serve` on a disk whose writes and syncs wait while the file
named by $SESSIONLOG_HOLD exists (the file-operation seam, fsio.FileOps: a
stalled disk): text is sent to readers before it is written, so a SIGKILL
then loses a tail a reader was sent. For the clients' take-back tests
(tests/test_client.py, clients/js/test/)."""
import os
import runpy
import sys
import time

from sessionlog_store.eventstore.local import fsio

HOLD = os.environ["SESSIONLOG_HOLD"]


def held(op):  # type: ignore[no-untyped-def]
    def wait_then(self, *args):  # type: ignore[no-untyped-def]
        while os.path.exists(HOLD):
            time.sleep(0.01)
        return op(self, *args)
    return wait_then


for name in ("write", "pwrite", "fdatasync", "fsync"):
    setattr(fsio.FileOps, name, held(getattr(fsio.FileOps, name)))
sys.argv = ["sessionlog", *sys.argv[1:]]
runpy.run_module("sessionlog_store", run_name="__main__")
