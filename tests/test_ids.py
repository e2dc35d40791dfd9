"""Session ids are refused before any filesystem call."""
from __future__ import annotations

import os

import pytest

from sessionlog_store.eventstore.errors import InvalidSessionId
from sessionlog_store.eventstore.ids import new_session_id, validate_session_id
from sessionlog_store.eventstore.local.log import log_path, session_dir

BAD = ["", ".", "..", "../x", "../../etc/passwd", "/abs", "/", "a/b", "a\\b", "a\x00b", "x" * 65,
       ".hidden", "-flag", "_x", "a.b", "a b", "é", "a\n", None, 5, b"abc", "\u202e"]


@pytest.mark.parametrize("bad", BAD)
def test_bad_ids_are_refused_before_any_path_is_built(bad, monkeypatch):
    calls = []
    for name in ("open", "stat", "mkdir", "listdir", "lstat"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, _r=real, _n=name, **k: (calls.append(_n), _r(*a, **k))[1])
    with pytest.raises(InvalidSessionId):
        validate_session_id(bad)
    with pytest.raises(InvalidSessionId):
        session_dir("/tmp/root", bad)
    with pytest.raises(InvalidSessionId):
        log_path("/tmp/root", bad)
    assert calls == []


@pytest.mark.parametrize("good", ["a", "A1", "abc-DEF_123", "x" * 64, "0"])
def test_good_ids_pass(good):
    assert validate_session_id(good) == good


def test_generated_ids_are_valid_and_distinct():
    ids = {new_session_id() for _ in range(1000)}
    assert len(ids) == 1000
    for sid in ids:
        validate_session_id(sid)
