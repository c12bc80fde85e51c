"""Changing jobs from the command line, as a Slurm user would (`scancel`, `scontrol update`):
`towerq cancel` of several jobs, or of every one of a member's in some state; `towerq
update` of a name, and of a queued job's priority and time limit, written as durations.
Before, `towerq cancel` took one id and nothing changed a job's priority or time limit but
`PATCH /api/jobs/{id}` by hand."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import delete

from service.core.db import Database
from service.core.models import Notification
from service.core.settings import Settings
from tests.stack import Stack, wait_for
from tests.test_cli import towerq
from towerq import Client
from towerq.cli import control
from towerq.client import Job
from towerq.errors import ApiError

pytestmark = pytest.mark.slow
JOB = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 5}}


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def test_members_cancel_and_update_their_jobs_by_id_or_state(
    stack: Stack, settings: Settings, make_token: Callable[..., str], add_host: Callable[..., None], tmp_path: Path
) -> None:
    url = stack.start_api()  # no scheduler: every job stays queued
    add_host("lab-a", 4)
    tokens = {name: make_token(name, name == "root") for name in ("alice", "bob", "root")}
    for name, token in tokens.items():
        assert towerq(tmp_path / name, "login", url, "--token", token).returncode == 0
    alice, bob = Client(url, tokens["alice"]), Client(url, tokens["bob"])
    mine = [alice.submit(JOB).id for _ in range(3)]
    theirs = bob.submit(JOB).id

    # whose jobs a listing shows: --mine (as squeue --me), or --user
    listed = towerq(tmp_path / "alice", "jobs", "--mine", "-o", "json")
    assert sorted(job["id"] for job in json.loads(listed.stdout)["items"]) == mine, listed.stderr
    queue = towerq(tmp_path / "bob", "queue", "--me").stdout.splitlines()
    assert [line.split()[1] for line in queue[1:-1]] == [str(theirs)], queue
    both = towerq(tmp_path / "alice", "jobs", "--mine", "--user", "bob")
    assert both.returncode == 2 and "not allowed with argument --mine" in both.stderr, both.stderr

    # update: a name, a priority and a time limit written as a duration; only what is given
    changed = towerq(tmp_path / "alice", "update", str(mine[0]), "--priority", "low", "--time-limit", "1h30m")
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout.strip() == f"job {mine[0]} (mlp-digits), queued: priority low, time limit 1h30m"
    renamed = towerq(tmp_path / "alice", "update", str(mine[0]), "--name", "first", "--time-limit", "2-00:00:00")
    assert renamed.returncode == 0 and "named first" in renamed.stdout, renamed.stderr
    job = alice.job(mine[0]).data
    assert (job["name"], job["priority"], job["spec"]["time_limit_s"]) == ("first", "low", 2 * 86400), job
    shown = towerq(tmp_path / "alice", "show", str(mine[0])).stdout
    assert "  time limit 48h" in shown.splitlines(), shown
    for args, code, said in (
        ((), 2, "say what changes: --name, --priority, --time-limit or --begin"),
        (("--time-limit", "5x"), 2, "'5x' is no duration: give seconds (5400), units (90m"),
        (("--priority", "high"), 1, "priority high is for admins"),
    ):
        refused = towerq(tmp_path / "alice", "update", str(mine[1]), *args)
        assert refused.returncode == code and said in refused.stderr, (args, refused.stderr)
    others = towerq(tmp_path / "alice", "update", str(theirs), "--name", "mine-now")
    assert others.returncode == 1 and "belongs to bob" in others.stderr, others.stderr

    # cancel: several ids, each said; one that cannot be is said on stderr, the others go on
    cancelled = towerq(tmp_path / "alice", "cancel", str(mine[0]), "999999", str(theirs))
    assert cancelled.returncode == 1, cancelled
    assert cancelled.stdout.splitlines() == [f"job {mine[0]}: cancelled", "1 of 3 jobs cancelled, 2 refused"]
    assert "job 999999 not found" in cancelled.stderr and "belongs to bob" in cancelled.stderr, cancelled.stderr
    assert bob.job(theirs).state == "queued"
    stale = towerq(tmp_path / "alice", "cancel", str(mine[0]), str(theirs), "--token", "tq_revoked_long_ago")
    assert stale.returncode == 4 and stale.stdout == "", "a token the API refuses is the command's failure, once"
    assert stale.stderr.strip() == (
        "towerq: 401: invalid token: this API does not take the token (revoked, or another API's); "
        "`towerq login URL --token TOKEN` saves another"
    ), stale.stderr

    # by state: every queued job of the caller's own, never another's
    refused = towerq(tmp_path / "alice", "cancel", "--user", "bob")
    assert refused.returncode == 1 and "only admins cancel another member's jobs" in refused.stderr, refused.stderr
    mixed = towerq(tmp_path / "alice", "cancel", str(mine[1]), "--state", "queued")
    assert mixed.returncode == 2 and "not both" in mixed.stderr, mixed.stderr
    assert towerq(tmp_path / "alice", "cancel").returncode == 2
    swept = towerq(tmp_path / "alice", "cancel", "--state", "queued")
    assert swept.returncode == 0, swept.stderr
    assert swept.stdout.splitlines() == [
        f"job {mine[1]}: cancelled",
        f"job {mine[2]}: cancelled",
        "2 of 2 jobs cancelled",
    ]
    assert [alice.job(i).state for i in mine] == ["cancelled"] * 3 and bob.job(theirs).state == "queued"
    again = towerq(tmp_path / "alice", "cancel", "--state", "queued")
    assert again.returncode == 0 and again.stdout.strip() == "no job of yours is queued: nothing cancelled", again

    # an admin cancels a member's jobs by name
    admin = towerq(tmp_path / "root", "cancel", "--user", "bob")
    assert admin.returncode == 0 and admin.stdout.strip() == f"job {theirs}: cancelled", admin.stderr


def test_members_hold_and_release_their_queued_jobs_and_admins_hold_anyones(
    stack: Stack, settings: Settings, make_token: Callable[..., str], add_host: Callable[..., None], tmp_path: Path
) -> None:
    """`towerq hold` and `towerq release`, as Slurm's `scontrol hold` and `release`: by id or
    every job of yours (--all); an admin's hold on a member's job is the admin's to release."""
    url = stack.start_api()  # no scheduler: every job stays queued
    add_host("lab-a", 4)
    tokens = {name: make_token(name, name == "root") for name in ("alice", "root")}
    for name, token in tokens.items():
        assert towerq(tmp_path / name, "login", url, "--token", token).returncode == 0
    alice = Client(url, tokens["alice"])
    jobs = [alice.submit(JOB).id for _ in range(3)]

    held = towerq(tmp_path / "alice", "hold", "--all")
    assert held.returncode == 0, held.stderr
    assert held.stdout.splitlines()[0] == f"job {jobs[0]}: on hold (towerq release {jobs[0]} lets it start)"
    assert held.stdout.splitlines()[-1] == "3 of 3 jobs put on hold"
    shown = towerq(tmp_path / "alice", "show", str(jobs[0])).stdout
    assert f"  state      queued: on hold (alice): towerq release {jobs[0]} lets it start" in shown.splitlines(), shown
    queue = towerq(tmp_path / "alice", "queue").stdout
    assert f"on hold (alice): towerq release {jobs[1]} lets it start" in queue, queue

    admin = towerq(tmp_path / "root", "hold", str(jobs[2]))
    assert admin.returncode == 0, admin.stderr
    released = towerq(tmp_path / "alice", "release", "--all")
    assert released.returncode == 1, released
    assert released.stdout.splitlines() == [
        f"job {jobs[0]}: released, queued", f"job {jobs[1]}: released, queued", "2 of 3 jobs released, 1 refused"
    ]  # fmt: skip
    assert f"job {jobs[2]} was put on hold by root, an admin: only an admin may release it" in released.stderr
    again = towerq(tmp_path / "alice", "release", str(jobs[0]))
    assert again.returncode == 1 and f"job {jobs[0]} is not on hold" in again.stderr, again.stderr
    nothing = towerq(tmp_path / "alice", "hold")
    assert nothing.returncode == 2 and "towerq hold ID [ID ...], or --all, or --user NAME" in nothing.stderr
    assert towerq(tmp_path / "root", "release", "--user", "alice").stdout.strip() == f"job {jobs[2]}: released, queued"
    assert [alice.job(i).data["on_hold_by"] for i in jobs] == [None, None, None]

    spec = tmp_path / "spec.json"  # queued on hold from the start (as sbatch --hold)
    spec.write_text(json.dumps(JOB))
    submitted = towerq(tmp_path / "alice", "submit", str(spec), "--hold")
    assert submitted.returncode == 0, submitted.stderr
    said = submitted.stdout.strip()
    assert said.endswith(", queued on hold: towerq release " + said.split()[1] + " lets it start"), said
    assert alice.job(int(said.split()[1])).data["on_hold_by"] == "alice"


