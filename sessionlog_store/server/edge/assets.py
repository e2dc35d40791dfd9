"""The page's files as the edge serves them: read once (in a worker thread),
kept with their gzip form and an entity tag, answered with validators.

A browser revalidates each file on every load (`Cache-Control: no-cache`)
and gets `304 Not Modified` while its ETag still holds: a reload moves a
few hundred bytes, not the page's 300 KB. A client that accepts gzip gets
the compressed form (its own ETag, `Vary: Accept-Encoding`). The files are
read on first use: a change on disk is served after a restart.
"""
from __future__ import annotations

import gzip
import hashlib
import mimetypes
import os
import re
from dataclasses import dataclass
from typing import Final

import trio

STATIC_DIR: Final = os.path.join(os.path.dirname(__file__), "static")
# What a /static/ name may be: a file in static/, static/vendor/ or KaTeX's
# folders there (its script, style and fonts), never a path out.
STATIC_NAME: Final = re.compile(r"(vendor/(katex/(fonts/)?)?)?[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
mimetypes.add_type("font/woff2", ".woff2")
# Below this many bytes a file is sent as it is (gzip would save little).
GZIP_MIN: Final = 1024
_COMPRESSIBLE: Final = ("text/", "application/javascript", "application/json", "image/svg+xml")


@dataclass(frozen=True)
class Asset:
    body: bytes
    gzipped: bytes | None
    content_type: str
    etag: str  # of the plain body; the gzip form's adds "-gz"


def _load(path: str, name: str) -> Asset:
    with open(path, "rb") as f:
        body = f.read()
    ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
    if ctype.startswith("text/") or ctype.endswith("javascript"):
        ctype += "; charset=utf-8"
    packed = None
    if len(body) >= GZIP_MIN and ctype.startswith(_COMPRESSIBLE):
        packed = gzip.compress(body, compresslevel=9, mtime=0)
    return Asset(body, packed, ctype, hashlib.sha256(body).hexdigest()[:20])


class Assets:
    def __init__(self, folder: str = STATIC_DIR) -> None:
        self.folder = folder
        self._cache: dict[str, Asset | None] = {}

    async def get(self, name: str) -> Asset | None:
        """The file `name` (checked by the caller against STATIC_NAME), or None."""
        if name not in self._cache:
            try:
                self._cache[name] = await trio.to_thread.run_sync(_load, os.path.join(self.folder, name), name)
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                self._cache[name] = None
        return self._cache[name]


def representation(asset: Asset, accept_encoding: str, if_none_match: str) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, headers) for a GET of `asset`: 304 when the client's
    validator matches the representation it would get, else 200."""
    zipped = asset.gzipped is not None and _accepts_gzip(accept_encoding)
    tag = f'"{asset.etag}-gz"' if zipped else f'"{asset.etag}"'
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if asset.gzipped is not None:
        headers["Vary"] = "Accept-Encoding"
    if tag in {t.strip() for t in if_none_match.split(",")} or if_none_match.strip() == "*":
        return 304, b"", headers
    if zipped:
        assert asset.gzipped is not None
        headers["Content-Encoding"] = "gzip"
        return 200, asset.gzipped, headers
    return 200, asset.body, headers


def _accepts_gzip(accept_encoding: str) -> bool:
    for part in accept_encoding.lower().split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip() in ("gzip", "*"):
            q = params.strip()
            return not (q.startswith("q=") and q[2:].strip() in ("0", "0.0", "0.00", "0.000"))
    return False
