"""The trace simulator: the same policy on a virtual clock, and the metrics it reports."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

import service.scheduler.simulate as simulator
from service.scheduler.costs import CHECKPOINT_S, RESTART_S, STOP_COST_S
from service.scheduler.elastic import rate
from service.scheduler.history import RunTimes
from service.scheduler.simulate import simulate
from service.scheduler.trace import TraceError, TraceJob, read_trace
from service.scheduler.types import Cluster, Decision, FairShare, Policy, PolicyConfig, QueuedJob

METRICS = {
    "jobs",
    "jobs_dropped_too_large",
    "avg_jct_s",
    "user_avg_jct_s",
    "p50_jct_s",
    "p95_jct_s",
    "avg_wait_s",
    "p95_wait_s",
    "p99_wait_s",
    "max_wait_s",
    "max_first_wait_s",
    "makespan_s",
    "utilization",
    "jain_fairness",
    "avg_pass_ms",
    "p99_pass_ms",
    "max_pass_ms",
    "p99_pass_cpu_ms",
    "max_pass_cpu_ms",
    "fragmentation",
    "shared_jobs",
    "per_user",
}


def trace(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text("submit_time_s,duration_s,num_gpus,user\n" + "\n".join(rows) + "\n")
    return path


HEAD_BLOCKED = ["0,100,1,u1", "1,10,2,u2", "2,100,1,u1"]  # one host of 2 GPUs


def test_fifo_keeps_the_order_and_fit_first_lets_small_jobs_pass(tmp_path: Path) -> None:
    jobs = read_trace(trace(tmp_path, HEAD_BLOCKED))
    fifo = simulate(read_trace(trace(tmp_path, HEAD_BLOCKED)), 1, 2, Policy.FIFO)
    # FIFO: A 0-100, B 100-110, C 110-210: waits 0, 99, 108
    assert fifo["max_wait_s"] == 108.0
    assert fifo["avg_jct_s"] == round((100 + 109 + 208) / 3, 1)
    fit_first = simulate(jobs, 1, 2, Policy.FIT_FIRST)
    # fit-first: A 0-100, C 2-102, B 102-112: waits 0, 101, 0
    assert fit_first["max_wait_s"] == 101.0
    assert fit_first["makespan_s"] == 112.0


def test_the_average_over_users_counts_each_user_once_however_many_jobs_they_sent(tmp_path: Path) -> None:
    # One GPU, FIFO: u1's job runs 0-100; u2's three run 100-110, 110-120, 120-130
    rows = ["0,100,1,u1", "1,10,1,u2", "2,10,1,u2", "3,10,1,u2"]
    result = simulate(read_trace(trace(tmp_path, rows)), 1, 1, Policy.FIFO)
    u2 = (109 + 118 + 127) / 3
    assert result["per_user"]["u1"]["avg_jct_s"] == 100.0
    assert result["per_user"]["u2"]["avg_jct_s"] == round(u2, 1)
    assert result["avg_jct_s"] == round((100 + 109 + 118 + 127) / 4, 1)
    assert result["user_avg_jct_s"] == round((100 + u2) / 2, 1)


def test_a_starving_big_job_gets_a_reservation_under_towerq(tmp_path: Path) -> None:
    # One 2-GPU host; 1-GPU jobs keep arriving; the 2-GPU job waits behind them under
    # fit-first, but towerq reserves the host for it once it has waited reserve_after_s.
    rows = ["0,50,1,u1", "1,500,2,u2"] + [f"{t},50,1,u1" for t in range(2, 1000, 40)]

    def big_job_wait(policy: Policy, config: PolicyConfig | None = None) -> float:
        jobs = read_trace(trace(tmp_path, rows))
        simulate(jobs, 1, 2, policy, config=config)
        big = next(j for j in jobs if j.gpu_count == 2)
        assert big.start is not None
        return big.start - big.submit

    assert big_job_wait(Policy.FIT_FIRST) > 900  # small jobs always hold a GPU until arrivals stop
    # reserved once it has waited 100 s; the GPUs' holders end within 50 s; passes come at least every 40 s
    assert big_job_wait(Policy.TOWERQ, PolicyConfig(reserve_after_s=100.0)) <= 100 + 50 + 40


def test_metrics_are_all_there_and_sane(tmp_path: Path) -> None:
    rows = [f"{i * 7},{30 + i % 5 * 20},{1 + i % 3},u{i % 4}" for i in range(60)]
    for policy in Policy:
        result = simulate(read_trace(trace(tmp_path, rows)), 2, 4, policy)
        assert set(result) == METRICS
        assert result["jobs"] == 60
        assert 0 < result["utilization"] <= 1
        assert 0 < result["jain_fairness"] <= 1
        assert result["p50_jct_s"] <= result["p95_jct_s"]
        assert result["max_wait_s"] >= result["p99_wait_s"] >= result["p95_wait_s"] >= 0


def test_jobs_larger_than_the_cluster_are_left_out_and_counted(tmp_path: Path) -> None:
    result = simulate(read_trace(trace(tmp_path, ["0,10,1,u", "0,10,9,u"])), 2, 4, Policy.TOWERQ)
    assert (result["jobs"], result["jobs_dropped_too_large"]) == (1, 1)


def test_jobs_larger_than_a_host_take_whole_hosts(tmp_path: Path) -> None:
    result = simulate(read_trace(trace(tmp_path, ["0,100,6,u", "1,100,1,v"])), 2, 4, Policy.FIT_FIRST)
    assert result["max_wait_s"] == 99.0  # the 1-GPU job finds no free GPU until the big one ends


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["x,1,1,u"], "trace.csv:2: could not convert string to float: 'x'"),
        (["0,1,0,u"], "trace.csv:2: needs num_gpus >= 1"),
    ],
)
def test_a_bad_trace_line_is_named(tmp_path: Path, rows: list[str], message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_trace(trace(tmp_path, rows))


def test_a_trace_without_the_columns_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("time,gpus\n1,1\n")
    with pytest.raises(TraceError, match="missing column"):
        read_trace(path)


def test_towerq_simulate_prints_one_json_object(tmp_path: Path) -> None:
    path = trace(tmp_path, HEAD_BLOCKED)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "simulate",
            "--trace",
            str(path),
            "--hosts",
            "1",
            "--gpus-per-host",
            "2",
            "--policy",
            "fit-first",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert set(json.loads(out)) == METRICS
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "simulate",
            "--trace",
            str(tmp_path / "none.csv"),
            "--hosts",
            "1",
            "--gpus-per-host",
            "2",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "cannot read" in bad.stderr


# -- GPU sharing: the gpu_fraction column ---------------------------------------------------

PHILLY = Path(__file__).resolve().parent / "data" / "philly_first_1500.csv"
"""The first 1,500 jobs of ../shared/data/philly_2017-10-23_5000.csv, kept with the tests."""


def fractions_trace(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "shared.csv"
    path.write_text("submit_time_s,duration_s,num_gpus,user,gpu_fraction\n" + "\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("policy", [Policy.TOWERQ, Policy.FIT_FIRST])
def test_fractions_share_a_gpu_as_the_live_scheduler_packs_them(tmp_path: Path, policy: Policy) -> None:
    """Four quarter-GPU jobs run together on one GPU; a half-GPU job then waits for room."""
    rows = ["0,100,1,a,0.25", "0,100,1,b,0.25", "0,100,1,c,0.25", "0,100,1,d,0.25", "1,10,1,e,0.5"]
    jobs = read_trace(fractions_trace(tmp_path, rows))
    result = simulate(jobs, 1, 1, policy)
    assert [j.start for j in jobs] == [0, 0, 0, 0, 100]
    assert result["shared_jobs"] == 5 and result["utilization"] == pytest.approx(
        1.0 * 100 / 110 + 0.5 * 10 / 110, abs=1e-4
    )
    assert result["fragmentation"] == 0.0  # the GPU was full the whole time the job waited


def test_fragmentation_is_the_capacity_left_idle_while_a_job_waits(tmp_path: Path) -> None:
    """0.6 of the GPU is taken; a job wanting 0.6 more waits 100 s beside 0.4 nobody can use."""
    jobs = read_trace(fractions_trace(tmp_path, ["0,100,1,a,0.6", "0,50,1,b,0.6"]))
    result = simulate(jobs, 1, 1, Policy.TOWERQ)
    assert [j.start for j in jobs] == [0, 100] or [j.start for j in jobs] == [50, 0]
    assert result["fragmentation"] == pytest.approx(0.4)


def test_time_slicing_stops_a_long_job_for_a_short_one_and_resumes_it(tmp_path: Path) -> None:
    """One GPU; a 3-hour job runs when a 10-minute one arrives an hour and a half in.
    With slicing after an hour the long job checkpoints (CHECKPOINT_S), the short one
    runs, and the long one resumes with RESTART_S more to go; its wait counts the time it
    was queued again. Off, the short one waits for the long one."""
    rows = ["0,10800,1,a", "5400,600,1,b"]
    off = read_trace(trace(tmp_path, rows))
    simulate(off, 1, 1, Policy.TOWERQ)
    assert [j.start for j in off] == [0, 10800]
    on = read_trace(trace(tmp_path, rows))
    result = simulate(on, 1, 1, Policy.TOWERQ, config=PolicyConfig(demote_after_gpu_s=3600))
    stop = 5400 + CHECKPOINT_S
    assert [j.start for j in on] == [0, stop]
    assert on[0].waited == 600, "queued again from its stop until the short job ended"
    assert result["max_wait_s"] == 600
    assert result["max_first_wait_s"] == CHECKPOINT_S, "the short job's wait to start; not the long one's re-wait"
    assert result["makespan_s"] == 10800 + 600 + RESTART_S
    assert result["avg_jct_s"] == round(((10800 + 600 + RESTART_S) + (stop + 600 - 5400)) / 2, 1)


def run_simulate_cli(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ["simulate", "--trace", str(path), "--hosts", "1", "--gpus-per-host", "1", *extra]
    env = {k: v for k, v in os.environ.items() if k != "TOWERQ_TIME_SLICE_GPU_S"}
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True, env=env)


def test_towerq_simulate_slices_time_as_the_service_does_unless_told_otherwise(tmp_path: Path) -> None:
    path = trace(tmp_path, ["0,10800,1,a", "5400,600,1,b"])
    default = json.loads(run_simulate_cli(path).stdout)
    assert default["makespan_s"] == 10800 + 600 + RESTART_S, "the service's default: a slice after one GPU-hour"
    off = json.loads(run_simulate_cli(path, "--time-slice", "0").stdout)
    assert off["makespan_s"] == 10800 + 600 and off["max_wait_s"] == 10800 - 5400
    late = json.loads(run_simulate_cli(path, "--time-slice", "36000").stdout)
    assert (late["makespan_s"], late["max_wait_s"]) == (off["makespan_s"], off["max_wait_s"])
    bad = run_simulate_cli(path, "--time-slice", "-1")
    assert bad.returncode == 2 and "--time-slice must be 0 (off) or a number of GPU-seconds" in bad.stderr


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("0,1,1,u,0", r"gpu_fraction must be in \(0, 1\]"),
        ("0,1,1,u,1.5", r"gpu_fraction must be in \(0, 1\]"),
        ("0,1,2,u,0.5", "gpu_fraction below 1 needs num_gpus 1"),
        ("0,1,1,u,half", "gpu_fraction 'half' is not a number"),
    ],
)
def test_a_bad_fraction_is_named_with_its_line(tmp_path: Path, row: str, message: str) -> None:
    with pytest.raises(TraceError, match=f"shared.csv:2: {message}"):
        read_trace(fractions_trace(tmp_path, [row]))


def limits_trace(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "limits.csv"
    path.write_text("submit_time_s,duration_s,num_gpus,user,time_limit_s\n" + "\n".join(rows) + "\n")
    return path


def test_time_limits_rank_jobs_and_stop_those_that_overrun(tmp_path: Path) -> None:
    """One GPU. Three jobs queue behind the first: towerq runs the one whose limit says it
    is short first (fit-first keeps submit order); a job past its limit is stopped there."""
    rows = ["0,100,1,a,", "1,1000,1,b,", "2,500,1,c,2000", "3,50,1,d,600", "4,9000,1,e,30"]
    towerq = read_trace(limits_trace(tmp_path, rows))
    simulate(towerq, 1, 1, Policy.TOWERQ)
    # e (30 s limit) at 100 and stopped at 130, d (600 s) at 130-180, c (2000 s) at 180, b last
    assert [j.start for j in towerq] == [0, 680, 180, 130, 100]
    fit_first = read_trace(limits_trace(tmp_path, rows))
    result = simulate(fit_first, 1, 1, Policy.FIT_FIRST)
    assert [j.start for j in fit_first] == [0, 100, 1100, 1600, 1650]
    assert result["makespan_s"] == 1680.0  # e held the GPU 30 s, not its 9,000


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("0,1,1,u,0", "time_limit_s must be a positive number of seconds, got 0"),
        ("0,1,1,u,-5", "time_limit_s must be a positive number of seconds, got -5"),
        ("0,1,1,u,inf", "time_limit_s must be a positive number of seconds, got inf"),
        ("0,1,1,u,soon", "time_limit_s 'soon' is not a number"),
    ],
)
def test_a_bad_time_limit_is_named_with_its_line(tmp_path: Path, row: str, message: str) -> None:
    with pytest.raises(TraceError, match=f"limits.csv:2: {message}"):
        read_trace(limits_trace(tmp_path, [row]))


def test_on_a_real_mix_of_fractions_towerq_beats_fit_first_and_sharing_beats_whole_gpus() -> None:
    """The first 1,500 Philly jobs on 4 hosts × 8 GPUs, half the one-GPU jobs asking for
    0.25-0.8 of a GPU: towerq finishes jobs sooner than fit-first, and sharing GPUs
    finishes them sooner than whole GPUs would."""
    jobs = read_trace(PHILLY, limit=1500)
    rng = random.Random(7)
    mixed = copy.deepcopy(jobs)
    for job in mixed:
        if job.gpu_count == 1 and rng.random() < 0.5:
            job.fraction = round(rng.uniform(0.25, 0.8), 2)
    towerq = simulate(copy.deepcopy(mixed), 4, 8, Policy.TOWERQ)
    fit_first = simulate(copy.deepcopy(mixed), 4, 8, Policy.FIT_FIRST)
    whole = simulate(copy.deepcopy(jobs), 4, 8, Policy.TOWERQ)
    assert towerq["shared_jobs"] > 500
    assert towerq["avg_jct_s"] < fit_first["avg_jct_s"]
    assert 0 < towerq["fragmentation"] < 1 and 0 < fit_first["fragmentation"] < 1
    assert towerq["avg_jct_s"] < 0.8 * whole["avg_jct_s"]
    users = towerq["per_user"]
    assert sum(u["jobs"] for u in users.values()) == 1500
    assert all(u["p99_wait_s"] >= u["p95_wait_s"] >= 0 for u in users.values())
    assert all(u["entitled_while_waiting"] >= 0 for u in users.values())


def test_a_run_that_moves_only_the_median_is_reported_so_queued_jobs_are_refreshed() -> None:
    # The simulator refreshes a user's queued jobs only when `add` says something
    # changed; the live service re-annotates every pass, so the median (the length term's
    # input) must count as a change even when the 90th percentile stays put.
    history = RunTimes()
    for seconds in (10.0, 20.0, 30.0, 40.0, 100.0):
        history.add("ana", seconds)
    assert (history.estimate("ana"), history.typical("ana")) == (100.0, 30.0)
    assert history.add("ana", 35.0) is True
    assert (history.estimate("ana"), history.typical("ana")) == (100.0, 35.0)
    assert history.add("ana", 35.0) is False  # neither moved


def grouped_trace(tmp_path: Path) -> Path:
    """Two groups of two users each keep four GPUs' worth of one-GPU jobs waiting on a
    two-GPU host: who gets the GPUs while both wait is the fair share's call."""
    rows = []
    for n in range(200):
        for user, group in (("v1", "vision"), ("v2", "vision"), ("n1", "nlp"), ("n2", "nlp")):
            rows.append(f"{n * 50},100,1,{user},{group}")
    path = tmp_path / "grouped.csv"
    path.write_text("submit_time_s,duration_s,num_gpus,user,group\n" + "\n".join(rows) + "\n")
    return path


