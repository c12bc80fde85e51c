from __future__ import annotations

from collections.abc import Callable

import pytest

from service.core.settings import Settings


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    """Short timeouts, so faults are noticed within seconds."""
    return make_settings(sqlite_url, heartbeat_timeout_s=3.0, dispatch_timeout_s=3.0, cancel_grace_s=10.0)
