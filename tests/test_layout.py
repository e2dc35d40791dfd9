"""The package's shape (issue 15 items 1 and 6): one import package, layers
that import only the layers they may, and a wheel with exactly that in it."""
from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "sessionlog_store"

# layer -> the sessionlog_store modules it must never import (its docstring says so)
FORBIDDEN = {
    "eventstore": ("sessionlog_store.projections", "sessionlog_store.server"),
    # each backend in its own room: neither imports the other
    "eventstore/local": ("sessionlog_store.eventstore.jetstream", "nats"),
    "eventstore/jetstream": ("sessionlog_store.eventstore.local",),
    "projections": ("sessionlog_store.server",),
    "server/domain": ("sessionlog_store.server.edge", "sessionlog_store.server.agents",
                      "sessionlog_store.server.run", "sessionlog_store.server.cli"),
    "server/agents": ("sessionlog_store.server.edge", "sessionlog_store.server.run", "sessionlog_store.server.cli"),
    "server/edge": ("sessionlog_store.server.run", "sessionlog_store.server.cli",
                    "sessionlog_store.server.agents.demo", "sessionlog_store.server.agents.openai_compat"),
}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                out.append(".".join([*base, node.module] if node.module else base))
            else:
                out.append(node.module or "")
    return out


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_each_layer_imports_only_what_it_may(layer):
    bad = []
    for path in sorted((PKG / layer).rglob("*.py")):
        for name in _imports(path):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[layer]):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, "\n".join(bad)
    init = PKG / layer / "__init__.py"
    assert ast.get_docstring(ast.parse(init.read_text())) or init.read_text().startswith("#"), \
        f"{init} says what the layer is and may import"


def test_the_contract_and_shared_modules_import_no_backend():
    """eventstore/'s own modules (the contract, events, records, errors, ids)
    are what every backend shares: they import neither backend. (The
    package's __init__ names the local engine's store as the library's
    default, and is not one of them.)"""
    bad = [f"{path.relative_to(ROOT)} imports {name}" for path in sorted((PKG / "eventstore").glob("*.py"))
           if path.name != "__init__.py" for name in _imports(path)
           if name.startswith(("sessionlog_store.eventstore.local", "sessionlog_store.eventstore.jetstream"))]
    assert not bad, "\n".join(bad)


def test_the_layer_check_would_catch_a_forbidden_import(tmp_path):
    """The check above can fail: a domain module importing the edge is found."""
    fake = PKG / "server" / "domain" / "_layout_probe.py"
    fake.write_text("from sessionlog_store.server.edge import protocol\n")
    try:
        with pytest.raises(AssertionError, match="_layout_probe.py imports sessionlog_store.server.edge"):
            test_each_layer_imports_only_what_it_may("server/domain")
    finally:
        fake.unlink()


def test_no_module_of_the_package_is_over_700_lines():
    long = [f"{p.relative_to(ROOT)}: {n}" for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 700]
    assert not long, long


@pytest.mark.slow
def test_the_wheel_holds_one_package_and_runs_from_a_clean_directory(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("sessionlog_store-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    version = wheel.name.split("-")[1]
    assert top == {"sessionlog_store", f"sessionlog_store-{version}.dist-info"}, top
    for needed in ("sessionlog_store/py.typed", "sessionlog_store/__main__.py",
                   "sessionlog_store/server/edge/static/index.html", "sessionlog_store/server/edge/static/app.js",
                   "sessionlog_store/server/edge/static/vendor/purify.min.js",
                   "sessionlog_store/server/edge/static/vendor/LICENSE.dompurify",
                   "sessionlog_store/server/domain/store.py", "sessionlog_store/eventstore/local/journal.py"):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("bench/", "tests/"))]
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Name: sessionlog-store" in meta and "License-Expression: MIT" in meta and "Project-URL" not in meta
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "sessionlog = sessionlog_store.server.cli:main" in entry

    # Installed alone into a directory and run from elsewhere: the copy that
    # runs is the wheel's (not this checkout), with its page.
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("SESSIONLOG_ROOT", None)
    where = subprocess.run([sys.executable, "-c", "import sessionlog_store; print(sessionlog_store.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(site)), where
    said = subprocess.run([sys.executable, "-m", "sessionlog_store", "--version"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, check=True).stdout
    assert f"sessionlog-store distribution) {version}" in said, said
    proc = subprocess.Popen([sys.executable, "-m", "sessionlog_store", "serve", "--root", str(tmp_path / "data"),
                             "--port", "0"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    try:
        url = ""
        for line in proc.stdout:  # type: ignore[union-attr]
            if "serving http" in line:
                url = line.split("serving ", 1)[1].split()[0].split("?")[0]
                break
        assert url, "serve printed its URL"
        for path in ("", "static/app.js"):
            with urllib.request.urlopen(url + path, timeout=10) as r:
                assert r.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
