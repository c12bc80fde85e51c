"""What the CLI shows a person (issue 31): why each job waits, failed or was cancelled, in one
line; steps that fit their column; `towerq show` for people and `-o json` for scripts;
sweeps listed and shown with their best job; a pipe closed early ends quietly; the client's
errors read as sentences."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select

from service.core.db import Database
from service.core.models import Job, JobState
from service.core.settings import Settings
from tests.stack import Stack, wait_for
from tests.test_cli import cli_env, towerq
from towerq import ApiError, Client, MissingPackageError
from towerq.cli import views

pytestmark = pytest.mark.slow
SPEC = {"model": "mlp", "dataset": "digits", "gpu_count": 1, "hyperparameters": {"steps": 20}}
TRACEBACK = "model nets:build: ValueError: the layer sizes do not match\nTraceback (most recent call last):\n  ..."


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


@pytest.fixture
def lab(
    stack: Stack,
    set_job: Callable[..., None],
    make_token: Callable[..., str],
    add_host: Callable[..., None],
    tmp_path: Path,
) -> tuple[Client, Path, dict[str, int]]:
    """An API with four jobs of alice's: failed, cancelled, waiting, and one very long."""
    url = stack.start_api()
    add_host("lab-a", 4)
    token = make_token("alice")
    home = tmp_path / "home"
    assert towerq(home, "login", url, "--token", token).returncode == 0
    client = Client(url, token)
    ids = {name: client.submit({**SPEC, "name": name}).id for name in ("broken", "dropped", "waiting", "long")}
    set_job(ids["broken"], state=JobState.FAILED, error=TRACEBACK)
    client.cancel(ids["dropped"])
    set_job(ids["waiting"], pending_reason="waiting for 1 GPU: all 4 are held (bob's job 3 ends in ~2 h)")
    set_job(ids["long"], state=JobState.RUNNING, step=13350, total_steps=100_000_000)
    return client, home, ids


def test_jobs_say_why_each_one_waits_failed_or_was_cancelled_in_one_line(
    lab: tuple[Client, Path, dict[str, int]],
) -> None:
    client, home, ids = lab
    table = towerq(home, "jobs")
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line for line in table.stdout.splitlines()[1:-1]}
    assert rows[str(ids["broken"])].endswith("— model nets:build: ValueError: the layer sizes do not match")
    assert "Traceback" not in table.stdout  # the first line only; `towerq show` has the rest
    assert rows[str(ids["dropped"])].endswith("— cancelled by alice while queued")
    assert "— waiting for 1 GPU: all 4 are held" in rows[str(ids["waiting"])]
    assert " 13.3k/100M  long" in rows[str(ids["long"])]  # fits the STEP column
    header = table.stdout.splitlines()[0]
    assert rows[str(ids["long"])].index(" long") + 1 == header.index("NAME")  # the columns stay aligned
    listed = {job["id"]: job for job in client.jobs_page()["items"]}
    assert listed[ids["dropped"]]["reason"] == "cancelled by alice while queued"
    assert listed[ids["long"]]["reason"] is None


def test_show_reads_as_a_page_and_json_for_scripts(lab: tuple[Client, Path, dict[str, int]]) -> None:
    _, home, ids = lab
    page = towerq(home, "show", str(ids["broken"]))
    assert page.returncode == 0, page.stderr
    lines = page.stdout.splitlines()
    assert lines[0] == f"job {ids['broken']}  broken"
    assert lines[1].split(None, 1) == ["state", "failed: " + TRACEBACK.splitlines()[0]]
    assert any(line.split()[:2] == ["spec", "mlp"] for line in lines), page.stdout
    assert "history" in page.stdout and "queued" in page.stdout
    waiting = towerq(home, "show", str(ids["waiting"])).stdout
    assert "1 wanted" in waiting and "waiting for 1 GPU" in waiting
    scripted = json.loads(towerq(home, "show", str(ids["broken"]), "-o", "json").stdout)
    assert scripted["id"] == ids["broken"] and scripted["state"] == "failed"


