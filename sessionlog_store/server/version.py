"""The distribution's name and its installed version (pyproject.toml)."""
from __future__ import annotations

from typing import Final

DISTRIBUTION: Final = "sessionlog-store"  # PyPI's `sessionlog` is another project


def version() -> str:
    """The installed distribution's version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed
    try:
        return installed(DISTRIBUTION)
    except PackageNotFoundError:
        return "(not installed)"
