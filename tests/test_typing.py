"""mypy over the packages (issue 15 item 1): 0 errors, in the suite, so CI
runs it with the README's test command. Configuration: pyproject.toml."""
from __future__ import annotations

import subprocess
import sys

from .conftest import ROOT


def test_mypy_finds_no_errors():
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