def test_hold_all_leaves_out_a_job_that_is_starting(
    stack: Stack, settings: Settings, make_token: Callable[..., str], add_host: Callable[..., None], tmp_path: Path
) -> None:
    """`towerq hold --all` on a lab of GPU hosts picks queued jobs only: a dispatched job is
    starting and cannot be held (on Slurm, where one waits pending, it is picked: see
    tests/test_slurm.py). Before, it was tried and skipped with a line of its own."""
    url = stack.start_api()
    add_host("lab-a", 1)
    stack.start_scheduler()  # no worker: the first job is placed and stays dispatched
    token = make_token("alice")
    assert towerq(tmp_path / "alice", "login", url, "--token", token).returncode == 0
    alice = Client(url, token)
    starting = alice.submit(JOB).id
    wait_for(lambda: alice.job(starting).data["state"] == "dispatched", 30, "the pass to place it")
    waiting = alice.submit(JOB).id
    held = towerq(tmp_path / "alice", "hold", "--all")
    assert held.returncode == 0, held.stderr
    assert held.stdout.splitlines() == [f"job {waiting}: on hold (towerq release {waiting} lets it start)"]
    named = towerq(tmp_path / "alice", "hold", str(starting))  # named, it is refused as before
    assert named.returncode == 1 and f"job {starting} is dispatched" in named.stderr, named


