"""Client commands: talk to the REST API at TOWERQ_API_URL with a token.

The token is `--token`, else TOWERQ_TOKEN, else the file written by `towerq login`
(~/.config/towerq/token), else `var/admin-token` of a local `towerq up`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from service.cli.follow import follow_job
from service.exceptions import SpecError
from service.settings import Settings
from service.sweeps import set_dotted
from towerq import AuthError, Client
from towerq.client import write_config


class ClientError(Exception):
    """Something a client command could not do; the message is for people (exit code 1)."""


class UsageError(ClientError):
    """The command line or its input is wrong (exit code 2)."""


def add_commands(commands: Any) -> None:
    def command(name: str, help_text: str, read: bool = False) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = commands.add_parser(name, help=help_text)
        sub.add_argument("--api", default=None, help="API URL (default TOWERQ_API_URL)")
        sub.add_argument("--token", default=None, help="API token (default TOWERQ_TOKEN or `towerq login`)")
        if read:
            sub.add_argument(
                "-o", "--output", dest="output_format", choices=("table", "json"), default="table",
                help="json: the API's answer, for scripts",
            )  # fmt: skip
        return sub

    login = commands.add_parser("login", help="save the API's URL and your token for the client commands")
    login.add_argument("url", help="the API, e.g. https://towerq.lab.example (a bare token: the default URL)")
    login.add_argument("--token", default=None, help="your token (default TOWERQ_TOKEN, else asked for)")
    login.set_defaults(run=run_login)

    submit = command("submit", "submit a job spec (JSON file, or - for stdin)")
    submit.add_argument("spec", help="path of a JSON job spec, or -")
    submit.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a field, e.g. hyperparameters.steps=500",
    )
    submit.add_argument(
        "--follow", "--wait", action="store_true", help="follow the job until it ends (exit code: how it ended)"
    )
    submit.add_argument(
        "--code",
        type=Path,
        default=None,
        metavar="PATH",
        help="upload a .py file or a folder as the job's code bundle (model: module:function in it)",
    )
    submit.add_argument(
        "--dry-run", action="store_true", help="submit nothing: check the spec and say when it would start"
    )
    submit.add_argument("-o", "--output", dest="output_format", choices=("table", "json"), default="table")
    submit.set_defaults(run=run_submit)

    jobs = command("jobs", "list jobs, newest first", read=True)
    jobs.add_argument("--state", action="append", default=None)
    jobs.add_argument("--user", default=None)
    jobs.add_argument("--limit", type=int, default=20)
    jobs.set_defaults(run=run_jobs)

    show = command("show", "one job, as JSON", read=True)
    show.add_argument("id", type=int)
    show.set_defaults(run=run_show)

    cancel = command("cancel", "cancel a job")
    cancel.add_argument("id", type=int)
    cancel.set_defaults(run=run_cancel)

    share = command("share", "let every member read a job's log, artifacts and code (--private: only you again)")
    share.add_argument("id", type=int)
    share.add_argument("--private", action="store_true", help="only you and the admins (a new job's default)")
    share.set_defaults(run=run_share)

    logs = command("logs", "a job's trainer log", read=True)
    logs.add_argument("id", type=int)
    logs.add_argument("--follow", "-f", action="store_true")
    logs.set_defaults(run=run_logs)

    gpus = command("gpus", "every GPU and who holds it", read=True)
    gpus.set_defaults(run=run_gpus)

    sweep = command("sweep", "launch a sweep (YAML or JSON: name, base, grid or random, metric, goal, max_parallel)")
    sweep.add_argument("spec", help="the sweep's file, or -")
    sweep.add_argument("--follow", action="store_true", help="follow it until every job ended")
    sweep.set_defaults(run=run_sweep)

    follow = command("follow", "follow a job live until it ends (exit code: 0 succeeded, 1 failed, 3 cancelled)")
    follow.add_argument("id", type=int)
    follow.set_defaults(run=run_follow)

    queue = command("queue", "jobs waiting, in the order they will start, and why they wait", read=True)
    queue.add_argument("--user", default=None)
    queue.set_defaults(run=run_queue)

    usage = command("usage", "GPU hours, jobs and waits per user or host over a time window", read=True)
    usage.add_argument("--since", default="7d", help="ISO time, or an age: 30m, 24h, 7d (default 7d)")
    usage.add_argument("--until", default=None, help="ISO time, or an age (default now)")
    usage.add_argument("--by", choices=("user", "host"), default="user")
    usage.set_defaults(run=run_usage)

    fair = command(
        "fair-share", "each user's decayed usage, share and the rank term the scheduler gives them", read=True
    )
    fair.set_defaults(run=run_fair_share)

    tensorboard = command("tensorboard", "download jobs' TensorBoard events and start TensorBoard on them")
    tensorboard.add_argument("ids", type=int, nargs="+", metavar="ID")
    tensorboard.add_argument("--port", type=int, default=6006)
    tensorboard.add_argument("--no-launch", action="store_true", help="only download, print the --logdir_spec")
    tensorboard.set_defaults(run=run_tensorboard)

    data = commands.add_parser("data", help="your datasets: upload, list, rm")
    data_actions = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    for action, help_text in (
        ("upload", "upload an .npz, a .tfrecord, or a folder / .zip of images (one sub-folder per class)"),
        ("list", "your datasets and the lab's shared ones, with your quota"),
        ("rm", "delete one of your datasets"),
    ):
        sub = data_actions.add_parser(action, help=help_text)
        sub.add_argument("--api", default=None, help="API URL (default TOWERQ_API_URL)")
        sub.add_argument("--token", default=None, help="API token (default TOWERQ_TOKEN or `towerq login`)")
        if action == "list":
            sub.add_argument("-o", "--output", dest="output_format", choices=("table", "json"), default="table")
        if action in ("upload", "rm"):
            sub.add_argument("name", help="the dataset's name (letters, digits, _ . -)")
        if action == "upload":
            sub.add_argument("path", type=Path, help="the file, or a folder of images")
        sub.set_defaults(run={"upload": run_data_upload, "list": run_data_list, "rm": run_data_rm}[action])

    download = command("download", "download a job's artifacts: all of them, a folder, or one file")
    download.add_argument("id", type=int)
    download.add_argument("path", nargs="?", default=None, help="a file or folder in the job's artifacts (default all)")
    download.add_argument("-o", "--output", type=Path, default=Path("."), help="folder to put it in (default .)")
    download.set_defaults(run=run_download)


class Api:
    """The CLI's view of `towerq.Client` (the Python client): URL and token from the
    options, the environment or `towerq login`'s config file."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.client = Client(url=args.api, token=args.token, retries=2)
        self.url = self.client.url
        if not self.client.config.token:
            raise AuthError(401, "no token: pass --token, set TOWERQ_TOKEN, or run `towerq login URL`")

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.client.request(method, path, **kwargs)

    def download(self, path: str, target: Path) -> httpx.Headers:
        """Stream `path` into `target`, with a progress line on a terminal."""
        progress: Progress | None = None

        def show(received: int, total: int | None) -> None:
            nonlocal progress
            progress = progress or Progress(target.name, total)
            progress.advance(received - progress.received)

        headers = self.client.stream_to(path, target, show)
        (progress or Progress(target.name, 0)).done()
        return headers


