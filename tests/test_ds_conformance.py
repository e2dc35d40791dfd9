"""The Durable Streams protocol's own server conformance suite (npm
`@durable-streams/server-conformance-tests`, written by nobody here) against
a live `sessionlog serve --streams-anonymous`, and in the same run against
the protocol's Node reference server (`@durable-streams/server`): every test
the reference passes passes here, and every test not passed here is listed
with its reason in docs/HTTP.md (issue 27 item 2)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from .conftest import ROOT
from .nodejs import node_tests
from .processes import ServeProcess, free_port

DOC = ROOT / "docs" / "HTTP.md"


def run_suite(node: Path, out: Path, env: dict[str, str]) -> dict[str, str]:
    """{test's full name: passed | failed | skipped} of one run of the suite."""
    npx = shutil.which("npx")
    assert npx is not None
    proc = subprocess.run([npx, "vitest", "run", "conformance.test.mjs", "--reporter=json", f"--outputFile={out}"],
                          cwd=node, env={**os.environ, **env}, capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    return {t["fullName"]: t["status"] for f in report["testResults"] for t in f["assertionResults"]}


def documented_exceptions() -> set[str]:
    """The tests docs/HTTP.md says this server does not pass (its
    "Conformance" section: a list of `full name`: reason)."""
    text = DOC.read_text()
    section = text.split("### Conformance", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return set(re.findall(r"^- `([^`]+)`", section, re.M))


def test_the_conformance_suite_passes_what_the_reference_server_passes(tmp_path):
    node = node_tests()
    server = ServeProcess(str(tmp_path / "data"), free_port(), extra=("--streams-anonymous", "--log-level", "WARNING"),
                          log=tmp_path / "serve.log")
    server.start()
    try:
        ours = run_suite(node, tmp_path / "ours.json", {"DS_BASE_URL": f"http://127.0.0.1:{server.port}"})
    finally:
        server.stop()
    reference = run_suite(node, tmp_path / "reference.json", {"DS_REFERENCE": "1"})
    assert len(reference) > 300 and set(ours) == set(reference), "the two runs ran different tests"
    passed = {n for n, s in ours.items() if s == "passed"}
    missing = {n for n, s in reference.items() if s == "passed"} - passed
    assert not missing, f"the reference passes these, sessionlog does not: {sorted(missing)}"
    not_passed = {n for n, s in ours.items() if s == "failed"}
    assert not_passed == documented_exceptions(), (
        "docs/HTTP.md's Conformance section must list exactly the tests not passed: "
        f"not passed {sorted(not_passed)}, listed {sorted(documented_exceptions())}")
    skipped = {n for n, s in ours.items() if s == "skipped"}
    assert skipped == {n for n, s in reference.items() if s == "skipped"}
    assert len(passed) >= len(ours) - len(skipped) - len(not_passed)
    assert "Server error" not in (tmp_path / "serve.log").read_text()
