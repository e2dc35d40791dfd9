"""Session naming: the one implementation (spec "Naming").

Phase 1 (first assistant reply): the title is cut from the first user
message. Phase 2 (1st, 6th, 16th, 40th reply): a TitleGenerator over the most
recent 20 messages, run as a background task of the store, with race checks.
The built-in generator is offline and deterministic; plug a real LLM in by
passing any object with `async def generate(messages) -> str`.
"""
from __future__ import annotations

import re
from collections import Counter
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from sessionlog_store.projections.session import MessageSnapshot, SessionState

from sessionlog_store.server.domain.errors import NotFound

if TYPE_CHECKING:
    from sessionlog_store.projections.registry import Registry

log = logging.getLogger("sessionlog.titles")

RETITLE_AT_TURNS: Final = (1, 6, 16, 40)
TITLE_LEN: Final = 50
RECENT_FOR_TITLE: Final = 20

_MARKERS: Final = re.compile(
    r"\[attachment:[^\]]*\]|<attachment-preview>.*?</attachment-preview>|<attachment-preview[^>]*/?>"
    r"|<file\b[^>]*>.*?</file>|<file\b[^>]*/?>", re.S)


def title_from_text(text: str) -> str:
    """Strip attachment/file markers, take the first non-empty line, cut to 50
    characters with an ellipsis when it overflows."""
    cleaned = _MARKERS.sub("", text or "")
    first = next((ln.strip() for ln in cleaned.splitlines() if ln.strip()), "")
    return first[:TITLE_LEN] + "…" if len(first) > TITLE_LEN else first


class TitleGenerator(Protocol):
    async def generate(self, messages: Sequence[MessageSnapshot]) -> str: ...


_STOP: Final = frozenset("""a an the and or but if then so of to in on at for with from by as is are was were be
been it its this that these those i you he she we they me my your our their what which who how why when where
can could would should will shall do does did not no yes please just about into over than too very also
there here have has had hi hello hey thanks thank let lets get make some any all more most""".split())


class KeywordTitler:
    """The offline default: the most frequent meaningful words of the recent
    user messages, in order of first appearance, at most five."""

    async def generate(self, messages: Sequence[MessageSnapshot]) -> str:
        text = " ".join(m.content for m in messages if m.role == "user")
        words = [w for w in re.findall(r"[A-Za-z][A-Za-z0-9'-]{2,}", _MARKERS.sub("", text))
                 if w.lower() not in _STOP]
        if not words:
            return title_from_text(text) or "New chat"
        counts = Counter(w.lower() for w in words)
        top = {w for w, _ in counts.most_common(5)}
        seen: list[str] = []
        for w in words:
            if w.lower() in top and w.lower() not in (s.lower() for s in seen):
                seen.append(w)
        return " ".join(s[:1].upper() + s[1:] for s in seen)[:TITLE_LEN]


def recent_messages(state: SessionState) -> list[MessageSnapshot]:
    """The conversation the title generator sees: the last 20 messages of the branch."""
    return [m for m in state.branch() if m.caller is None][-RECENT_FOR_TITLE:]


class Titling(Protocol):
    """What auto-naming does its work through: the store."""
    titler: TitleGenerator
    registry: Registry

    async def load_session(self, session_id: str) -> SessionState: ...
    async def update_session(self, session_id: str, **fields: Any) -> dict[str, Any]: ...


async def maybe_auto_title(store: Titling, session_id: str) -> None:
    """spec "Auto-naming": run after a finished assistant reply. Phase 1 at the
    first reply; phase 2 (the generator) at the 1st, 6th, 16th and 40th, in the
    background, giving up when the user renamed meanwhile, or (the first time)
    when the phase-1 title was changed meanwhile."""
    try:
        state = await store.load_session(session_id)
        meta = state.meta
        if meta is None or meta.user_titled:
            return
        replies = sum(1 for m in state.messages.values()
                      if m.role == "assistant" and m.caller is None and m.status == "done")
        if replies not in RETITLE_AT_TURNS:
            return
        gen = meta.title_gen_count
        phase1 = None
        if gen == 0:
            first_user = next((m for m in state.branch() if m.role == "user"), None)
            phase1 = title_from_text(first_user.content if first_user else "") or meta.title
            await store.update_session(session_id, title=phase1, _auto_titled=True, _title_gen_count=1)
            gen = 1
        elif gen >= 2 and replies <= RETITLE_AT_TURNS[min(gen - 2, len(RETITLE_AT_TURNS) - 1)]:
            return  # this threshold's title was generated already
        title = await store.titler.generate(recent_messages(state))
        meta = store.registry.get(session_id)
        if meta is None or meta.user_titled or not title:
            return  # deleted, or the user renamed meanwhile: give up
        if phase1 is not None and meta.title != phase1:
            return  # the phase-1 title was changed meanwhile: give up
        await store.update_session(session_id, title=title[:80], _auto_titled=True, _title_gen_count=gen + 1)
    except NotFound:
        return  # deleted meanwhile
    except Exception:  # a title is never worth a crash; the next threshold tries again
        log.exception("auto-title of %s failed", session_id)
