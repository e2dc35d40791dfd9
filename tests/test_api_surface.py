"""The library's surface (issue 15 item 5): what a user imports from the
package's top level, and one error hierarchy to catch."""
from __future__ import annotations

import pytest

import sessionlog_store
from sessionlog_store import (Agent, EventStoreError, InflightMessage, NotFound, ServiceError, SessionlogError,
                              StoreBroken, Subscription, open_session_store)


def test_the_top_level_exports_the_pieces_a_user_plugs_together():
    for name in ("open_session_store", "SessionStore", "StoreConfig", "Agent", "DemoAgent", "InflightMessage",
                 "Subscription", "MsgUpdate", "SessionlogError", "ServiceError", "EventStoreError", "StoreBroken"):
        assert hasattr(sessionlog_store, name), name
        assert name in sessionlog_store.__all__
    assert Agent and InflightMessage and Subscription


async def test_one_root_catches_every_error_the_store_raises(root):
    assert issubclass(ServiceError, SessionlogError) and issubclass(EventStoreError, SessionlogError)
    assert issubclass(StoreBroken, SessionlogError)
    async with open_session_store(root) as store:
        with pytest.raises(SessionlogError) as caught:
            await store.load_session("nosuchsession")
        assert isinstance(caught.value, NotFound)
        with pytest.raises(SessionlogError):
            await store.load_session("../escape")
