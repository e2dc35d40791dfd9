"""The data root's format stamp (eventstore/local/storeformat.py): a root written by a
newer build is refused with one line and exit 3 by every command, and nothing
of it is read or changed; a root from before the stamp is read and stamped."""
from __future__ import annotations

import os

import pytest

from sessionlog_store.eventstore.local.storeformat import FORMAT_FILE, FORMAT_VERSION, format_line

from .conftest import run_cli
from .test_cli import run_cli_populate


def tree(root: str) -> dict[str, bytes]:
    """Every file under root (but the lock) with its bytes."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f != ".lock":
                p = os.path.join(d, f)
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, root)] = fh.read()
    return out


@pytest.fixture
def store(root: str) -> str:
    r = run_cli_populate(root, sessions=4, messages=3)
    assert r.returncode == 0, r.stderr
    return root


def test_a_written_root_is_stamped(store):
    with open(os.path.join(store, FORMAT_FILE), "rb") as f:
        assert f.read() == format_line() == f"sessionlog-store format {FORMAT_VERSION}\n".encode()


def test_a_root_from_before_the_stamp_is_read_and_stamped_by_its_first_writer(store):
    os.unlink(os.path.join(store, FORMAT_FILE))
    r = run_cli("verify", "--root", store)  # a reader reads it as format 1 and writes nothing
    assert r.returncode == 0, r.stdout + r.stderr
    assert not os.path.exists(os.path.join(store, FORMAT_FILE))
    r = run_cli("users", "list", "--root", store)  # opens the store as a start does
    assert r.returncode == 0, r.stdout + r.stderr
    with open(os.path.join(store, FORMAT_FILE), "rb") as f:
        assert f.read() == format_line()


@pytest.mark.parametrize("stamp, says", [
    (f"sessionlog-store format {FORMAT_VERSION + 1}\n", "written by a newer sessionlog-store"),
    ("hello\n", "names no format"),
])
def test_a_newer_or_unreadable_format_is_refused_by_every_command_and_nothing_changes(store, stamp, says):
    with open(os.path.join(store, FORMAT_FILE), "w") as f:
        f.write(stamp)
    # what a newer build might write: a record this build cannot parse. Read as
    # this build's, it would be a torn tail (cut off) or damage (quarantined).
    sid = sorted(os.listdir(os.path.join(store, "sessions")))[0]
    with open(os.path.join(store, "sessions", sid, "log.jsonl"), "ab") as f:
        f.write(b'{"v":2,"kind":"something new"}\n')
    before = tree(store)
    for args in (["serve", "--root", store, "--port", "0"], ["verify", "--root", store],
                 ["rebuild", "--root", store], ["inspect", "--root", store, sid],
                 ["repair", "--root", store, sid], ["users", "list", "--root", store]):
        r = run_cli(*args)
        assert r.returncode == 3, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and "nothing was changed" in lines[0], (args, r.stderr)
        assert "corrupt" not in r.stderr and "Traceback" not in r.stderr
        assert tree(store) == before, args
