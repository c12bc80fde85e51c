"""The dashboard tests' fixtures live in tests/browser.py (shared with tests/security/);
here, the stack they share: SQLite and one API process."""

from collections.abc import Callable

import pytest

from service.core.settings import Settings
from tests.browser import shot

__all__ = ["shot"]


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url, api_workers=1)