def test_a_pipe_closed_early_ends_the_command_quietly(lab: tuple[Client, Path, dict[str, int]]) -> None:
    client, home, _ = lab
    for index in range(60):  # ~2 kB of JSON each: more than a pipe holds, so the writer meets the closed end
        client.submit({**SPEC, "name": f"{index:03d} " + "x" * 120})
    reader = subprocess.run(
        f'{sys.executable} -m service.cli jobs --limit 200 -o json | head -c 10; echo " exit=${{PIPESTATUS[0]}}"',
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        env=cli_env(home),
        timeout=60,
    )
    assert reader.stdout == '{\n  "items exit=141\n', reader.stdout
    assert reader.stderr == "", reader.stderr  # no BrokenPipeError traceback


def test_sweeps_are_listed_and_shown_with_their_best_job(
    lab: tuple[Client, Path, dict[str, int]], db: Database, tmp_path: Path
) -> None:
    client, home, _ = lab
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(
        "name: lr\nbase: {model: mlp, dataset: digits, hyperparameters: {steps: 20}}\n"
        "grid: {hyperparameters.learning_rate: [0.1, 0.01]}\nmetric: eval_accuracy\n"
    )
    follower = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "sweep", str(sweep_file), "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(home),
    )
    wait_for(lambda: client.sweeps(), 30, "the sweep to exist")
    sweep = client.sweeps()[0]

    def its_jobs() -> int:
        with db.read() as session:
            return len(session.scalars(select(Job.id).where(Job.sweep_id == sweep["id"])).all())

    # the sweep is stored before its jobs, each submitted in turn (a clean run once read 1 of 2)
    wait_for(lambda: its_jobs() == 2, 30, "both of the sweep's jobs")
    with db.write() as session:
        jobs = list(session.scalars(select(Job).where(Job.sweep_id == sweep["id"]).order_by(Job.id)))
        for job, accuracy in zip(jobs, (0.91, 0.97), strict=True):
            job.state, job.eval_accuracy, job.step = JobState.SUCCEEDED, accuracy, 20
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"sweep {sweep['id']}: 2/2 done (succeeded 2); best: job {jobs[1].id}")
    assert out.count(last) == 1, out  # the last line once, not twice

    listing = towerq(home, "sweeps")
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.splitlines()[1].split()[:4] == [str(sweep["id"]), "alice", "2/2", str(jobs[1].id)]
    shown = towerq(home, "sweep", "show", str(sweep["id"]))
    assert shown.returncode == 0, shown.stderr
    best = next(line for line in shown.stdout.splitlines() if line.strip().startswith("*"))
    assert best.split()[1:3] == [str(jobs[1].id), "succeeded"] and "learning_rate=0.01" in best
    assert json.loads(towerq(home, "sweep", "show", str(sweep["id"]), "-o", "json").stdout)["best_job"] == jobs[1].id
    missing = towerq(home, "sweep", "show")
    assert missing.returncode == 2 and "which sweep?" in missing.stderr


