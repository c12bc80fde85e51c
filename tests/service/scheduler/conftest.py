"""The live pass's tests' context and callers (a real database and Redis)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from service.core import defaults
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


@pytest.fixture
def whole_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every replay of expected starts due at once and done within its pass, however slow the
    machine: a 10 ms slice (`FORECAST_SLICE_S`) or the last replay's cost
    (`FORECAST_COST_RATIO`) would otherwise leave a pass's expected starts to a later one.
    The throttle and the slicing have tests of their own."""
    monkeypatch.setattr(defaults, "FORECAST_COST_RATIO", 0.0)
    monkeypatch.setattr(defaults, "FORECAST_SLICE_S", 60.0)
