"""The data root's format version: `<root>/FORMAT`, checked before anything
else of the root is read.

A build reads the formats up to its own (`FORMAT_VERSION`). A root stamped
with a newer one was written by a newer build whose records this one may
not know: it is refused with one line (`NewerFormat`), never read as
corrupt, never quarantined, never repaired. A root without the file was
written before the stamp existed (sessionlog-store 0.1 and 0.2 wrote the
same layout as format 1) and is read as format 1; the first process that
writes the root stamps it. Upgrading from one format to the next is this
module's job: `check_format` returns the version found, and the writer
upgrades in place before it stamps (from 1 to 2 nothing is rewritten: 2
only adds a record type).

The file is one line of text so an operator can read it with `cat`:
`sessionlog-store format 2`.
"""
from __future__ import annotations

import os
from typing import Final

from ..errors import NewerFormat, UnreadableFormat
from .fsio import FileOps, atomic_write

# 2 (issue 29): progress records with token counts are written `q` (the
# counts a pair); format 1 builds would quarantine them. A format 1 root
# needs no change: the first writer stamps it 2.
FORMAT_VERSION: Final = 2
FORMAT_FILE: Final = "FORMAT"
_PREFIX: Final = b"sessionlog-store format "
UNSTAMPED: Final = 1  # what a root without the file holds (written by 0.1 or 0.2)


def format_line(version: int = FORMAT_VERSION) -> bytes:
    return _PREFIX + str(version).encode() + b"\n"


def check_format(fs: FileOps, root: str) -> int:
    """The root's format version; raises NewerFormat for one this build cannot
    read and UnreadableFormat for a file that names none. Reads one small
    file, changes nothing."""
    path = os.path.join(root, FORMAT_FILE)
    if not fs.exists(path):
        return UNSTAMPED
    data = fs.read_bytes(path, 0, 256)
    if not data.startswith(_PREFIX) or not data.endswith(b"\n") or not data[len(_PREFIX):-1].isdigit():
        raise UnreadableFormat(root, data[:64])
    found = int(data[len(_PREFIX):-1])
    if found > FORMAT_VERSION:
        raise NewerFormat(root, found, FORMAT_VERSION)
    return found


def stamp_format(fs: FileOps, root: str) -> None:
    """Check the root's format and write this build's stamp if the root has
    none yet (a new root, or one written before the stamp). Called by every
    process that writes the root, under the root's lock."""
    if check_format(fs, root) == FORMAT_VERSION and fs.exists(os.path.join(root, FORMAT_FILE)):
        return
    atomic_write(fs, os.path.join(root, FORMAT_FILE), format_line())
