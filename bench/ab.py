"""A same-run A/B of the throttle path against an older commit (issue 29):
the same harness (this checkout's `bench/throttle.py`) runs against this
checkout's store and against a git worktree of `REV`, each run in a fresh
subprocess, the two sides alternated run by run so that the machine's drift
(2-4x between days here) falls on both alike.

    python -m bench throttle --ab c976bfa [--streams 10000] [--runs 3] [--seconds 8]

Each side's process imports `bench` from a shim folder (a link to this
checkout's bench/) and `sessionlog_store` from its tree (PYTHONPATH first:
the editable install's finder comes after the path)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def worktree(rev: str) -> str:
    """A detached worktree of `rev` (made once, kept in the temp folder)."""
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", f"{rev}^{{commit}}"], check=True,
                         capture_output=True, text=True).stdout.strip()
    path = os.path.join(tempfile.gettempdir(), f"sessionlog-ab-{sha[:12]}")
    if not os.path.isdir(os.path.join(path, "sessionlog_store")):
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "--force", path, sha], check=True,
                       capture_output=True)
    return path


def shim() -> str:
    """A folder whose `bench` is this checkout's."""
    path = os.path.join(tempfile.gettempdir(), f"sessionlog-ab-shim-{os.getpid()}")
    os.makedirs(path, exist_ok=True)
    link = os.path.join(path, "bench")
    if not os.path.islink(link):
        os.symlink(HERE, link)
    return path


def one_run(tree: str, n: int, seconds: float, mode: str) -> dict[str, Any]:
    """One throttle run of `n` streams against the store in `tree`, in a
    process of its own; its result row."""
    env = {**os.environ, "PYTHONPATH": tree + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "bench", "throttle", "--one", str(n), "--seconds", str(seconds),
                          "--modes", mode], cwd=shim(), env=env, check=True, capture_output=True, text=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    if os.path.realpath(row.pop("store")) != os.path.realpath(os.path.join(tree, "sessionlog_store")):
        raise RuntimeError(f"the run imported the wrong store: not {tree}")
    return row


def compare(rev: str, counts: list[int], runs: int, seconds: float, mode: str) -> tuple[list[dict[str, Any]], float]:
    """Rows for `rev` and this checkout (medians of `runs` alternated runs),
    and the ratio of CPU per record this/rev at the largest count."""
    base = worktree(rev)
    rows, ratio = [], float("nan")
    for n in counts:
        sides: dict[str, list[dict[str, Any]]] = {rev: [], "this": []}
        for r in range(runs):
            order = [(rev, base), ("this", ROOT)] if r % 2 == 0 else [("this", ROOT), (rev, base)]
            for name, tree in order:
                sides[name].append(one_run(tree, n, seconds, mode))
                print(f"  {n} streams, run {r + 1}, {name}: {sides[name][-1]['cpu us/rec']:.2f} us/rec, "
                      f"{sides[name][-1]['records/s']:,.0f} records/s", flush=True)
        med = {name: sorted(rs, key=lambda x: x["cpu us/rec"])[len(rs) // 2] for name, rs in sides.items()}
        for name in (rev, "this"):
            rows.append({"side": name, **med[name]})
        ratio = med["this"]["cpu us/rec"] / med[rev]["cpu us/rec"]
    return rows, ratio
