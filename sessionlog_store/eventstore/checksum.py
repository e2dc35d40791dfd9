"""The CRC-32 every record and journal batch carries: zlib's (the same
polynomial and values), computed by ISA-L when it is installed.

ISA-L's CRC uses the CPU's carry-less multiply: on a record's ~220 bytes it
costs 0.03 us against zlib's 0.17 here (issue 29, replay: the CRCs were a
fifth of a full replay). The values are identical, so logs written with one
are read with the other; zlib's is the fallback where ISA-L has no wheel (the
dependency is only asked for on the machines it has wheels for).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Final

try:
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # (no wheel for this platform: zlib's own, the same values)
    from zlib import crc32 as _crc32

crc32: Final[Callable[[bytes | bytearray | memoryview], int]] = _crc32
