"""Shared by the harnesses: percentiles, medians over runs, a table printer,
and the JSON result file (bench/results/<name>.json)."""
from __future__ import annotations

import json
import os
import resource
import statistics
import time
from collections.abc import Sequence
from typing import Any


def pct(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.4f}"
    return str(v)


def table(title: str, rows: list[dict[str, Any]]) -> str:
    if not rows:
        return f"{title}\n(no rows)\n"
    cols = list(rows[0])
    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    width = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = [title, "  ".join(c.ljust(w) for c, w in zip(cols, width)),
             "  ".join("-" * w for w in width)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, width)) for row in cells]
    return "\n".join(lines) + "\n"


def save(name: str, result: dict[str, Any]) -> str:
    folder = os.path.join(os.path.dirname(__file__), "results")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.json")
    result = {"name": name, "at": time.strftime("%Y-%m-%dT%H:%M:%S"), **result}
    with open(path, "w") as f:
        json.dump(result, f, indent=2, default=str)
    return path


def verdict(label: str, value: float, target: float, *, higher_is_better: bool = True) -> str:
    ok = value >= target if higher_is_better else value <= target
    op = ">=" if higher_is_better else "<="
    return f"  {'MET ' if ok else 'MISS'}  {label}: {fmt(value)} (target {op} {fmt(target)})"
