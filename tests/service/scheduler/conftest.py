"""The live pass's tests' context and callers (a real database and Redis)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from service.core.context import Context
from service.core.settings import Settings
from service.lab.auth import Caller, ensure_user
from towerq.contract.spec import Priority


@pytest.fixture
def ctx(settings: Settings) -> Iterator[Context]:
    context = Context.open(settings)
    yield context
    context.close()


@pytest.fixture
def caller(ctx: Context) -> Callable[[str], Caller]:
    def make(name: str) -> Caller:
        with ctx.db.write() as session:
            user = ensure_user(session, name)
            return Caller(user.id, user.name, False, 0, max_priority=Priority.HIGH)  # as if an admin allowed it

    return make
