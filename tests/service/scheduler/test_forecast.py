"""Expected start times: the policy replayed forward from the live state."""

from __future__ import annotations

import random

import pytest

from service.scheduler.costs import CHECKPOINT_S, STOP_COST_S
from service.scheduler.elastic import rate
from service.scheduler.forecast import DEFAULT_RUN_S, Forecast, Replay, forecast
from service.scheduler.policy import schedule
from service.scheduler.types import Cluster, FairShare, PolicyConfig
from tests.service.scheduler.test_policy import NOW, cluster, job, running


def test_a_job_waits_for_the_running_job_that_ends_first_then_the_next_for_it() -> None:
    busy = [running(100, "lab-a", (0,), limit_s=150.0), running(101, "lab-a", (1,), limit_s=1000.0)]
    first, second = job(1, typical_s=60.0), job(2)
    found = forecast([first, second], cluster(2, running=busy), FairShare(), NOW, PolicyConfig())
    # job 100 started 50 s ago with a 150 s limit: GPU 0 frees at NOW + 100
    assert found[1] == Forecast(NOW + 100, "lab-a")
    assert found[2] == Forecast(NOW + 160, "lab-a")  # after job 1's typical 60 s


def test_a_job_that_fits_now_starts_now_as_the_pass_would_place_it() -> None:
    c = cluster(2, 4, running=[running(100, "lab-a", (0, 1), limit_s=100.0)])
    queued = [job(1, gpus=2), job(2, gpus=4), job(3, gpus=2)]
    found = forecast(queued, c, FairShare(), NOW, PolicyConfig())
    placed = {p.job_id: p.host for p in schedule(queued, c, FairShare(), NOW, PolicyConfig()).placements}
    assert {j: f.host for j, f in found.items() if f.start == NOW} == placed
    assert all(f.start >= NOW for f in found.values()) and set(found) == {1, 2, 3}


def test_without_limits_or_history_a_job_is_taken_to_run_the_default_time() -> None:
    busy = [running(100, "lab-a", (0,))]  # no limit, no history: as long again as so far (50 s), at least a minute
    found = forecast([job(1), job(2)], cluster(1, running=busy), FairShare(), NOW, PolicyConfig())
    assert found[1].start == NOW + 60
    assert found[2].start == NOW + 60 + DEFAULT_RUN_S


def test_a_job_for_a_host_that_is_not_there_gets_no_estimate() -> None:
    found = forecast([job(1, host="lab-z")], cluster(1), FairShare(), NOW, PolicyConfig())
    assert found == {}