class Progress:
    """`name  12.3 MB / 40.0 MB  31%  8.1 MB/s` redrawn in place on a terminal; one line at
    the end otherwise."""

    def __init__(self, name: str, total: int | None) -> None:
        self.name, self.total, self.received = name, total, 0
        self.started = self.drawn = time.monotonic()
        self.live = sys.stderr.isatty()

    def advance(self, count: int) -> None:
        self.received += count
        if self.live and time.monotonic() - self.drawn >= 0.1:
            self.drawn = time.monotonic()
            print(f"\r{self._line()}", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        print(("\r" if self.live else "") + self._line(), file=sys.stderr, flush=True)

    def _line(self) -> str:
        rate = self.received / max(time.monotonic() - self.started, 1e-6)
        size = _bytes(self.received) + (f" / {_bytes(self.total)}" if self.total else "")
        share = f"  {100 * self.received / self.total:3.0f}%" if self.total else ""
        return f"{self.name}  {size}{share}  {_bytes(rate)}/s\x1b[K" if self.live else f"{self.name}  {size}"


def _bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"


def run_login(args: argparse.Namespace) -> int:
    """Check the URL and token against the API, then save both in the config file (0600)."""
    import getpass

    url, token = args.url, args.token
    if url.startswith("tq_") and token is None:  # `towerq login TOKEN`, as before
        url, token = Settings().api_url, url
    token = token or os.environ.get("TOWERQ_TOKEN") or getpass.getpass("token: ").strip()
    with Client(url=url, token=token, retries=1) as client:
        me = client.request("GET", "/api/me")
    path = write_config(client.url, token)
    print(f"logged in to {client.url} as {me['user']}{' (admin)' if me['is_admin'] else ''}; saved in {path}")
    return 0


def set_field(spec: dict[str, Any], assignment: str) -> None:
    """Apply `a.b=value` to `spec`; the value is JSON when it parses, else a string."""
    path, sep, raw = assignment.partition("=")
    if not sep or not path:
        raise UsageError(f"--set expects FIELD=VALUE, got {assignment!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    try:
        set_dotted(spec, path, value)
    except SpecError as err:
        raise UsageError(f"--set {assignment!r}: {err}") from None


def read_spec(source: str) -> dict[str, Any]:
    """A spec from a YAML or JSON file (or `-`: standard input); JSON is YAML too."""
    import yaml

    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
        spec = yaml.safe_load(text)
    except OSError as err:
        raise UsageError(f"cannot read the spec: {err}") from err
    except yaml.YAMLError as err:
        raise UsageError(f"the spec is neither YAML nor JSON: {err}") from err
    if not isinstance(spec, dict):
        raise UsageError("the spec must be a mapping of fields (model, dataset, ...)")
    return spec


def run_submit(args: argparse.Namespace) -> int:
    spec = read_spec(args.spec)
    for assignment in args.set:
        set_field(spec, assignment)
    api = Api(args)
    if args.dry_run:
        if args.code is not None:
            raise UsageError("--dry-run does not upload --code: check the spec without it, or submit")
        answer = api.call("POST", "/api/jobs", params={"dry_run": "true"}, json=spec)
        if args.output_format == "json":
            return _json(answer)
        print(f"dry run, nothing submitted: {dry_run_line(answer)}")
        return 0
    if args.code is not None:
        spec["code"] = upload_code(api, args.code)
    job = api.client.submit(spec)
    print(f"job {job.id} submitted ({job.name}), {job.state}", flush=True)
    if args.follow:
        return follow_job(api.client, job.id)
    return 0


SKIPPED_FOLDERS = {".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
                   ".ipynb_checkpoints", "node_modules", ".tox", ".nox"}  # fmt: skip
CODE_FILE_LIMIT_BYTES = 10_000_000
"""Larger files are left out of a bundle: data and weights do not belong in code (upload a
dataset instead)."""


def pack_folder(folder: Path) -> tuple[bytes, int, list[str]]:
    """`folder` as a .tar.gz of its code: (the archive, files packed, what was left out and why)."""
    import io
    import tarfile

    skipped: list[str] = []
    count = 0
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for current, subfolders, names in os.walk(folder):
            here = Path(current)
            for name in sorted(subfolders):
                path = here / name
                if name in SKIPPED_FOLDERS or (path / "pyvenv.cfg").exists() or path.is_symlink():
                    why = (
                        "a virtual environment"
                        if (path / "pyvenv.cfg").exists()
                        else "a link"
                        if path.is_symlink()
                        else ""
                    )
                    skipped.append(f"{path.relative_to(folder)}/" + (f" ({why})" if why else ""))
                    subfolders.remove(name)
            subfolders.sort()
            for name in sorted(names):
                path = here / name
                relative = path.relative_to(folder).as_posix()
                if path.is_symlink() or not path.is_file():
                    skipped.append(f"{relative} (a link)" if path.is_symlink() else f"{relative} (not a file)")
                elif name.endswith((".pyc", ".pyo")):
                    continue
                elif path.stat().st_size > CODE_FILE_LIMIT_BYTES:
                    skipped.append(f"{relative} ({_bytes(path.stat().st_size)}, over {_bytes(CODE_FILE_LIMIT_BYTES)})")
                else:
                    archive.add(path, arcname=relative, recursive=False)
                    count += 1
    return buffer.getvalue(), count, skipped


def upload_code(api: Api, path: Path) -> str:
    """Upload `path` (a .py file or a folder) as a code bundle; returns its id."""
    if path.is_dir():
        data, count, skipped = pack_folder(path)
        if not count:
            raise ClientError(f"--code {path}: no files to upload")
        name = f"{path.resolve().name or 'code'}.tar.gz"
    elif path.is_file():
        data, count, skipped, name = path.read_bytes(), 1, [], path.name
    else:
        raise ClientError(f"--code {path}: no such file or folder")
    bundle = api.call("POST", "/api/code", files={"file": (name, data)})
    note = f"; left out: {', '.join(skipped)}" if skipped else ""
    print(f"code: {count} files, {_bytes(bundle['size'])}, bundle {bundle['id'][:12]}{note}")
    return str(bundle["id"])


def run_jobs(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    if args.state:
        params["state"] = args.state
    if args.user:
        params["user"] = args.user
    page = Api(args).call("GET", "/api/jobs", params=params)
    if args.output_format == "json":
        return _json(page)
    print(f"{'ID':>5}  {'STATE':<10} {'USER':<12} {'GPUS':<14} {'STEP':>12}  NAME / WHY WAITING")
    for job in page["items"]:
        allocation = job["allocation"]
        where = (
            f"{allocation['host']}:{','.join(map(str, allocation['gpus']))}" if allocation else f"{job['gpu_count']}×"
        )
        step = f"{job['step'] or 0}/{job['total_steps']}"
        extra = f"  — {job['pending_reason']}" if job["state"] == "queued" and job["pending_reason"] else ""
        if job["state"] == "queued" and job.get("expected_start_at"):
            extra += f"; starts {_expected(job)}"
        user = job["user"][:12]
        print(f"{job['id']:>5}  {job['state']:<10} {user:<12} {where[:14]:<14} {step:>12}  {job['name']}{extra}")
    print(f"({len(page['items'])} of {page['total']})")
    return 0


def run_show(args: argparse.Namespace) -> int:
    return _json(Api(args).call("GET", f"/api/jobs/{args.id}"))


def _json(value: Any) -> int:
    print(json.dumps(value, indent=2))
    return 0


def run_sweep(args: argparse.Namespace) -> int:
    api = Api(args)
    sweep = api.call("POST", "/api/sweeps", json=read_spec(args.spec))
    ids = [job["id"] for job in sweep["jobs"]]
    print(f"sweep {sweep['id']} ({sweep['name']}): {sweep['total']} jobs, {ids[0]}-{ids[-1]}", flush=True)
    if not args.follow:
        return 0
    live = sys.stdout.isatty()
    shown = ""
    while sweep["done"] < sweep["total"]:
        time.sleep(2)
        sweep = api.call("GET", f"/api/sweeps/{sweep['id']}")
        line = _sweep_line(sweep)
        if live:
            print(f"\r{line}\x1b[K", end="", flush=True)
        elif line != shown:
            print(line, flush=True)
        shown = line
    if live:
        print()
    print(_sweep_line(sweep), flush=True)
    counts = sweep["counts"]
    if counts.get("failed"):
        return 1
    return 3 if counts.get("cancelled") else 0


def _sweep_line(sweep: dict[str, Any]) -> str:
    states = ", ".join(f"{state} {n}" for state, n in sorted(sweep["counts"].items()))
    line = f"sweep {sweep['id']}: {sweep['done']}/{sweep['total']} done ({states})"
    best = next((job for job in sweep["jobs"] if job["id"] == sweep["best_job"]), None)
    if best is not None:
        line += f"; best: job {best['id']}, {sweep['metric']} {best['result']:.4g}"
    return line


def run_follow(args: argparse.Namespace) -> int:
    return follow_job(Api(args).client, args.id)


def run_queue(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"state": ["queued"], "limit": 500}
    if args.user:
        params["user"] = args.user
    page = Api(args).call("GET", "/api/jobs", params=params)
    waiting = sorted(page["items"], key=lambda job: (job["queue_position"] or 1e9, job["id"]))
    if args.output_format == "json":
        return _json(waiting)
    print(f"{'#':>4} {'ID':>6}  {'USER':<12} {'PRIORITY':<8} {'GPUS':>4}  {'WAITED':>8}  {'STARTS':<22} WHY")
    for job in waiting:
        waited = _age(job["created_at"])
        starts = _expected(job) if job.get("expected_start_at") else "-"
        print(
            f"{job['queue_position'] or '-':>4} {job['id']:>6}  {job['user'][:12]:<12} {job['priority']:<8} "
            f"{job['gpu_count']:>4}  {waited:>8}  {starts:<22} {job['pending_reason'] or ''}"
        )
    print(f"({len(waiting)} waiting)")
    return 0


AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def when_from(text: str, option: str) -> str:
    """An ISO time as given, or `30m` / `24h` / `7d` ago as an ISO time."""
    from datetime import UTC, datetime, timedelta

    unit = AGE_UNITS.get(text[-1:])
    if unit is not None and text[:-1].replace(".", "", 1).isdigit():
        return (datetime.now(UTC) - timedelta(seconds=float(text[:-1]) * unit)).isoformat()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{option} {text!r}: give an ISO time (2026-11-23T09:00Z) or an age (30m, 24h, 7d)") from None
    return (moment if moment.tzinfo else moment.astimezone()).isoformat()


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def run_usage(args: argparse.Namespace) -> int:
    params = {"since": when_from(args.since, "--since"), "by": args.by}
    if args.until:
        params["until"] = when_from(args.until, "--until")
    answer = Api(args).call("GET", "/api/usage", params=params)
    if args.output_format == "json":
        return _json(answer)
    print(f"{answer['since'][:16]} to {answer['until'][:16]} (UTC)")
    print(f"{args.by.upper():<16} {'GPU HOURS':>10} {'JOBS':>6} {'STARTED':>8} {'WAIT P50':>9} {'WAIT P95':>9}")
    for row in answer["rows"]:
        print(
            f"{row['key'][:16]:<16} {row['gpu_hours']:>10.2f} {row['jobs']:>6} {row['started']:>8} "
            f"{_duration(row['median_wait_s']):>9} {_duration(row['p95_wait_s']):>9}"
        )
    total = sum(row["gpu_hours"] for row in answer["rows"])
    print(f"{'total':<16} {total:>10.2f}")
    return 0


def run_fair_share(args: argparse.Namespace) -> int:
    answer = Api(args).call("GET", "/api/fair-share")
    if args.output_format == "json":
        return _json(answer)
    half_life = answer["half_life_s"] / 3600
    print(f"usage decays with a half-life of {half_life:g} h; a lower term goes first (0: used nothing, 0.5: fair)")
    heads = ("SHARE", 6), ("USAGE GPU-H", 12), ("RUNNING", 8), ("QUEUED", 7), ("OWED", 6), ("USED", 6), ("TERM", 6)
    print(f"{'USER':<16} " + " ".join(f"{head:>{width}}" for head, width in heads))

    def part(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    for row in answer["users"]:
        print(
            f"{row['user'][:16]:<16} {row['share']:>6g} {row['usage_gpu_hours']:>12.2f} {row['running_gpus']:>8g} "
            f"{row['queued_jobs']:>7} {part(row['owed']):>6} {part(row['used']):>6} {part(row['term']):>6}"
        )
    return 0


def dry_run_line(answer: dict[str, Any]) -> str:
    if answer["starts_now"]:
        return f"it would start now on {answer['expected_host']}"
    where = f"#{answer['queue_position']} in the queue" if answer["queue_position"] else "queued"
    why = f" ({answer['reason']})" if answer["reason"] else ""
    if answer["expected_start_at"] is None:
        return f"it would wait, {where}{why}; no estimate of its start (nothing known frees room for it)"
    return f"it would wait, {where}{why}; starts {_expected(answer)}"


def _expected(job: dict[str, Any]) -> str:
    """`~14:05 on lab-a` (local time; with the date when not today), from the scheduler's replay."""
    from datetime import datetime

    when = datetime.fromisoformat(job["expected_start_at"]).astimezone()
    clock = (
        when.strftime("%H:%M") if when.date() == datetime.now().astimezone().date() else when.strftime("%b %d %H:%M")
    )
    return f"~{clock} on {job.get('expected_host') or '?'}"


def _age(iso: str) -> str:
    from datetime import UTC, datetime

    seconds = max(0, int((datetime.now(UTC) - datetime.fromisoformat(iso)).total_seconds()))
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def run_tensorboard(args: argparse.Namespace) -> int:
    """Each job's `tensorboard/` into ~/.cache/towerq/tensorboard/job-<id>, then TensorBoard
    on all of them (named by job) unless --no-launch."""
    import subprocess
    import tarfile
    import tempfile

    api = Api(args)
    root = Path.home() / ".cache" / "towerq" / "tensorboard"
    spec = []
    for job_id in args.ids:
        target = root / f"job-{job_id}"
        with tempfile.TemporaryDirectory() as scratch:
            archive = Path(scratch) / "events.tar.gz"
            api.download(f"/api/jobs/{job_id}/artifacts/tensorboard", archive)
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            with tarfile.open(archive) as events:
                events.extractall(target, filter="data")
        folders = [p for p in target.iterdir() if p.is_dir()]
        spec.append(f"job-{job_id}:{folders[0] if folders else target}")
    logdir_spec = ",".join(spec)
    if args.no_launch:
        print(logdir_spec)
        return 0
    binary = shutil.which("tensorboard")
    if binary is None:
        raise ClientError(f"tensorboard is not installed here (pip install tensorboard); the events are in {root}")
    return subprocess.call([binary, "--logdir_spec", logdir_spec, "--port", str(args.port)])


def run_cancel(args: argparse.Namespace) -> int:
    job = Api(args).call("POST", f"/api/jobs/{args.id}/cancel")
    print(
        f"job {job['id']}: {job['state']}" + (" (stop requested)" if job["state"] in ("dispatched", "running") else "")
    )
    return 0


def run_share(args: argparse.Namespace) -> int:
    job = Api(args).call("PATCH", f"/api/jobs/{args.id}", json={"visibility": "private" if args.private else "lab"})
    whom = "only you and the admins" if args.private else "every member"
    print(f"job {job['id']}: its log, artifacts and code are readable by {whom}")
    return 0


def run_logs(args: argparse.Namespace) -> int:
    api = Api(args)
    after = 0
    lines = api.call("GET", f"/api/jobs/{args.id}/logs", params={"tail": 200})
    if args.output_format == "json" and not args.follow:
        return _json(lines)
    while True:
        for line in lines:
            print(f"{line['time'][11:19]} {line['level']:<7} {line['message']}")
            after = line["id"]
        if not args.follow:
            return 0
        job = api.call("GET", f"/api/jobs/{args.id}")
        if job["state"] in ("succeeded", "failed", "cancelled") and not lines:
            return 0
        time.sleep(1)
        lines = api.call("GET", f"/api/jobs/{args.id}/logs", params={"after_id": after})


def run_download(args: argparse.Namespace) -> int:
    """One file lands as `OUTPUT/<name>`; a folder or everything is unpacked into `OUTPUT`
    (as `job-<id>/...` or `job-<id>-<folder>/...`)."""
    import tarfile
    import tempfile

    api = Api(args)
    output: Path = args.output
    route = (
        f"/api/jobs/{args.id}/artifacts/{args.path.strip('/')}"
        if args.path
        else f"/api/jobs/{args.id}/artifacts.tar.gz"
    )
    name = Path(args.path).name if args.path else f"job-{args.id}.tar.gz"
    output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output, prefix=".towerq-download-") as scratch:
        fetched = Path(scratch) / (name or "artifact")
        headers = api.download(route, fetched)
        if headers.get("x-towerq-archive") != "folder":
            target = output / fetched.name
            fetched.replace(target)
            print(f"saved {target}")
            return 0
        with tarfile.open(fetched, "r:gz") as archive:
            top = {member.name.split("/", 1)[0] for member in archive.getmembers()}
            archive.extractall(output, filter="data")  # no absolute paths, no links out
        if not top:
            raise ClientError(f"job {args.id}: {args.path or 'the artifacts'} holds no files")
        for folder in sorted(top):
            print(f"saved {output / folder}/")
    return 0


def run_data_upload(args: argparse.Namespace) -> int:
    import io
    import zipfile

    api = Api(args)
    path: Path = args.path
    if path.is_dir():  # an image folder goes up as a .zip of its class sub-folders
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
            for file in sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink()):
                archive.write(file, file.relative_to(path).as_posix())
        upload: Any = (f"{args.name}.zip", buffer.getvalue())
    elif path.is_file():
        upload = (path.name, path.open("rb"))
    else:
        raise ClientError(f"{path}: no such file or folder")
    print(f"uploading {path} …", file=sys.stderr, flush=True)
    described = api.call(
        "POST",
        "/api/datasets",
        data={"name": args.name},
        files={"file": upload},
        timeout=httpx.Timeout(30, read=3600, write=3600),
    )
    print(f'dataset {described["name"]}: {_bytes(described["size"])}; use it as "dataset": "{described["dataset"]}"')
    return 0


def run_data_list(args: argparse.Namespace) -> int:
    listing = Api(args).call("GET", "/api/datasets")
    if args.output_format == "json":
        return _json(listing)
    print(f"{'NAME':<28} {'OWNER':<12} {'KIND':<9} {'SIZE':>10}  USE AS")
    for item in listing["items"]:
        size = _bytes(item["size"]) if item["size"] is not None else "-"
        print(f"{item['name'][:28]:<28} {item['owner'][:12]:<12} {item['kind']:<9} {size:>10}  {item['dataset']}")
    print(f"(your uploads take {_bytes(listing['used_bytes'])} of {_bytes(listing['quota_bytes'])})")
    return 0


def run_data_rm(args: argparse.Namespace) -> int:
    Api(args).call("DELETE", f"/api/datasets/{args.name}")
    print(f"dataset {args.name} deleted")
    return 0


def run_gpus(args: argparse.Namespace) -> int:
    gpus = Api(args).call("GET", "/api/gpus")
    if args.output_format == "json":
        return _json(gpus)
    print(f"{'HOST':<14} {'GPU':>3}  {'NAME':<36} {'MEMORY':>15}  {'FREE':>5}  HELD BY")
    for gpu in gpus:
        badges = [
            b
            for b, on in (
                ("simulated", gpu["simulated"]),
                ("drained", gpu["drained"]),
                ("down", gpu["host_state"] != "up"),
                ("UNSANDBOXED", gpu.get("sandboxed") is False),
            )
            if on
        ]
        memory = f"{gpu['memory_used_mb']}/{gpu['memory_total_mb']} MB"
        holders = ", ".join(f"job {h['job_id']} ({h['user']}, {h['fraction']:g})" for h in gpu["holders"]) or "-"
        flags = f"  [{', '.join(badges)}]" if badges else ""
        host, name = gpu["host"][:14], gpu["name"][:36]
        print(f"{host:<14} {gpu['index']:>3}  {name:<36} {memory:>15}  {gpu['free_fraction']:>5.2f}  {holders}{flags}")
    for host in sorted({gpu["host"] for gpu in gpus if gpu.get("sandboxed") is False}):
        print(f"warning: {host} runs members' code WITHOUT a sandbox (TOWERQ_SANDBOX=none)", file=sys.stderr)
    return 0
