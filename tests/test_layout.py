"""The package's shape (issue 15 items 1 and 6): one import package, layers
that import only the layers they may, and a wheel with exactly that in it."""
from __future__ import annotations

import ast
import os
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
    # the domain names no backend: it talks to its log through eventstore/backend.py, to
    # what is kept beside it through domain/keeping.py (server/local/, server/scaleout/)
    "server/domain": ("sessionlog_store.server.edge", "sessionlog_store.server.agents",
                      "sessionlog_store.server.run", "sessionlog_store.server.cli", "sessionlog_store.server.scaleout",
                      "sessionlog_store.server.local", "sessionlog_store.server.stores",
                      "sessionlog_store.eventstore.jetstream", "sessionlog_store.eventstore.local"),
    "server/local": ("sessionlog_store.server.edge", "sessionlog_store.server.agents",
                     "sessionlog_store.server.run", "sessionlog_store.server.cli", "sessionlog_store.server.stores",
                     "sessionlog_store.server.scaleout", "sessionlog_store.eventstore.jetstream"),
    "server/scaleout": ("sessionlog_store.server.edge", "sessionlog_store.server.agents",
                        "sessionlog_store.server.run", "sessionlog_store.server.cli", "sessionlog_store.server.stores",
                        "sessionlog_store.server.local"),
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
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            out.append(name)
            # `from package import module` imports that module too
            out += [f"{name}.{a.name}" for a in node.names]
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


# Names of a backend the domain may hold: none (its configuration, with each
# backend's options, is server/config.py's; the domain reads domain/settings.py).
DOMAIN_MAY_NAME: set[tuple[str, str]] = set()


def test_the_domain_names_nothing_of_a_backend_through_the_layers_front():
    """`from sessionlog_store.eventstore import X` in the domain: X is the
    contract's, an event's, a record's, an error's or an id's, never a name
    the package's __init__ takes from local/ or jetstream/."""
    front = {a.asname or a.name: node.module for node in ast.parse((PKG / "eventstore" / "__init__.py").read_text()).body
             if isinstance(node, ast.ImportFrom) for a in node.names}  # name -> the module it comes from
    bad = []
    for path in sorted((PKG / "server" / "domain").rglob("*.py")):
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            if isinstance(node, ast.Import) and any(a.name == "sessionlog_store.eventstore" for a in node.names):
                bad.append(f"{path.relative_to(ROOT)} imports the layer's front whole")
            if isinstance(node, ast.ImportFrom) and module == "sessionlog_store.eventstore":
                for a in node.names:
                    home = front.get(a.name) or ""
                    if home.startswith(("local", "jetstream")) \
                            and (str(path.relative_to(PKG)), a.name) not in DOMAIN_MAY_NAME:
                        bad.append(f"{path.relative_to(ROOT)} names {a.name} ({home})")
    assert not bad, "\n".join(bad)


# The store's collaborators take what they use as arguments or a Protocol;
# only the openers (composition roots) name the store's module.
COMPOSERS = {"sessionlog_store.server.domain.store", "sessionlog_store.server.local.opening",
             "sessionlog_store.server.scaleout.opening"}


def test_no_collaborator_of_the_store_imports_the_stores_module():
    edges = _edges(_package_modules())
    room = ("sessionlog_store.server.domain.", "sessionlog_store.server.local.", "sessionlog_store.server.scaleout.")
    bad = sorted(m for m, to in edges.items() if m.startswith(room) and m not in COMPOSERS
                 and "sessionlog_store.server.domain.store" in to)
    assert not bad, f"these import the store's module (type-only imports count): {bad}"


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
    from .conftest import source_copy
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(source_copy(tmp_path / "src"))], check=True, capture_output=True,
                   timeout=300)
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


# -- no import circles, no reaching into another module's private names -------------

def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _package_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Every import between the package's modules, wherever it is (a function,
    `if TYPE_CHECKING:`): `from a import b` names module a.b when it is one."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = m.split(".") if path.name == "__init__.py" else m.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    name = ".".join([*base, node.module] if node.module else base)
                else:
                    name = node.module or ""
                targets = [f"{name}.{a.name}" if f"{name}.{a.name}" in mods else name for a in node.names]
            edges[m] |= {t for t in targets if t in mods and t != m}
    return edges


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_among_the_packages_modules():
    """Type-only imports count: a module that names another's type for its
    annotations depends on it as much as one that calls it."""
    circles = _circles(_edges(_package_modules()))
    assert not circles, circles


def _private_reaches(mods: dict[str, Path]) -> list[str]:
    """`obj._name` where `_name` is defined by another module of the package
    (and not by this one), and imports of another module's `_name`."""
    trees = {m: ast.parse(p.read_text()) for m, p in mods.items()}
    defined: dict[str, set[str]] = {m: set() for m in mods}
    for m, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined[m].add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                defined[m].add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined[m].add(node.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("_"):
                defined[m].add(node.value)  # __slots__ names
    elsewhere = {name for names in defined.values() for name in names}
    bad = []
    for m, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                if node.attr not in defined[m] and node.attr in elsewhere:
                    bad.append(f"{m}:{node.lineno} reaches into ._{node.attr.lstrip('_')}")
            elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("sessionlog_store")):
                bad += [f"{m}:{node.lineno} imports {a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    return bad


def test_no_module_uses_another_modules_private_names():
    bad = _private_reaches(_package_modules())
    assert not bad, "\n".join(bad)


def test_the_circle_and_private_name_checks_would_catch_one(tmp_path):
    """The checks above can fail: a probe pair importing each other (one for
    its types only) is a circle; a probe reaching into a store's private
    attribute is found."""
    a, b = PKG / "server" / "domain" / "_probe_a.py", PKG / "server" / "domain" / "_probe_b.py"
    a.write_text("from sessionlog_store.server.domain import _probe_b\n")
    b.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                 "    from sessionlog_store.server.domain._probe_a import x\n"
                 "def f(store):\n    return store._row_before\n")
    try:
        mods = _package_modules()
        assert ["sessionlog_store.server.domain._probe_a", "sessionlog_store.server.domain._probe_b"] in \
            _circles(_edges(mods))
        assert any("_probe_b:5 reaches into ._row_before" in x for x in _private_reaches(mods))
    finally:
        a.unlink()
        b.unlink()