def test_only_the_first_jobs_are_replayed(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import service.scheduler.forecast as module

    monkeypatch.setattr(module, "FORECAST_JOBS", 3)
    queued = [job(i, typical_s=10.0) for i in range(1, 8)]
    found = forecast(queued, Cluster(cluster(1).hosts), FairShare(), NOW, PolicyConfig())
    assert set(found) == {1, 2, 3}
    assert [found[i].start for i in (1, 2, 3)] == [NOW, NOW + 10, NOW + 20]


def test_running_jobs_are_taken_to_end_at_their_owners_median_not_the_cautious_90th_percentile() -> None:
    # Started 50 s ago; its owner's runs take 10 min typically, 5 h at the 90th percentile.
    busy = [running(100, "lab-a", (0,), typical_s=600.0, estimate_s=5 * 3600.0)]
    found = forecast([job(1)], cluster(1, running=busy), FairShare(), NOW, PolicyConfig())
    assert found[1].start == NOW + 550
    # ...never past its time limit, and once it has outlived its median, as long again as so far.
    capped = [running(100, "lab-a", (0,), typical_s=600.0, estimate_s=5 * 3600.0, limit_s=300.0)]
    assert forecast([job(1)], cluster(1, running=capped), FairShare(), NOW, PolicyConfig())[1].start == NOW + 250
    outlived = [running(100, "lab-a", (0,), typical_s=600.0, started=NOW - 1000)]
    assert forecast([job(1)], cluster(1, running=outlived), FairShare(), NOW, PolicyConfig())[1].start == NOW + 1000


def test_a_running_job_with_a_measured_pace_is_taken_to_end_at_its_eta() -> None:
    """The waiting job's expected start is the running job's ETA (what its page shows), not a
    guess from its owner's runs or its age, never past its limit, never in the past."""
    for kw, start in (
        ({}, NOW + 90),
        ({"typical_s": 600.0, "estimate_s": 3600.0}, NOW + 90),
        ({"limit_s": 100.0}, NOW + 50),
    ):
        busy = [running(100, "lab-a", (0,), measured_end=NOW + 90, **kw)]
        assert forecast([job(1)], cluster(1, running=busy), FairShare(), NOW, PolicyConfig())[1].start == start, kw
    late = [running(100, "lab-a", (0,), measured_end=NOW - 5)]  # its last step is due: any moment now
    assert forecast([job(1)], cluster(1, running=late), FairShare(), NOW, PolicyConfig())[1].start == NOW


def test_a_job_the_replay_starts_runs_for_its_owners_median_at_most_its_limit() -> None:
    queued = [job(1, typical_s=600.0, estimate_s=3600.0), job(2, typical_s=600.0, limit_s=120.0), job(3)]
    found = forecast(
        queued,
        cluster(1),
        FairShare(),
        NOW,
        PolicyConfig(),
    )
    # job 2's tight limit puts it first: 120 s (its limit, under the median), then job 1's 600 s
    assert [found[i].start for i in (2, 1, 3)] == [NOW, NOW + 120, NOW + 720]


def test_with_time_slicing_a_fresh_job_starts_once_the_served_job_has_checkpointed() -> None:
    """Two hours into a job its owner's runs take a day over: slicing after an hour stops
    it for the fresh job, which starts when the checkpoint is written; without slicing the
    fresh job waits for it to end. The stopped job leaves the replay."""
    busy = [running(100, "lab-a", (0,), typical_s=86400.0, started=NOW - 7200)]
    queued = [job(1, typical_s=600.0), job(2, typical_s=600.0)]
    sliced = forecast(queued, cluster(1, running=busy), FairShare(), NOW, PolicyConfig(demote_after_gpu_s=3600))
    assert sliced == {1: Forecast(NOW + CHECKPOINT_S, "lab-a"), 2: Forecast(NOW + CHECKPOINT_S + 600, "lab-a")}
    plain = forecast(queued, cluster(1, running=busy), FairShare(), NOW, PolicyConfig())
    assert plain[1] == Forecast(NOW + 86400 - 7200, "lab-a")
    # A job the replay started itself is stopped when its slice is up (an event of its own),
    # for fresh work shorter than what it has left; not for work as long (a stop must pay).
    five_hours = [running(100, "lab-a", (0,), typical_s=5 * 3600.0, estimate_s=5 * 3600.0, started=NOW)]
    short = forecast([job(1, typical_s=600.0)], cluster(1, running=five_hours), FairShare(), NOW,
                     PolicyConfig(demote_after_gpu_s=3600))  # fmt: skip
    assert short == {1: Forecast(NOW + 3600 + CHECKPOINT_S, "lab-a")}
    alike = forecast([job(1, typical_s=5 * 3600.0)], cluster(1, running=five_hours), FairShare(), NOW,
                     PolicyConfig(demote_after_gpu_s=3600))  # fmt: skip
    assert alike == {1: Forecast(NOW + 5 * 3600, "lab-a")}
    # A job running since now with a 10-minute floor: a 4-GPU job serves its hour in 15 min.
    gang = [running(100, "lab-a", (0, 1, 2, 3), typical_s=86400.0, started=NOW)]
    found = forecast(
        [job(1, gpus=4)], cluster(4, running=gang), FairShare(), NOW, PolicyConfig(demote_after_gpu_s=3600)
    )
    assert found == {1: Forecast(NOW + 900 + CHECKPOINT_S, "lab-a")}


def test_a_job_being_stopped_is_taken_to_be_gone_once_it_has_checkpointed() -> None:
    """Stopped by an earlier pass (a time slice, a preemption, a cancel): its GPUs are the
    waiting job's within CHECKPOINT_S, not at the stopped job's likely end a day on."""
    stopping = [running(100, "lab-a", (0,), typical_s=86400.0, stopping=True)]
    assert forecast([job(1)], cluster(1, running=stopping), FairShare(), NOW, PolicyConfig()) == {
        1: Forecast(NOW + CHECKPOINT_S, "lab-a")
    }


def test_a_replay_done_one_policy_call_at_a_time_finds_what_one_done_at_once_finds() -> None:
    """A busy mixed queue with time slicing on (stops, wake-ups, gangs over hosts): sliced to
    one policy call a slice, the replay takes many slices and ends with the same forecast."""
    rng = random.Random(7)
    busy = [
        running(100 + i, host, (i % 4,), limit_s=rng.choice([None, 600.0, 7200.0]), started=NOW - rng.uniform(0, 9000))
        for i, host in enumerate(["lab-a"] * 4 + ["lab-b"] * 3)
    ]
    queued = [
        job(i, user=rng.choice(["ann", "bob", "cy"]), gpus=rng.choice([1, 1, 2, 4, 8]), typical_s=rng.uniform(60, 9000))
        for i in range(1, 40)
    ]
    config = PolicyConfig(demote_after_gpu_s=3600.0)
    whole = forecast(queued, cluster(4, 4, running=busy), FairShare(), NOW, config)
    sliced = Replay(queued, cluster(4, 4, running=busy), FairShare(), NOW, config)
    slices = 1
    while not sliced.run(0.0):
        slices += 1
    assert slices > 10 and len(whole) > 10
    assert sliced.found == whole


def test_an_elastic_job_the_replay_starts_small_runs_longer_there_and_grows_when_it_may() -> None:
    """Job 1 (4 GPUs, elastic) starts on the 2 free ones and trains there at rate(2, 4) of
    its full size's pace; when job 100 frees the other two it grows onto them (the rigid
    4-GPU job behind it cannot start on two), restarting with what it has left, and the
    rigid job is expected when it ends. The replay used to run it its full-size time on two
    GPUs and never grow it: job 2 was expected 534 s early."""
    busy = [running(100, "lab-a", (0, 1), limit_s=1050.0)]  # frees GPUs 0, 1 at NOW + 1000
    queued = [job(1, gpus=4, min_gpu_count=1, typical_s=3600.0), job(2, gpus=4)]
    found = forecast(queued, cluster(4, running=busy), FairShare(), NOW, PolicyConfig())
    assert found[1] == Forecast(NOW, "lab-a")
    at_two = 3600.0 / rate(2, 4)
    grown_at = NOW + 1000
    left_at_four = (NOW + at_two - grown_at) * rate(2, 4)
    assert found[2].start == pytest.approx(grown_at + left_at_four + STOP_COST_S)


def test_a_shrink_in_the_replay_gives_up_gpus_and_slows_the_job_that_keeps_the_rest() -> None:
    """Job 1 takes two of the elastic job 5's four GPUs: in the replay job 5 goes on with
    (0, 1), ending as much later as its rate there says; nothing is held twice."""
    wide = running(5, "lab-a", (0, 1, 2, 3), min_gpu_count=1, full_gpu_count=4, started=NOW - 3600, typical_s=7200.0)
    replay = Replay([job(1, gpus=2, typical_s=600.0)], cluster(4, running=[wide]), FairShare(), NOW, PolicyConfig())
    replay._step()  # one policy call (the shrink and job 1's start), then on to job 1's end
    assert replay.found[1] == Forecast(NOW, "lab-a") and replay.clock == NOW + 600
    assert [part.indices for part in replay.sim.parts[5]] == [(0, 1)]
    assert replay.sim.end_of(5) == pytest.approx(NOW + 3600.0 / rate(2, 4) + STOP_COST_S)
    assert replay.sim.by_name["lab-a"].free == [0.0, 0.0, 1.0, 1.0], "job 1's GPUs are free again, not job 5's"
