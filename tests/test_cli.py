"""The CLI and the Python client against a real running service: login into a config file,
YAML specs, `submit --follow` with a live progress bar in a pseudo-terminal, exit codes a
script can trust (0 succeeded, 1 failed, 3 cancelled, 4 unreachable or refused, 2 usage),
`-o json`, idempotent submits, and a client that follows a job across an API restart."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.conftest import free_port
from tests.stack import REPO, Stack, wait_for
from towerq import AuthError, Client, UnreachableError, following

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")
FAILING_MODEL = "def build(params):\n    raise ValueError('this model is broken on purpose')\n"


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOWERQ_") or k == "TOWERQ_TRAINER_ENV_PASS"}
    return {**env, "HOME": str(home), "PYTHONPATH": str(REPO)}


def towerq(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "service.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=cli_env(home), input=stdin, timeout=240)


def in_a_terminal(home: Path, *args: str, timeout: float = 240) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal as its stdout; (exit code, everything it drew)."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "service.cli", *args],
        stdout=follower,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        env=cli_env(home),
    )
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif process.poll() is not None:
            break
    os.close(leader)
    return process.wait(30), b"".join(chunks).decode(errors="replace")


def test_login_follow_exit_codes_and_json(
    stack: Stack, settings: Settings, make_token: Callable[..., str], tmp_path: Path
) -> None:
    url = stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2)
    token = make_token("alice")
    home = tmp_path / "home"
    home.mkdir()
    wait_for(lambda: Client(url, token).request("GET", "/api/gpus"), 30, "the worker to register its GPUs")

    # Login checks the token, then saves URL and token (0600); later commands need neither.
    bad = towerq(home, "login", url, "--token", "tq_not_a_real_token")
    assert bad.returncode == 4 and "401" in bad.stderr
    login = towerq(home, "login", url, "--token", token)
    assert login.returncode == 0 and "as alice" in login.stdout, login.stderr
    config = home / ".config" / "towerq" / "config.toml"
    assert config.stat().st_mode & 0o777 == 0o600 and token in config.read_text()
    assert json.loads(towerq(home, "jobs", "-o", "json").stdout)["items"] == []

    # A YAML spec, followed in a terminal: a live bar, the final metrics, exit 0.
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: mlp\ndataset: digits\ngpu_count: 1\nhyperparameters:\n  steps: 300\n  log_every: 10\n")
    code, drawn = in_a_terminal(home, "submit", str(spec), "--follow")
    assert code == 0, drawn
    assert "[####" in drawn and "step 300/300" in drawn and "\r" in drawn, drawn[-2000:]
    assert "succeeded (loss" in drawn and "eval accuracy" in drawn
    job_id = int(drawn.split("job ")[1].split()[0])
    assert towerq(home, "follow", str(job_id)).returncode == 0  # an ended job: at once
    # with --logs, its log's lines above the progress line (an ended job's: its last thousand), each whole
    code, drawn = in_a_terminal(home, "follow", str(job_id), "--logs")
    assert code == 0 and "\n" in drawn and "info    exported the trained model" in drawn, drawn[-2000:]
    assert "log is its owner's" not in drawn
    others = towerq(home, "follow", str(job_id), "--logs", "--token", make_token("bob"))
    assert others.returncode == 0 and f"job {job_id}'s log is its owner's" in others.stdout, others.stdout
    board = towerq(home, "tensorboard", str(job_id), "--no-launch")
    assert board.returncode == 0, board.stderr
    name, _, folder = board.stdout.strip().partition(":")
    assert name == f"job-{job_id}" and list(Path(folder).glob("events.out.tfevents.*"))

    # A job that fails: exit 1, with the reason.
    (settings.models_path / "broken.py").write_text(FAILING_MODEL)
    failing = towerq(home, "submit", "-", "--follow", stdin=json.dumps({"model": "broken:build", "dataset": "digits"}))
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "failed" in failing.stdout and "broken on purpose" in failing.stdout

    # A job cancelled while followed: exit 3.
    long_spec = json.dumps({"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 10_000_000}})
    follower = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "submit", "-", "--follow"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(home),
    )
    assert follower.stdin is not None and follower.stdout is not None
    follower.stdin.write(long_spec)
    follower.stdin.close()
    first = follower.stdout.readline()
    cancelled_id = int(first.split()[1])
    wait_for(lambda: Client(url, token).job(cancelled_id).state == "running", 60, "the long job to run")
    assert towerq(home, "cancel", str(cancelled_id)).returncode == 0
    assert follower.wait(120) == 3
    follower.stdout.close()
    assert follower.stderr is not None
    follower.stderr.close()

    # Usage errors exit 2; an API that is not there exits 4.
    assert towerq(home, "submit", str(tmp_path / "missing.yaml")).returncode == 2
    assert towerq(home, "submit", str(spec), "--set", "no-equals-sign").returncode == 2
    assert towerq(home, "jobs", "--bogus").returncode == 2
    gone = towerq(home, "jobs", "--api", f"http://127.0.0.1:{free_port()}")
    assert gone.returncode == 4 and "cannot reach the API" in gone.stderr
    refused = towerq(home, "submit", "-", stdin=json.dumps({"model": "mlp", "dataset": "digits", "gpu_count": 99}))
    assert refused.returncode == 1 and "gpu_count" in refused.stderr

    # Every read command speaks JSON with -o json.
    for args in (["jobs"], ["show", str(job_id)], ["gpus"], ["queue"], ["logs", str(job_id)], ["data", "list"]):
        answer = towerq(home, *args, "-o", "json")
        assert answer.returncode == 0, (args, answer.stderr)
        json.loads(answer.stdout)
    states = {job["id"]: job["state"] for job in json.loads(towerq(home, "jobs", "-o", "json").stdout)["items"]}
    assert states[job_id] == "succeeded" and states[cancelled_id] == "cancelled"
    printed = towerq(home, "logs", str(job_id)).stdout.splitlines()
    followed = towerq(home, "logs", str(job_id), "--follow")  # an ended job: its lines once, and done
    assert followed.returncode == 0 and followed.stdout.splitlines() == printed and printed, followed.stderr
    assert towerq(home, "logs", str(job_id), "--tail", "2").stdout.splitlines() == printed[-2:]
    bad = towerq(home, "logs", str(job_id), "-n", "0")
    assert bad.returncode == 2 and "0 lines: from 1 to 20,000" in bad.stderr, bad.stderr


def test_the_python_client_follows_across_an_api_restart_and_submits_once(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    port = free_port()
    stack.spawn("api", "api", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    stack.api_url = url
    wait_for(stack._healthy, 30, "the API")
    stack.start_scheduler()
    stack.start_worker("lab-a", 1)
    token = make_token("alice")
    client = Client(url, token)
    wait_for(lambda: client.request("GET", "/api/gpus"), 30, "the worker to register its GPUs")

    spec = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 2000, "log_every": 10}}
    job = client.submit(spec, idempotency_key="exp-42")
    assert client.submit(spec, idempotency_key="exp-42").id == job.id  # a retried submit: one job

    rows: list[dict] = []
    following = threading.Thread(target=lambda: rows.extend(job.follow()), daemon=True)
    following.start()
    wait_for(lambda: len(rows) >= 5, 120, "the first metric rows")
    stack.stop("api")  # the API goes away mid-run ...
    time.sleep(2)
    stack.spawn("api", "api", "--port", str(port))  # ... and comes back
    following.join(300)
    assert not following.is_alive()
    assert job.state == "succeeded"
    train = [row["step"] for row in rows if row["split"] == "train"]
    assert train == list(range(10, 2001, 10)), "every row once, in order, across the restart"
    assert [row["step"] for row in rows if row["split"] == "eval"][-1] == 2000
    assert [row["step"] for row in job.metrics("train")] == train
    assert job.wait().state == "succeeded"

    sweep = client.sweep(
        {"name": "two", "base": {**spec, "hyperparameters": {"steps": 20}}, "grid": {"name": ["a", "b"]}}
    )
    assert [j["setting"] for j in sweep["jobs"]] == [{"name": "a"}, {"name": "b"}]
    wait_for(lambda: client.sweep_status(sweep["id"])["done"] == 2, 180, "the sweep", 1)
    assert client.sweep_status(sweep["id"])["counts"] == {"succeeded": 2}

    with pytest.raises(AuthError):
        Client(url, "tq_wrong").jobs()
    with pytest.raises(UnreachableError):
        Client(f"http://127.0.0.1:{free_port()}", token, retries=1).jobs()
    client.close()


def test_followers_that_join_mid_run_get_every_row_once(stack: Stack, make_token: Callable[..., str]) -> None:
    """A follower reads what is stored, then listens: a row published before it listened but
    written after it read (the worker writes in batches) used to be lost."""
    url = stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1)
    client = Client(url, make_token("alice"))
    wait_for(lambda: client.request("GET", "/api/gpus"), 30, "the worker to register its GPUs")
    job = client.submit({"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 3000, "log_every": 2}})
    wait_for(lambda: job.refresh().data.get("step"), 120, "the first metric rows", 0.1)

    followers: list[list[dict]] = []
    threads = []
    for _ in range(6):  # joining at different points of the worker's write cycle
        rows: list[dict] = []
        followers.append(rows)
        threads.append(threading.Thread(target=lambda rows=rows: rows.extend(client.events(job.id)), daemon=True))
        threads[-1].start()
        time.sleep(0.37)
    for thread in threads:
        thread.join(300)
        assert not thread.is_alive()
    assert job.refresh().state == "succeeded"
    for rows in followers:
        train = [row["step"] for row in rows if row["type"] == "metric"]
        assert train == list(range(2, 3001, 2)), "every row once, in order"
    client.close()


def test_usage_and_fair_share_print_what_the_api_counts(
    stack: Stack,
    tmp_path: Path,
    db: object,
    make_token: Callable[..., str],
    add_host: Callable[..., None],
) -> None:
    from tests.service.api.test_usage import add_run

    url = stack.start_api()
    add_host("lab-a", 4)
    now = datetime.now(UTC).replace(microsecond=0)
    add_run(db, "alice", "lab-a", [0, 1], now - timedelta(hours=6), now - timedelta(hours=5), now - timedelta(hours=2))
    add_run(db, "bob", "lab-a", [2], now - timedelta(hours=2), now - timedelta(hours=1), None)
    home = tmp_path / "home"
    assert towerq(home, "login", url, "--token", make_token("alice")).returncode == 0

    table = towerq(home, "usage", "--since", "1d")
    assert table.returncode == 0, table.stderr
    lines = {line.split()[0]: line.split() for line in table.stdout.splitlines()[2:]}
    assert lines["alice"][1:7] == ["6.00", "1", "1", "1h00m", "1h00m", "-"], table.stdout  # no GPU use sampled
    assert lines["bob"][1] in ("1.00", "1.01") and lines["total"][1] in ("7.00", "7.01")
    hosts = json.loads(towerq(home, "usage", "--since", "1d", "--by", "host", "-o", "json").stdout)
    assert [row["key"] for row in hosts["rows"]] == ["lab-a"] and hosts["rows"][0]["jobs"] == 2

    bad = towerq(home, "usage", "--since", "last tuesday")
    assert bad.returncode == 2 and "--since 'last tuesday'" in bad.stderr, bad.stderr

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"model": "mlp", "dataset": "digits", "gpu_count": 2}))
    dry = towerq(home, "submit", str(spec), "--dry-run")
    assert dry.returncode == 0 and "nothing submitted: it would start now on 2 GPUs of lab-a" in dry.stdout, dry.stdout
    waits = towerq(home, "submit", str(spec), "--dry-run", "--set", "gpu_count=4", "-o", "json")
    answer = json.loads(waits.stdout)
    assert answer["starts_now"] is False and answer["queue_position"] == 1  # bob holds GPU 2
    later = towerq(home, "submit", str(spec), "--dry-run", "--begin", "+3h")  # held back: its reason says so
    assert later.stdout.startswith("dry run, nothing submitted: it would not start yet: not before "), later.stdout
    assert "(its begin time); then starts ~" in later.stdout and later.stdout.rstrip().endswith("on lab-a")
    assert json.loads(towerq(home, "jobs", "-o", "json").stdout)["total"] == 2  # alice's and bob's runs only

    fair = towerq(home, "fair-share")
    assert fair.returncode == 0, fair.stderr
    rows = {line.split()[0]: line.split() for line in fair.stdout.splitlines()[2:]}
    assert rows["alice"][-1] == "-" and rows["bob"][3] == "1" and rows["bob"][-1] != "-"  # only bob is present


def test_groups_from_the_command_line(
    stack: Stack, tmp_path: Path, make_token: Callable[..., str], add_host: Callable[..., None]
) -> None:
    url = stack.start_api()
    add_host("lab-a", 4)
    admin, member = tmp_path / "admin", tmp_path / "member"
    assert towerq(admin, "login", url, "--token", make_token("root", True)).returncode == 0
    assert towerq(member, "login", url, "--token", make_token("alice")).returncode == 0

    assert "no groups yet" in towerq(member, "group", "list").stdout
    made = towerq(admin, "group", "create", "vision", "--share", "2", "--max-gpus", "3")
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines()[1].split()[:3] == ["vision", "2", "3"]
    assert towerq(admin, "group", "create", "nlp", "--max-gpu-hours", "40").returncode == 0
    quota = towerq(admin, "group", "create", "robotics", "--gpu-quota", "2")  # docs/DESIGN's name for --max-gpus
    assert quota.returncode == 0 and quota.stdout.splitlines()[1].split()[:3] == ["robotics", "1", "2"], quota
    refused = towerq(member, "group", "create", "mine")
    assert refused.returncode == 1 and "admin" in refused.stderr, refused.stderr
    bad = towerq(admin, "group", "set", "vision", "--max-gpus", "lots")
    assert bad.returncode == 2 and "--max-gpus takes a number or `none`" in bad.stderr
    assert towerq(admin, "group", "add", "vision", "alice").returncode == 0
    assert towerq(admin, "group", "add", "nlp", "alice", "--default").returncode == 0
    lines = {line.split()[0]: line for line in towerq(member, "group", "list").stdout.splitlines()[1:]}
    assert lines["nlp"].endswith("alice*") and lines["vision"].endswith("alice")
    assert "0.0 / 40" in lines["nlp"]
    unset = towerq(admin, "group", "set", "vision", "--max-gpus", "none")
    assert unset.returncode == 0 and unset.stdout.splitlines()[1].split()[2] == "-"

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"model": "mlp", "dataset": "digits"}))
    submitted = towerq(member, "submit", str(spec), "--group", "vision", "-o", "json")
    assert submitted.returncode == 0, submitted.stderr
    default = towerq(member, "submit", str(spec))
    assert default.returncode == 0
    groups = [job["group"] for job in json.loads(towerq(member, "jobs", "-o", "json").stdout)["items"]]
    assert sorted(groups) == ["nlp", "vision"]
    assert towerq(admin, "group", "delete", "robotics").returncode == 0
    outsider = towerq(member, "submit", str(spec), "--group", "robots")
    assert outsider.returncode == 1 and "there is no group 'robots'" in outsider.stderr

    tree = towerq(member, "fair-share").stdout.splitlines()
    assert [line.split()[0] for line in tree[2:]] == ["[nlp]", "alice", "[vision]", "alice"], tree
    assert "0.0 of 40 GPU-h this week" in tree[2]
    usage = json.loads(towerq(member, "usage", "--by", "group", "-o", "json").stdout)
    assert usage["by"] == "group"
    held = towerq(admin, "group", "delete", "vision")
    assert held.returncode == 1 and "waiting or running" in held.stderr

    # Reservations: GPUs kept for a group over a window.
    assert "no reservations ahead" in towerq(member, "reservation", "list").stdout
    kept = towerq(
        admin,
        "reservation",
        "create",
        "--group",
        "nlp",
        "--gpus",
        "3",
        "--start",
        "+1h",
        "--end",
        "3h30m",
        "--note",
        "ACL deadline",
    )  # fmt: skip; an offset with or without its +
    assert kept.returncode == 0, kept.stderr
    row = kept.stdout.splitlines()[1].split()
    assert row[1:3] == ["nlp", "3"] and "ahead" in row and "lab-a" in row, kept.stdout
    too_many = towerq(admin, "reservation", "create", "--group", "nlp", "--gpus", "9", "--end", "+1h")
    assert too_many.returncode == 1 and "gpus" in too_many.stderr and "the lab has 4" in too_many.stderr
    vague = towerq(admin, "reservation", "create", "--group", "nlp", "--gpus", "1", "--end", "tomorrow")
    assert vague.returncode == 2 and "--end 'tomorrow'" in vague.stderr
    listed = towerq(member, "reservation", "list").stdout.splitlines()
    assert len(listed) == 2 and "(ACL deadline)" in listed[1]
    reservation_id = listed[1].split()[0]
    gpus = towerq(member, "gpus").stdout.splitlines()  # a kept GPU is not shown as free to everyone
    assert sum("reserved for nlp from " in line and f"(reservation {reservation_id})" in line for line in gpus) == 3
    assert towerq(member, "reservation", "delete", reservation_id).returncode == 1  # admins only
    gone = towerq(admin, "reservation", "delete", reservation_id)
    assert gone.returncode == 0 and "everyone's again" in gone.stdout
    # A night's: from the next 22:00 to the 08:00 after it, the local clock's times of day
    night = towerq(admin, "reservation", "create", "--group", "nlp", "--gpus", "1", "--start", "22:00", "--end", "8:00")
    assert night.returncode == 0, night.stderr
    kept_at = json.loads(towerq(member, "reservation", "list", "-o", "json").stdout)[0]
    start, end = (datetime.fromisoformat(kept_at[key]).astimezone() for key in ("start_at", "end_at"))
    assert (start.hour, start.minute, end.hour, end.minute) == (22, 0, 8, 0), kept_at
    assert timedelta(0) < end - start < timedelta(days=1), kept_at
    assert timedelta(0) < start - datetime.now(UTC) <= timedelta(days=1), kept_at


def test_an_admin_adds_members_and_sets_their_limits_from_a_logged_in_command_line(
    stack: Stack, tmp_path: Path, make_token: Callable[..., str]
) -> None:
    """`towerq token` and `towerq user` go through the API where the command line is logged
    in: an admin's laptop adds a member, lists and revokes tokens and sets limits with no
    database at hand; a member makes a token of their own, and nothing more. Before, they
    opened the database of the folder they ran in (`./var/towerq.db`), and said it had no
    schema."""
    url = stack.start_api()
    admin, member = tmp_path / "admin", tmp_path / "member"
    assert towerq(admin, "login", url, "--token", make_token("root", True)).returncode == 0
    made = towerq(admin, "token", "create", "--user", "bob", "--name", "laptop")
    assert made.returncode == 0, made.stderr
    said, secret = made.stdout.splitlines()
    assert said.startswith("token ") and " for bob " in said and secret.startswith("tq_"), made.stdout
    assert towerq(member, "login", url, "--token", secret).returncode == 0
    listed = towerq(admin, "token", "list").stdout.splitlines()
    assert any(line.split()[1] == "bob" and "laptop" in line and line.endswith("active") for line in listed), listed
    changed = towerq(admin, "user", "set", "bob", "--gpu-limit", "2", "--share", "3")
    assert changed.stdout.strip() == "bob: admin=no gpu_limit=2 share=3 max_priority=normal", changed.stderr
    users = towerq(admin, "user", "list").stdout.splitlines()
    assert ["bob", "no", "2", "3"] in [line.split() for line in users], users
    refused = towerq(member, "user", "list")
    assert refused.returncode == 1 and "admins only" in refused.stderr, refused.stderr
    unknown = towerq(admin, "user", "set", "nobody", "--share", "2")
    assert unknown.returncode == 1 and "no user 'nobody'" in unknown.stderr, unknown.stderr
    carol = towerq(admin, "user", "create", "carol", "--admin")  # as other tools call it: a user and a first token
    assert carol.returncode == 0 and " for carol (an admin) " in carol.stdout, carol.stderr
    assert carol.stdout.splitlines()[-1].startswith("tq_")
    own = towerq(member, "token", "create", "--user", "bob", "--name", "ci")  # a token for a script
    assert own.returncode == 0 and " for bob " in own.stdout.splitlines()[0], own.stderr
    gone = towerq(admin, "token", "revoke", said.split()[1])
    assert gone.returncode == 0 and "revoked" in gone.stdout, gone.stderr
    revoked = towerq(member, "jobs")
    assert revoked.returncode != 0 and "revoked" in revoked.stderr, revoked.stderr


def test_a_follower_sees_a_job_that_ends_between_its_read_and_its_stream(
    stack: Stack,
    make_token: Callable[..., str],
    add_host: Callable[..., None],
    set_job: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A follower reads the job (running), then opens the stream; a job that ends in between
    publishes its end to nobody, and the follower used to wait on the stream forever (the
    restart test hung so in a full run). The window is forced here: the job ends just as
    the stream opens."""
    from service.core.models import JobState

    url = stack.start_api()
    add_host("lab-a", 1)
    client = Client(url, make_token("alice"))
    job = client.submit({"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 5}})
    opened = following.stream

    def ends_as_it_opens(client: Client, job_id: int):  # noqa: ANN202
        set_job(job_id, state=JobState.SUCCEEDED)  # stored, published to no one
        yield from opened(client, job_id)

    monkeypatch.setattr(following, "stream", ends_as_it_opens)
    events: list[dict] = []
    follower = threading.Thread(target=lambda: events.extend(client.events(job.id)), daemon=True)
    follower.start()
    follower.join(30)
    assert not follower.is_alive(), "the follower waits for an end it missed"
    assert events[-1] == {"type": "state", "state": "succeeded", "message": None}
    client.close()