def test_a_chosen_job_that_moved_on_meanwhile_is_skipped_and_fails_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """Jobs picked by a filter were read a moment before they are acted on: one that moved
    on meanwhile (the API's 409: it started, ended or was released) is skipped, said on
    stdout, and the command succeeds; a job named by id and refused fails it."""

    def hold(job_id: int) -> Job:
        if job_id == 1:
            raise ApiError(409, "job 1 is running: only a queued job is put on hold (towerq cancel stops it)")
        return Job(Client("http://127.0.0.1:1", "token"), {"id": job_id, "state": "queued"})

    said = "job {0.id}: on hold".format
    assert control.each([1, 2], hold, said, "put on hold", chosen=True) == 0
    assert capsys.readouterr().out.splitlines() == [
        "skipped: job 1 is running: only a queued job is put on hold (towerq cancel stops it)",
        "job 2: on hold",
        "1 of 2 jobs put on hold, 1 skipped",
    ]
    assert control.each([1, 2], hold, said, "put on hold", chosen=False) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == ["job 2: on hold", "1 of 2 jobs put on hold, 1 refused"]
    assert err.strip() == "towerq: job 1 is running: only a queued job is put on hold (towerq cancel stops it)"


def test_a_job_submitted_to_begin_later_waits_and_starts_when_its_begin_is_moved_to_now(
    stack: Stack, settings: Settings, make_token: Callable[..., str], add_host: Callable[..., None], tmp_path: Path
) -> None:
    """`towerq submit --begin +2h` (as `sbatch --begin=now+2hours`): queued, saying until when
    it waits; `towerq update ID --begin now` lets it start (as `scontrol update StartTime=`)."""
    url = stack.start_api()
    add_host("lab-a", 1)
    stack.start_scheduler()  # no worker: a job placed stays dispatched
    token = make_token("alice")
    assert towerq(tmp_path / "alice", "login", url, "--token", token).returncode == 0
    alice = Client(url, token)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(JOB))
    submitted = towerq(tmp_path / "alice", "submit", str(spec), "--begin", "+2h")
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout.split()[1])
    job = alice.job(job_id)
    begins = job.data["spec"]["begin_at"]
    clock = datetime.fromisoformat(begins).astimezone()
    today = clock.date() == datetime.now().astimezone().date()
    shown = clock.strftime("%H:%M" if today else "%b %d %H:%M")
    assert submitted.stdout.strip().endswith(
        f", queued, not before {shown} (towerq update {job_id} --begin now lets it start)"
    )
    reason = wait_for(lambda: alice.job(job_id).data["pending_reason"], 30, "the pass to say why it waits")
    assert reason.startswith("not before ") and reason.endswith(
        f"(its begin time: towerq update {job_id} --begin now lets it start)"
    )
    # the replay of expected starts has it join the queue at its begin: on the free GPU, then
    expected = wait_for(lambda: alice.job(job_id).data["expected_start_at"], 30, "the replay to expect its start")
    assert abs((datetime.fromisoformat(expected) - datetime.fromisoformat(begins)).total_seconds()) < 2
    shows = towerq(tmp_path / "alice", "show", str(job_id)).stdout
    assert f"  not before {shown}" in shows and re.search(r"\n\s*starts\s+~.* on lab-a\n", shows), shows
    moved = towerq(tmp_path / "alice", "update", str(job_id), "--begin", "now")
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout.startswith(f"job {job_id} (mlp-digits), queued: not before "), moved.stdout
    wait_for(lambda: alice.job(job_id).data["state"] == "dispatched", 30, "the pass to place it")
    late = towerq(tmp_path / "alice", "update", str(job_id), "--begin", "+1h")
    assert (
        late.returncode == 1
        and f"job {job_id} is dispatched: its begin changes only before it first runs" in late.stderr
    )


