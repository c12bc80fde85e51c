"""A running job's wall-clock pace, as its worker tells it from the train points it
receives: over the later half of the steps, so a start's one-off costs fade while the
evaluations and checkpoints it repeats count; thinned to a bounded number of points."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from worker.pace import Pace, pause_cycle

START = datetime(2026, 11, 27, tzinfo=UTC)


def test_the_pace_is_over_the_later_half_of_the_steps() -> None:
    pace = Pace()
    pace.note(10, START)
    assert pace.pace() is None  # one point: nothing to tell a pace from
    pace.note(20, START + timedelta(seconds=30))  # a slow start (tracing, the first evaluation)
    for step in range(30, 210, 10):  # then 1 s a step, evaluations and all
        pace.note(step, START + timedelta(seconds=30 + step - 20))
    assert pace.pace() == 1.0
    pace.note(200, START + timedelta(seconds=999))  # a step again (a replayed line) changes nothing
    assert pace.pace() == 1.0


def test_the_points_kept_are_bounded_and_keep_the_first_and_the_newest() -> None:
    pace = Pace()
    for step in range(1, 10_001):
        pace.note(step, START + timedelta(seconds=2 * step))
    assert len(pace.points) <= Pace.KEPT
    assert pace.points[0][0] == 1 and pace.points[-1][0] == 10_000
    assert pace.pace() == 2.0


def test_with_its_pauses_cycle_known_every_look_sees_the_true_pace() -> None:
    """1 s a step, and a 50 s evaluation after the point of every 100th step: 1.5 s a step.
    Without the cycle a look just before an evaluation sees one pause too many in its window."""

    def when(step: int) -> datetime:
        return START + timedelta(seconds=step + 50 * ((step - 1) // 100))

    blind, seeing = Pace(), Pace(cycle=100)
    looks: dict[int, tuple[float | None, float | None]] = {}
    for step in range(20, 2020, 20):
        for pace in (blind, seeing):
            pace.note(step, when(step))
        looks[step] = (blind.pace(), seeing.pace())
    assert looks[520][0] is not None and looks[520][0] > 1.55  # 260 -> 520 holds 3 evaluations, not 2.6
    assert all(abs(seen - 1.5) < 1e-9 for step, (_, seen) in looks.items() if step >= 200 and seen is not None)


def test_the_cycle_is_where_evaluations_and_checkpoints_come_round_again() -> None:
    assert pause_cycle(100, 500) == 500
    assert pause_cycle(300, 200) == 600
    assert pause_cycle(100, 0) == 100
    assert pause_cycle(None, 0) is None
