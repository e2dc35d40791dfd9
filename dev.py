#!/usr/bin/env python3
"""Set up .venv (once, or when pyproject.toml changes) and run a job in it.

    python3 dev.py serve [sessionlog serve options]   the server and its web page
    python3 dev.py test [pytest options]               the test suite (in 3 processes; -n 0 for one)
    python3 dev.py torture                             the reliability suite's long mode
    python3 dev.py screenshots                         regenerate docs/screenshots/ (the browser tests)
    python3 dev.py page                                rebuild the page's bundle (needs Node 20+ and npm)

Needs only Python 3.11+; everything else is installed into ./.venv.
"""
from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".installed"
# The page's source (on the TypeScript client of clients/js/) and its bundle,
# committed so that the server (and a wheel) needs no Node: a test checks that
# the committed bundle is this source's.
PAGE_SOURCE = ROOT / "clients" / "page" / "app.js"
PAGE_BUNDLE = ROOT / "sessionlog_store" / "server" / "edge" / "static" / "app.js"
JS_CLIENT = ROOT / "clients" / "js"


def ensure_venv() -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"sessionlog needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    pyproject = ROOT / "pyproject.toml"
    if STAMP.exists() and STAMP.stat().st_mtime >= pyproject.stat().st_mtime:
        return
    if not (BIN / "python").exists():
        print("creating .venv ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("installing sessionlog and its dependencies into .venv ...", flush=True)
    subprocess.run([str(BIN / "python"), "-m", "pip", "install", "-q", "-e", f"{ROOT}[test]"], check=True)
    STAMP.touch()


def page_bundle() -> bytes:
    """The page's bundle as esbuild makes it from clients/page/app.js (with
    clients/js/'s packages installed)."""
    banner = ("// Built from clients/page/app.js and the TypeScript client (clients/js/) by esbuild:"
              " `python3 dev.py page`. Do not edit.")
    run = subprocess.run([str(JS_CLIENT / "node_modules" / ".bin" / "esbuild"), str(PAGE_SOURCE.relative_to(ROOT)),
                          "--bundle", "--format=iife", "--target=es2020", "--charset=utf8", "--legal-comments=inline",
                          f"--banner:js={banner}"], cwd=ROOT, check=True, capture_output=True, timeout=120)
    return run.stdout


def build_page() -> None:
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=JS_CLIENT, check=True)
    PAGE_BUNDLE.write_bytes(page_bundle())
    print(f"wrote {PAGE_BUNDLE.relative_to(ROOT)}")


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in {"serve", "test", "torture", "screenshots", "page"}:
        sys.exit(__doc__)
    if sys.argv[1] == "page":
        build_page()
        return
    ensure_venv()
    job, rest = sys.argv[1], sys.argv[2:]
    if job == "serve":
        cmd = [str(BIN / "sessionlog"), "serve", *rest]
    elif job == "torture":
        os.environ.setdefault("SESSIONLOG_TORTURE_KILLS", "200")
        os.environ.setdefault("SESSIONLOG_POWERLOSS_IMAGES", "20000")
        cmd = [str(BIN / "python"), "-m", "pytest", "-s", "tests/test_torture.py", "tests/test_powerloss.py",
               "tests/test_faults.py", "tests/test_fuzz.py", "tests/test_hostile.py", "tests/test_damage.py",
               "tests/test_review25_findings.py::test_f9_a_paused_stream_leader_does_not_break_the_store",
               "tests/test_review25_findings.py::test_f2_losing_the_lease_buckets_leader_does_not_end_live_replies",
               *rest]
    elif job == "screenshots":
        os.environ["SESSIONLOG_SCREENSHOTS"] = str(ROOT / "docs" / "screenshots")
        cmd = [str(BIN / "python"), "-m", "pytest", "-q", "tests/test_browser.py", "tests/test_page_daily.py", *rest]
    else:
        # Three test processes (pytest-xdist) on the two cores unless told
        # otherwise (-n 0: one): a fifth of the suite's time is tests waiting
        # out a pause, a lease or a TTL on an idle core (two processes left a
        # quarter of the CPU idle: 583 s; three: 464 s, the same day).
        # (worksteal: a process that is done takes tests queued for the other,
        # so the long ones do not end the run on one process alone)
        workers = [] if any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in rest) \
            else ["-n", "3", "--dist", "worksteal"]
        # The slowest tests, named at the end of every run (CI's too): the
        # suite is kept well under 10 minutes.
        durations = [] if any(a.startswith("--durations") for a in rest) else ["--durations=25"]
        cmd = [str(BIN / "python"), "-m", "pytest", *workers, *durations, *rest]
    os.chdir(ROOT)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