def test_admins_drain_and_undrain_gpus_from_the_command_line(
    stack: Stack, settings: Settings, make_token: Callable[..., str], add_host: Callable[..., None], tmp_path: Path
) -> None:
    """`towerq gpus drain HOST INDEX...`, as Slurm's `scontrol update state=drain`: each GPU
    said, with the jobs that finish on it; one the API refuses is said on stderr and the
    others go on; a member is refused. Before, only the dashboard or the API drained a GPU."""
    url = stack.start_api()
    add_host("lab-a", 2)
    stack.start_scheduler()  # no worker: the job placed stays dispatched on its GPU
    for name in ("alice", "root"):
        assert towerq(tmp_path / name, "login", url, "--token", make_token(name, name == "root")).returncode == 0
    alice = Client(url, make_token("alice"))
    held = alice.submit({**JOB, "gpus": [0]}).id
    wait_for(lambda: alice.job(held).data["state"] == "dispatched", 30, "the pass to place it")

    drained = towerq(tmp_path / "root", "gpus", "drain", "lab-a", "0", "7", "1")
    assert drained.returncode == 1, drained
    assert drained.stdout.splitlines() == [
        f"lab-a GPU 0: drained; job {held} (alice) finishes on it",
        "lab-a GPU 1: drained",
    ]
    assert drained.stderr.strip() == "towerq: no GPU 7 on host lab-a", drained.stderr
    listed = towerq(tmp_path / "alice", "gpus").stdout.splitlines()
    assert all("drained" in line for line in listed[1:]), listed
    assert alice.job(held).data["state"] == "dispatched", "a drain lets the job finish"

    member = towerq(tmp_path / "alice", "gpus", "undrain", "lab-a", "1")
    assert member.returncode == 1 and "admin" in member.stderr, member
    back = towerq(tmp_path / "root", "gpus", "undrain", "lab-a", "1", "-o", "json")
    assert back.returncode == 0, back.stderr
    assert [(g["index"], g["drained"]) for g in json.loads(back.stdout)] == [(0, True), (1, False)]
    for args, said in (
        (("gpus", "drain"), "towerq gpus drain HOST INDEX...: which GPUs? (`towerq gpus` lists them)"),
        (("gpus", "undrain", "lab-a"), "towerq gpus undrain HOST INDEX...: which GPUs?"),
        (("gpus", "lab-a"), "invalid choice: 'lab-a'"),
    ):
        refused = towerq(tmp_path / "root", *args)
        assert refused.returncode == 2 and said in refused.stderr, (args, refused.stderr)