def test_client_errors_read_as_sentences_and_keep_the_problems(
    lab: tuple[Client, Path, dict[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _, ids = lab
    with pytest.raises(ApiError) as refused:
        client.submit({"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 0}})
    assert refused.value.status == 422
    assert isinstance(refused.value.detail, str) and refused.value.detail.startswith("hyperparameters.steps: ")
    assert refused.value.errors[0]["loc"][-2:] == ["hyperparameters", "steps"]
    with pytest.raises(ApiError) as refused:  # a mapping's key at fault: its field said once, as the API says it
        client.submit({"model": "mlp", "dataset": "digits", "env": {"TOWERQ_API_URL": "x"}})
    assert refused.value.detail.startswith("env.TOWERQ_API_URL: TOWERQ_API_URL is not a job's to set"), refused.value
    monkeypatch.setitem(sys.modules, "pandas", None)  # as on a laptop without pandas
    with pytest.raises(MissingPackageError, match="pip install pandas"):
        client.metrics(ids["broken"], as_frame=True)


def test_counts_and_gpus_are_said_in_the_singular_when_there_is_one() -> None:
    from service.core.lifecycle import gpu_list
    from towerq.cli.views import sweeps_table

    sweep = {"id": 1, "user": "alice", "done": 1, "total": 2, "best_job": None, "goal": "max", "metric": "loss"}
    assert sweeps_table([{**sweep, "name": "lr"}])[-1] == "(1 sweep)"
    assert sweeps_table([{**sweep, "name": "a"}, {**sweep, "name": "b"}])[-1] == "(2 sweeps)"
    assert (gpu_list(["0"]), gpu_list(["0", "1"])) == ("GPU 0", "GPUs 0,1")


def test_no_line_of_towerq_show_ends_in_spaces() -> None:
    """`towerq show` printed 'succeeded ' (its history's state padded for a message it lacked)."""
    from towerq.cli.views import job_page

    job = {
        "id": 7, "name": "mlp", "state": "succeeded", "reason": None, "user": "alice", "priority": "normal",
        "gpu_memory_fraction": 1.0, "allocation": None, "gpu_count": 1, "total_steps": 100, "step": 100,
        "latest": {"loss": 0.1}, "attempts": 1, "crashes": 0, "max_attempts": 3,
        "events": [{"time": "2026-11-27T10:00:00+00:00", "state": "succeeded", "message": None}],
    }  # fmt: skip
    lines = job_page(job)
    assert any(line.endswith("  succeeded") for line in lines), lines  # the history's line
    assert not [line for line in lines if line != line.rstrip()], lines


def test_speed_is_over_wall_time_with_the_training_rate_beside_it() -> None:
    """A job whose evaluations take most of its time: the trainer's 1,280 examples/s while
    training was shown as its speed, 4x what it gets through (issue 49)."""
    from towerq.cli.follow import ProgressLine
    from towerq.cli.views import job_page

    latest = {"step": 40, "examples_per_sec": 1280.0, "step_time_s": 0.1, "loss": 0.5}  # 128 a step
    job = {
        "id": 7, "name": "mlp", "state": "running", "reason": None, "user": "alice", "priority": "normal",
        "gpu_memory_fraction": 1.0, "allocation": None, "gpu_count": 1, "total_steps": 100, "step": 40,
        "latest": latest, "attempts": 1, "crashes": 0, "max_attempts": 3, "pace_s": 0.4, "events": [],
    }  # fmt: skip
    speed = [line for line in job_page(job) if line.lstrip().startswith("speed")]
    assert speed and speed[0].split("speed", 1)[1].strip() == "320 examples/s (1,280 while training)", speed
    ended = [line for line in job_page({**job, "state": "succeeded"}) if line.lstrip().startswith("speed")]
    assert ended[0].split("speed", 1)[1].strip() == "1,280 examples/s while training", ended
    line = ProgressLine(dict(job))
    line.update({"type": "metric", **latest})
    assert "320 ex/s" in line.text(), line.text()


def test_an_adaptive_sweeps_page_says_its_rungs_and_whom_it_stopped() -> None:
    sweep = {
        "id": 7, "name": "curves", "user": "alice", "metric": "accuracy", "goal": "max", "fields": ["quality"],
        "counts": {"succeeded": 3}, "done": 3, "total": 3, "best_job": 2,
        "jobs": [
            {"id": n, "state": "succeeded", "step": step, "total_steps": 60, "result": result,
             "setting": {"quality": q}}
            for n, step, result, q in ((1, 60, 0.45, 0.5), (2, 60, 0.89, 0.9), (3, 15, 0.27, 0.3))
        ],
        "early_stopping": {"method": "asha", "min_steps": 10, "reduction_factor": 2, "max_steps": 60},
        "rungs": [
            {"job_id": 1, "rung": 1, "step": 10, "value": 0.45, "stopped": False, "cut": 0.45},
            {"job_id": 2, "rung": 1, "step": 10, "value": 0.82, "stopped": False, "cut": 0.82},
            {"job_id": 3, "rung": 1, "step": 10, "value": 0.27, "stopped": True, "cut": 0.82},
            {"job_id": 1, "rung": 2, "step": 20, "value": 0.48, "stopped": False, "cut": 0.48},
        ],
    }  # fmt: skip
    page = views.sweep_page(sweep)
    assert page[-3:] == [
        "  early stopping (ASHA): rungs from step 10, 1 in 2 goes on at each",
        "    rung 1 (step 10): 3 reached, cut 0.82; stopped: job 3",
        "    rung 2 (step 20): 1 reached, cut 0.48; none stopped",
    ]
    assert views.rung_lines({**sweep, "early_stopping": None}) == []


def test_an_elastic_job_says_how_many_of_its_gpus_it_holds() -> None:
    from towerq.cli.views import job_page, jobs_table

    job = {
        "id": 7, "name": "mlp", "state": "running", "reason": None, "user": "alice", "priority": "normal",
        "gpu_memory_fraction": 1.0, "gpu_count": 4, "min_gpu_count": 1, "total_steps": 100, "step": 40,
        "allocation": {"host": "lab-a", "gpus": [2, 3], "simulated": False},
        "latest": {}, "attempts": 2, "crashes": 0, "max_attempts": 3, "events": [],
    }  # fmt: skip
    gpus = [line for line in job_page(job) if line.lstrip().startswith("gpus")]
    assert gpus[0].split("gpus", 1)[1].strip() == "lab-a:2,3: 2 of 4 GPUs (elastic)", gpus
    assert jobs_table({"items": [job], "total": 1})[1].endswith("mlp  — 2 of 4 GPUs (elastic)")
    waiting = {**job, "state": "queued", "allocation": None, "reason": "waiting for 1 free GPU on lab-a (job 3)"}
    gpus = [line for line in job_page(waiting) if line.lstrip().startswith("gpus")]
    assert gpus[0].split("gpus", 1)[1].strip() == "1 to 4 GPUs (elastic)", gpus
    rigid = {**job, "min_gpu_count": None}
    assert [line for line in job_page(rigid) if line.lstrip().startswith("gpus")][0].endswith("lab-a:2,3")


def test_a_command_job_s_steps_are_its_program_s_with_no_total() -> None:
    """A command job was shown as `424/1,000` and `step 424/1,000 (42%)`: the trainer's
    default total, which its program never had."""
    from towerq.cli.views import job_page, steps

    job = {
        "id": 7, "name": "python train.py", "state": "running", "reason": None, "user": "alice",
        "priority": "normal", "gpu_memory_fraction": 1.0, "allocation": None, "gpu_count": 1, "total_steps": None,
        "step": 424, "latest": {"loss": 0.1}, "attempts": 1, "crashes": 0, "max_attempts": 3, "events": [],
    }  # fmt: skip
    assert steps(job) == "424" and steps({**job, "total_steps": 1000}) == "424/1,000"
    assert steps({**job, "step": 0}) == "-" and steps({**job, "step": None, "total_steps": 10}) == "0/10"
    progress = [line for line in job_page(job) if line.lstrip().startswith("progress")]
    assert progress and progress[0].split("progress", 1)[1].strip() == "step 424", progress


def test_towerq_show_says_what_each_kind_of_job_runs() -> None:
    """A command job and a notebook session were shown as a model "None on None" at step 0."""
    from towerq.cli.views import job_page

    base = {
        "id": 7, "state": "running", "reason": None, "user": "alice", "priority": "normal",
        "gpu_memory_fraction": 1.0, "allocation": None, "gpu_count": 2, "total_steps": None, "step": None,
        "latest": {}, "attempts": 1, "crashes": 0, "max_attempts": 3, "events": [],
    }  # fmt: skip
    spec = {
        "command": ["python", "train.py", "--lr", "0.1 0.2"],
        "code": "e5baf6e65e84df2a10eb",
        "processes": "per_gpu",
        "requirements": ["einops", "transformers==4.46.1"],
    }
    command = job_page({**base, "name": "python train.py", "spec": spec})
    assert "  command    python train.py --lr '0.1 0.2' (code e5baf6e65e84); one process per GPU" in command, command
    assert "  packages   einops transformers==4.46.1" in command, command
    assert not [line for line in command if line.lstrip().startswith(("progress", "spec"))], command
    latest = {"loss": 0.31, "custom_metrics": {"grad_norm": 1.7, "eval_acc": 0.9}, "eval_custom_metrics": {"f1": 0.82}}
    reported = job_page({**base, "name": "python train.py", "spec": spec, "step": 120, "latest": latest})
    assert "  train      loss 0.31  eval_acc 0.9  grad_norm 1.7" in reported, "its own metrics by name, as reported"
    assert "  eval       f1 0.82" in reported, reported
    session = {
        **base,
        "name": "notebook",
        "url": "/sessions/7/lab",
        "spec": {"kind": "notebook", "idle_timeout_s": 600},
    }
    shown = job_page(session, "http://lab:8000/")
    assert "  session    http://lab:8000/sessions/7/lab" in shown and "  idle       ends after 10m idle" in shown, shown
    assert not [line for line in shown if line.lstrip().startswith("code")], shown
    with_code = job_page({**session, "spec": {**session["spec"], "code": "e5baf6e65e84df2a10eb"}}, "http://lab:8000/")
    assert "  code       e5baf6e65e84 (at $TOWERQ_CODE_DIR)" in with_code, with_code
    model = job_page({**base, "name": "mlp", "spec": {"model": "mlp", "dataset": "digits"}, "step": 0})
    assert "  spec       mlp on digits" in model and "  progress   step 0" in model, model
    from towerq.cli.follow import ProgressLine

    assert ProgressLine({**base, "step": 0}).text() == "job 7 running", "no 'step 0' of a program that reports none"
    failed = "its requirements could not be installed on lab-a (its log says why); waiting for 1 free GPU"
    queued = ProgressLine({**base, "state": "queued", "queue_position": 2, "reason": failed}).text()
    assert queued == f"job 7 queued    #2 in the queue: {failed}", "its requirements' failure said while it waits"
    assert ProgressLine({**base, "step": 0, "total_steps": 10}).text().endswith("step 0/10")
    held = {
        **base,
        "state": "dispatched",
        "reason": "Slurm job 12 is pending (Resources: the GPUs it asks for are in use)",
    }
    assert ProgressLine(held).text() == f"job 7 dispatched {held['reason']}", "what the cluster says while it holds it"


def test_towerq_show_says_when_a_job_ran_for_how_long_and_when_its_time_limit_stops_it() -> None:
    """Slurm's `scontrol show job` says StartTime, RunTime and TimeLimit; `towerq show` said
    none of them (only when it was submitted and last updated)."""
    from datetime import UTC, datetime, timedelta

    from towerq.cli.views import job_page

    def iso(minutes_ago: float) -> str:
        return (datetime.now(UTC) - timedelta(minutes=minutes_ago)).isoformat()

    def row(lines: list[str], label: str) -> str | None:
        found = [line[13:] for line in lines if line[2:12].rstrip() == label]
        return found[0] if found else None

    held = [
        {"attempt": 1, "host": "lab-a", "gpus": 2, "since": iso(90), "until": iso(60), "from_step": 0},
        {"attempt": 2, "host": "lab-a", "gpus": 2, "since": iso(10), "until": None, "from_step": 400},
    ]
    job = {
        "id": 7, "name": "mlp", "state": "running", "reason": None, "user": "alice", "priority": "normal",
        "gpu_memory_fraction": 1.0, "allocation": None, "gpu_count": 2, "total_steps": 900, "step": 500,
        "latest": {}, "attempts": 2, "crashes": 0, "max_attempts": 3, "events": [], "started_at": held[0]["since"],
        "held": held, "spec": {"model": "mlp", "time_limit_s": 3600},
    }  # fmt: skip
    lines = job_page(job)
    moment = (datetime.now(UTC) + timedelta(minutes=50)).astimezone()  # its attempt's own hour
    today = moment.date() == datetime.now().astimezone().date()  # past midnight, the date is said too
    stops = moment.strftime("%H:%M" if today else "%b %d %H:%M")
    assert row(lines, "time limit") == f"1h (stops it ~{stops})", lines
    assert row(lines, "run time") in ("40m00s over 2 attempts", "40m01s over 2 attempts"), lines
    assert row(lines, "started") and row(lines, "finished") is None
    ended = {**job, "state": "failed", "finished_at": iso(0), "held": [held[0]]}
    lines = job_page(ended)
    assert row(lines, "time limit") == "1h" and row(lines, "run time") == "30m00s", lines
    assert row(lines, "finished") is not None
    assert row(job_page({**job, "state": "queued", "held": [], "started_at": None}), "run time") is None
    warned = {**ended, "spec": {"command": ["python", "t.py"], "time_limit_s": 3600, "signal": "USR1@600"}}
    assert row(job_page(warned), "warning") == "SIGUSR1 10m before its time limit (USR1@600)"
    assert row(lines, "warning") is None


def test_towerq_queue_counts_no_time_on_hold_as_waiting() -> None:
    """WAITED: a job submitted two hours ago, an hour of it on an earlier hold and the last
    half hour on hold now, has waited half an hour."""
    from datetime import UTC, datetime, timedelta

    from towerq.cli.reports import waited_s

    now = datetime.now(UTC)
    job = {"created_at": (now - timedelta(hours=2)).isoformat(), "held_s": 3600.0, "on_hold_at": None}
    assert 3600 <= waited_s(job) < 3610
    job["on_hold_at"] = (now - timedelta(minutes=30)).isoformat()
    assert 1800 <= waited_s(job) < 1810
    assert 7200 <= waited_s({"created_at": job["created_at"]}) < 7210  # an older API's job: its age


def test_towerq_show_says_a_waiting_jobs_newest_warning_beside_its_reason() -> None:
    """A waiting job whose requirements a host could not install says so in its log alone;
    `towerq show` puts the newest warning of the attempt it waits to start under its state."""
    from towerq.cli.views import job_page, waiting_warning

    waits = "waiting for 1 free GPU on lab-a (job 7)"
    job = {
        "id": 8, "name": "python train.py", "state": "queued", "pending_reason": waits,
        "reason": f"its requirements could not be installed on lab-a (its log says why); {waits}",
        "user": "alice", "priority": "normal", "gpu_memory_fraction": 1.0, "allocation": None, "gpu_count": 1,
        "total_steps": None, "step": None, "latest": {}, "attempts": 2, "crashes": 1, "max_attempts": 3,
        "events": [], "spec": {"command": ["python", "train.py"]},
    }  # fmt: skip
    cannot = "its requirements could not be installed on lab-a while it waits: No matching distribution found for x==9"
    lines = [
        {"attempt": 1, "level": "error", "time": "2026-12-07T10:00:00+00:00", "message": "attempt 1 lost its host"},
        {"attempt": 2, "level": "warning", "time": "2026-12-07T10:05:00+00:00", "message": cannot},
        {"attempt": 2, "level": "info", "time": "2026-12-07T10:06:00+00:00", "message": "a line of no concern"},
    ]
    warned = waiting_warning(job, lines)
    assert warned is not None and warned["message"] == cannot
    page = job_page(job, warned=warned)
    assert page[1] == "  state      queued: waiting for 1 free GPU on lab-a (job 7)", "the warning says the rest"
    assert page[2].startswith("  warned     ")
    assert page[2].endswith(cannot), page
    assert waiting_warning(job, lines[:1]) is None, "an earlier attempt's is not the wait's"
    assert waiting_warning({**job, "state": "running"}, lines) is None
    unread = job_page(job)  # a log the caller may not read: no warning, the reason says where
    assert not any(line.lstrip().startswith("warned") for line in unread), "none: no row"
    assert "queued: its requirements could not be installed on lab-a (its log says why); waiting" in unread[1], unread


def test_towerq_sweep_show_says_why_no_job_is_best() -> None:
    """Its jobs succeeded but none reported the metric: the page says how to (it showed a
    column of `-` and no word)."""
    from towerq.cli.views import sweep_page

    missing = "no job that succeeded reported eval_f1: a program reports it with towerq.report(...)"
    sweep = {
        "id": 3, "name": "lr", "user": "alice", "goal": "max", "metric": "eval_f1", "fields": ["lr"], "best_job": None,
        "metric_missing": missing, "counts": {"succeeded": 1}, "done": 1, "total": 1,
        "jobs": [
            {"id": 9, "state": "succeeded", "step": 4, "total_steps": None, "result": None, "setting": {"lr": 0.1}},
        ],
    }  # fmt: skip
    assert sweep_page(sweep)[-1] == f"  ({missing})"