def test_a_trace_with_groups_is_replayed_with_their_shares_and_reports_them(tmp_path: Path) -> None:
    jobs = read_trace(grouped_trace(tmp_path))
    assert {j.group for j in jobs} == {"vision", "nlp"}
    even = simulate(read_trace(grouped_trace(tmp_path)), 1, 2, Policy.TOWERQ)
    assert abs(even["per_group"]["vision"]["gpus_while_waiting"] - even["per_group"]["nlp"]["gpus_while_waiting"]) < 0.2
    weighted = simulate(jobs, 1, 2, Policy.TOWERQ, group_shares={"vision": 3.0})
    vision, nlp = weighted["per_group"]["vision"], weighted["per_group"]["nlp"]
    assert vision["share"] == 3.0 and nlp["share"] == 1.0
    assert vision["gpus_while_waiting"] > nlp["gpus_while_waiting"] + 0.3  # the share weighs
    assert vision["entitled_while_waiting"] == pytest.approx(1.5, abs=0.05)  # 3/4 of 2 GPUs
    plain = simulate(read_trace(trace(tmp_path, HEAD_BLOCKED)), 1, 2, Policy.TOWERQ)
    assert "per_group" not in plain  # a trace without groups reports none


def test_towerq_simulate_takes_group_shares_and_refuses_bad_ones(tmp_path: Path) -> None:
    path = grouped_trace(tmp_path)
    command = [sys.executable, "-m", "service.cli", "simulate", "--trace", str(path), "--hosts", "1"]
    command += ["--gpus-per-host", "2", "--limit", "200"]
    out = subprocess.run([*command, "--group-shares", "vision=3,nlp=1"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["per_group"]["vision"]["share"] == 3.0
    bad = subprocess.run([*command, "--group-shares", "vision=lots"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--group-shares: 'vision=lots'" in bad.stderr


def test_a_replay_that_writes_expected_starts_times_those_passes_too() -> None:
    """(Issue 29.) A pass that writes the queue (positions, reasons, expected starts) costs
    more than a plain one; the replay times it at each sampled arrival, in CPU time."""
    rng = random.Random(5)
    jobs = [TraceJob(i, i * 60.0, rng.uniform(600, 7200), rng.choice([1, 1, 2, 4]), f"u{i % 5}") for i in range(300)]
    plain = simulate(copy.deepcopy(jobs), 2, 4, Policy.TOWERQ, config=PolicyConfig(demote_after_gpu_s=3600))
    assert "passes_with_starts" not in plain
    timed = simulate(
        copy.deepcopy(jobs), 2, 4, Policy.TOWERQ, config=PolicyConfig(demote_after_gpu_s=3600), estimates_every=10
    )
    assert timed["passes_with_starts"] == 30
    assert 0 < timed["p99_pass_with_starts_cpu_ms"] <= timed["max_pass_with_starts_cpu_ms"]
    assert timed["avg_jct_s"] == plain["avg_jct_s"], "timing the expected starts changes no decision"


def test_an_elastic_job_starts_on_what_is_free_and_grows_when_the_rest_frees(tmp_path: Path) -> None:
    """One host of 2 GPUs: a 1-GPU job of an hour, then a 2-GPU job of two hours. Rigid, the
    second waits for the first. Elastic, it starts at once on the free GPU at 1/1.8 of its
    full rate (`elastic.rate`), and when the first ends it grows onto both: a stop and a
    restart (`STOP_COST_S`) with the work it has left."""
    rows = ["0,3600,1,a", "1,7200,2,b"]
    rigid = simulate(read_trace(trace(tmp_path, rows)), 1, 2, Policy.TOWERQ)
    assert rigid["makespan_s"] == 3600 + 7200 and "resizes" not in rigid
    jobs = read_trace(trace(tmp_path, rows))
    result = simulate(jobs, 1, 2, Policy.TOWERQ, elastic=1.0)
    left = 7200 - (3600 - 1) * rate(1, 2)
    end = 3600 + left + STOP_COST_S
    assert [j.start for j in jobs] == [0, 1] and jobs[1].waited == 0
    assert result["makespan_s"] == pytest.approx(end, abs=0.1)
    assert result["avg_jct_s"] == pytest.approx((3600 + end - 1) / 2, abs=0.1)
    assert (result["elastic_jobs"], result["resizes"], result["grows"], result["shrinks"]) == (1, 1, 1, 0)


def test_towerq_simulate_replays_a_share_of_jobs_as_elastic(tmp_path: Path) -> None:
    path = trace(tmp_path, ["0,3600,1,a", "1,7200,2,b"])
    out = run_simulate_cli(path, "--gpus-per-host", "2", "--time-slice", "0", "--elastic", "1")
    elastic = json.loads(out.stdout)
    assert (elastic["elastic_jobs"], elastic["grows"]) == (1, 1)
    bad = run_simulate_cli(path, "--elastic", "1.5")
    assert bad.returncode == 2 and "--elastic must be a share from 0 to 1" in bad.stderr


def test_an_elastic_replay_never_gives_a_gpu_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator applies a pass's decision in its own order (stops, shrinks, grows and
    moves, starts), which holds only while the policy decides them in an order that fits it
    (a growth onto GPUs a placement of the same pass took would put two jobs on one GPU, and
    nothing would say so: the replay's figures would simply be wrong; a start on the GPUs a
    move frees needs the move first). Every pass of an elastic replay with slicing (the
    first 1,500 Philly jobs on 4 hosts × 8 GPUs, every multi-GPU job elastic) sees each
    GPU's free part and its jobs' parts add up to the whole GPU, and no decision both stops
    and resizes a job."""
    schedule, seen, wrong, twice = simulator.schedule, [0], [], []

    def checked(
        queued: Iterable[QueuedJob], cluster: Cluster, fair_share: FairShare, now: float, config: PolicyConfig
    ) -> Decision:
        held: dict[tuple[str, int], float] = {}
        for running in cluster.running:
            for i in running.indices:
                held[(running.host, i)] = held.get((running.host, i), 0.0) + running.fraction
        for host in cluster.hosts:
            for i, free in enumerate(host.free):
                if abs(free + held.get((host.name, i), 0.0) - 1.0) > 1e-6:
                    wrong.append((now, host.name, i, free, held.get((host.name, i), 0.0)))
        seen[0] += 1
        decision = schedule(queued, cluster, fair_share, now, config)
        twice.extend((set(decision.preempt) | set(decision.reclaim)) & (set(decision.shrink) | set(decision.grow)))
        return decision

    monkeypatch.setattr(simulator, "schedule", checked)
    result = simulate(
        read_trace(PHILLY, limit=1500), 4, 8, Policy.TOWERQ, config=PolicyConfig(demote_after_gpu_s=3600.0), elastic=1.0
    )
    assert result["shrinks"] > 20 and result["grows"] > 10 and result["moves"] > 0 and seen[0] > 1000
    assert wrong == [] and twice == []