def test_a_member_lists_a_jobs_webhooks_and_sends_a_failed_one_again(
    stack: Stack, db: Database, make_token: Callable[..., str], add_host: Callable[..., None], tmp_path: Path
) -> None:
    """`towerq show` lists a job's webhook deliveries and says how a failed one is sent
    again; `towerq webhooks ID --resend N` sends it (its owner; another member is refused, as
    is a delivery on its way). Before, only the job page showed them and sent one again."""
    url = stack.start_api()
    add_host("lab-a", 1)
    for name in ("alice", "bob"):
        assert towerq(tmp_path / name, "login", url, "--token", make_token(name)).returncode == 0
    alice = Client(url, make_token("alice"))
    job_id = alice.submit({**JOB, "notify_url": "https://hooks.example/ours"}).id
    alice.cancel(job_id)  # queued: cancelled now
    with db.write() as session:
        session.execute(delete(Notification).where(Notification.job_id == job_id))  # none sent: this test's rows
        failed = Notification(job_id=job_id, url="https://hooks.example/ours", state="failed", attempts=9,
                              last_error="HTTP 500")  # fmt: skip
        delivered = Notification(job_id=job_id, event="job.idle", state="delivered", attempts=1,
                                 delivered_at=datetime.now(UTC))  # fmt: skip
        session.add_all([failed, delivered])
        session.flush()
        ids = failed.id, delivered.id

    shown = towerq(tmp_path / "alice", "show", str(job_id)).stdout.splitlines()
    at = shown.index("  webhooks")
    assert (
        shown[at + 1]
        == f"    #{ids[0]:<5} job.finished    failed after 9 attempts: HTTP 500  to https://hooks.example/ours"
    )
    assert re.fullmatch(rf"    #{ids[1]:<5} job\.idle        delivered .+  to the lab's webhook", shown[at + 2]), shown
    assert shown[at + 3] == (
        f"    (a failed one is sent again once its receiver is mended: towerq webhooks {job_id} --resend N)"
    )
    assert towerq(tmp_path / "alice", "webhooks", str(job_id)).stdout.splitlines() == [s[4:] for s in shown[at + 1 :]]

    theirs = towerq(tmp_path / "bob", "webhooks", str(job_id), "--resend", str(ids[0]))
    assert theirs.returncode == 1 and "only they or an admin may send its webhooks again" in theirs.stderr, theirs
    sent = towerq(tmp_path / "alice", "webhooks", str(job_id), "--resend", str(ids[0]))
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.strip() == f"job {job_id}: webhook #{ids[0]} (job.finished) sent again"
    again = towerq(tmp_path / "alice", "webhooks", str(job_id), "--resend", str(ids[0]))
    assert again.returncode == 1 and "on its way" in again.stderr, again
    listed = json.loads(towerq(tmp_path / "alice", "webhooks", str(job_id), "-o", "json").stdout)
    assert [(n["id"], n["state"], n["attempts"]) for n in listed] == [(ids[0], "pending", 0), (ids[1], "delivered", 1)]

    quiet = alice.submit(JOB).id  # no notify_url, nor the lab's
    said = towerq(tmp_path / "alice", "webhooks", str(quiet)).stdout.strip()
    assert said.endswith(": no webhook yet (one goes when it ends or its GPUs idle, to its notify_url or the lab's)")
    alice.cancel(quiet)  # owes the lab's webhook (these tests' TOWERQ_WEBHOOK_URL) its end
    said = towerq(tmp_path / "alice", "webhooks", str(quiet)).stdout.strip()
    assert re.fullmatch(r"#\d+ +job\.finished +pending  to the lab's webhook", said), said
