"""How `sessionlog` logs: to stderr, every record naming its logger
(`sessionlog.store`, `sessionlog.ws`, ...), as text or (`--log-format json`)
one JSON object a line, with any `remote` (a client's address) as a field.
The access token is never logged (it is printed on stdout at start only)."""
from __future__ import annotations

import logging
import sys
from typing import Final, Literal

import msgspec

LogFormat = Literal["text", "json"]
LOG_FORMATS: Final = ("text", "json")
_TEXT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """One line a record: ts (Unix seconds), level, logger, message, the
    extra fields this project passes (`remote`), and the traceback if any."""

    _encode = msgspec.json.Encoder().encode

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {"ts": round(record.created, 3), "level": record.levelname,
                                  "logger": record.name, "message": record.getMessage()}
        remote = getattr(record, "remote", None)
        if remote is not None:
            out["remote"] = remote
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return self._encode(out).decode()


class _RemoteText(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        remote = getattr(record, "remote", None)
        return text if remote is None else f"{text} (remote {remote})"


def setup_logging(level: str = "INFO", fmt: LogFormat = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else _RemoteText(_TEXT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
