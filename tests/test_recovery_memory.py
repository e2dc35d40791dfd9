"""What a start keeps of a large registry (issue 29 item 5, bench/ memory):
the checkpoint's entries are decoded one at a time (an entry that does not
decode replays only its own session in full), and every row shares its
few-valued strings with the others and its id with the registry's key."""
from __future__ import annotations

import json
import os

from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.projections.checkpoint import index_path
from sessionlog_store.projections.recovery import recover_registry
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store


async def test_rows_share_their_strings_and_a_bad_entry_replays_its_session_alone(tmp_path) -> None:  # type: ignore[no-untyped-def]
    root = str(tmp_path / "s")
    async with open_session_store(root, config=StoreConfig(checkpoint_interval=3600)) as store:
        ids = [(await store.create_session(first_message=f"hello {i}"))[0].id for i in range(3)]
        await store.write_checkpoint()
    with open(index_path(root)) as f:
        index = json.load(f)
    index["sessions"][ids[1]]["seq"] = "not a number"
    with open(index_path(root), "w") as f:
        json.dump(index, f)
    registry, _, report = recover_registry(OS_FILES, root, repair=False)
    assert report.checkpoint == "loaded" and (report.full_replays, report.tail_replays) == (1, 2)
    rows = [registry.rows[sid] for sid in ids]
    keys = {k: k for k in registry.rows}
    assert all(r.id is keys[r.id] for r in rows)
    assert rows[0].agent_id is rows[1].agent_id is rows[2].agent_id
    assert rows[0].source is rows[2].source and rows[0].status is rows[1].status and rows[0].owner is rows[2].owner
    assert [r.preview for r in rows] == [f"hello {i}" for i in range(3)]
    assert os.path.exists(index_path(root))


def test_what_a_start_freed_goes_back_to_the_system() -> None:
    """tune_gc (called once a store has recovered) ends with trim_heap: free
    pages the C heap kept between live blocks go back to the system (a
    start's decoding leaves such holes: ~7 MB of RSS at 100,000 sessions).
    In a fresh process: 200 MB of ~1 KB blocks, one in a hundred kept."""
    import subprocess
    import sys
    probe = (
        "from sessionlog_store.server.gc_policy import trim_heap\n"
        "rss = lambda: int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]) // 1024\n"
        "blocks = [bytes(1000 + i % 7) for i in range(200_000)]\n"
        "kept = blocks[::100]\n"
        "del blocks\n"
        "before = rss()\n"
        "trim_heap()\n"
        "print(before, rss(), len(kept))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    before, after, _ = map(int, out.stdout.split())
    assert before - after > 100, (before, after)


async def test_a_recovery_returns_the_damaged_sessions_and_each_rows_mark(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """recover_registry keeps nothing a session beside its row and Mark (a
    result a session held to the end left holes between the rows: issue 29):
    what it returns is the damaged sessions, with what is wrong, and every
    row's Mark is where its log ends; a start registers the logs from them
    (a healthy session appends on, a damaged one is read-only)."""
    from sessionlog_store.eventstore.errors import SessionReadOnly
    from sessionlog_store.eventstore.local.log import log_path
    root = str(tmp_path / "s")
    async with open_session_store(root, config=StoreConfig(checkpoint_interval=3600)) as store:
        ids = [(await store.create_session(first_message=f"hello {i}"))[0].id for i in range(3)]
        for sid in ids:
            await store.append_message(sid, "and more")
    path = log_path(root, ids[1])
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    lines[1] = lines[1].replace(b"hello 1", b"jello 1")  # a flipped record with good ones after it
    with open(path, "wb") as f:
        f.write(b"\n".join(lines))
    registry, damaged, report = recover_registry(OS_FILES, root, use_checkpoint=False, repair=False)
    assert set(damaged) == {ids[1]} and "checksum" in str(damaged[ids[1]]), damaged
    assert set(registry.rows) == set(ids)
    for sid in (ids[0], ids[2]):
        assert registry.marks[sid].end == os.path.getsize(log_path(root, sid)) and registry.marks[sid].seq == 3
    async with open_session_store(root, config=StoreConfig(checkpoint_interval=3600)) as store:
        await store.append_message(ids[2], "after the restart")
        assert store.get_meta(ids[2]).message_count == 3
        import pytest
        with pytest.raises(SessionReadOnly):
            await store.append_message(ids[1], "refused")
    registry, damaged, _ = recover_registry(OS_FILES, root, use_checkpoint=False, repair=False)
    assert set(damaged) == {ids[1]} and registry.rows[ids[2]].message_count == 3


def test_rows_that_sort_as_equals_are_each_taken_out_of_the_order() -> None:
    """The order index finds a row by identity among rows that sort as
    equals (the same updated_at and id, other fields not: a session folder
    copied under another name; review of issue 29's SortedList)."""
    from sessionlog_store.projections.registry import Registry
    from sessionlog_store.projections.session import SessionMeta
    reg = Registry()
    a, b = SessionMeta(id="x", updated_at=1.0, title="a"), SessionMeta(id="x", updated_at=1.0, title="b")
    reg.put(a, "s1")
    reg.put(b, "s2")
    reg.put(SessionMeta(id="y", updated_at=1.0), "s3")
    reg.put(None, "s2")
    assert [m.title for m in reg.select()[0]] == ["a", ""]
    reg.put(None, "s1")
    reg.put(None, "s3")
    assert reg.select() == ([], 0)
