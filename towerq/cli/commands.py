"""Client commands: talk to the REST API at TOWERQ_API_URL with a token.

The URL is `--api`, else TOWERQ_API_URL, else the one `towerq login` saved; the token is
`--token`, else TOWERQ_TOKEN, else the one `towerq login` saved (config.toml in
$XDG_CONFIG_HOME/towerq, default ~/.config/towerq), else `var/admin-token` of a local
`towerq up` (`towerq.config`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from towerq.cli import views
from towerq.cli.control import add_control_commands
from towerq.cli.follow import EXIT_FOR_STATE, follow_job, log_line
from towerq.cli.groups import add_group_commands, add_reservation_commands
from towerq.cli.notebook import add_notebook_command
from towerq.cli.people import OnDatabase, add_people_commands
from towerq.cli.reports import (
    dry_run_line,
    run_fair_share,
    run_gpus,
    run_queue,
    run_sweep,
    run_sweeps,
    run_usage,
)
from towerq.cli.run import add_after_options, add_run_command, after_fields, begun, held
from towerq.cli.session import (
    Api,
    UsageError,
    chosen_user,
    connection_options,
    output_option,
    print_json,
    read_spec,
    set_field,
    user_options,
)
from towerq.cli.shell import add_shell_command
from towerq.cli.transfer import (
    run_data_list,
    run_data_rm,
    run_data_upload,
    run_download,
    run_tensorboard,
    upload_code,
)
from towerq.client import Client
from towerq.config import write_config
from towerq.contract.api import DEFAULT_URL, LOG_LINES_KEPT
from towerq.errors import ApiError

CommandMaker = Callable[..., argparse.ArgumentParser]

WARNINGS_LOOKED_AT = 50
"""The newest lines of a queued job's log that `towerq show` reads for a warning: towerq's
own lines while a job waits are a few (one per host that builds its requirements)."""


def add_commands(commands: Any, on_database: dict[str, OnDatabase] | None = None) -> None:
    """Every member's command, a job's first, then other kinds of work, the lab's views, files,
    tokens and users (`on_database`: how the server's install does those where the command line
    is not logged in)."""
    command = _command_maker(commands)
    _add_login(commands)
    _add_submit(command)
    _add_job_commands(command)
    add_run_command(commands, command)
    add_notebook_command(command)
    add_shell_command(command)
    _add_lab_commands(command)
    _add_file_commands(commands, command)
    add_group_commands(commands)
    add_reservation_commands(commands)
    add_people_commands(commands, on_database)


def _command_maker(commands: Any) -> CommandMaker:
    def command(name: str, help_text: str, read: bool = False) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = commands.add_parser(name, help=help_text)
        connection_options(sub)
        if read:
            output_option(sub)
        return sub

    return command


def _add_login(commands: Any) -> None:
    login = commands.add_parser("login", help="save the API's URL and your token for the client commands")
    login.add_argument("url", help="the API, e.g. https://towerq.lab.example (a bare token: the default URL)")
    login.add_argument("--token", default=None, help="your token (default TOWERQ_TOKEN, else asked for)")
    login.set_defaults(run=run_login)


def _add_submit(command: CommandMaker) -> None:
    submit = command("submit", "submit a job spec (a YAML or JSON file, or - for stdin; --clone ID: a job's again)")
    submit.add_argument(
        "spec",
        nargs="?",
        default=None,
        help="path of a job spec (YAML or JSON), or - for stdin (with --clone: its changes)",
    )
    submit.add_argument(
        "--clone", type=int, default=None, metavar="ID",
        help="start from job ID's spec (its model or command, its code bundle), as the dashboard's Clone",
    )  # fmt: skip
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
    add_after_options(submit)
    submit.add_argument("--group", default=None, help="run it in this group of yours (default: your default group)")
    submit.add_argument(
        "--dry-run", action="store_true", help="submit nothing: check the spec and say when it would start"
    )
    submit.add_argument(
        "--hold", action="store_true", help="queue it on hold: it starts once released (towerq release ID)"
    )
    submit.add_argument(
        "--begin", default=None, metavar="WHEN",
        help="start no earlier than this, as sbatch --begin: 22:00 (its next one), +2h, 2026-12-07T09:00",
    )  # fmt: skip
    output_option(submit)
    submit.set_defaults(run=run_submit)


def _add_job_commands(command: CommandMaker) -> None:
    jobs = command("jobs", "list jobs, newest first", read=True)
    jobs.add_argument("--state", action="append", default=None, help="only jobs in this state (repeat for several)")
    user_options(jobs)
    jobs.add_argument("--limit", type=int, default=20, help="at most this many, newest first (default 20)")
    jobs.set_defaults(run=run_jobs)

    show = command(
        "show",
        "one job: state and why (waiting: its log's newest warning), GPUs, progress, metrics, history (-o json: all)",
        read=True,
    )
    show.add_argument("id", type=int)
    show.set_defaults(run=run_show)

    follow = command("follow", "follow a job live until it ends (exit code: 0 succeeded, 1 failed, 3 cancelled)")
    follow.add_argument("id", type=int)
    follow.add_argument("--logs", action="store_true", help="print its log's lines as they come, above the progress")
    follow.set_defaults(run=run_follow)

    logs = command("logs", "a job's log: what its trainer or program printed, and towerq's lines about it", read=True)
    logs.add_argument("id", type=int)
    logs.add_argument("--follow", "-f", action="store_true", help="then the lines to come, until the job ends")
    logs.add_argument(
        "--tail", "-n", type=tail_count, metavar="N",
        help=f"only its last N lines (default: every line the database keeps, its newest {LOG_LINES_KEPT:,})",
    )  # fmt: skip
    logs.set_defaults(run=run_logs)

    add_control_commands(command)

    download = command("download", "download a job's artifacts: all of them, a folder, or one file")
    download.add_argument("id", type=int)
    download.add_argument("path", nargs="?", default=None, help="a file or folder in the job's artifacts (default all)")
    download.add_argument("-o", "--output", type=Path, default=Path("."), help="folder to put it in (default .)")
    download.set_defaults(run=run_download)


def _add_lab_commands(command: CommandMaker) -> None:
    sweep = command(
        "sweep",
        "launch a sweep (YAML or JSON: name, base, grid or random, metric, goal, max_parallel); "
        "`towerq sweep show ID`: one sweep's jobs, settings and results; `towerq sweep cancel ID`: stop them all",
        read=True,
    )
    sweep.add_argument("spec", metavar="SPEC|show|cancel", help="the sweep's file, or -; or `show` or `cancel`")
    sweep.add_argument("id", type=int, nargs="?", default=None, help="with show or cancel: the sweep's id")
    sweep.add_argument("--follow", action="store_true", help="follow it until every job ended")
    sweep.add_argument(
        "--code", type=Path, default=None, metavar="PATH",
        help="upload a .py file or a folder as the code bundle of every job (the base's code)",
    )  # fmt: skip
    sweep.set_defaults(run=run_sweep)

    sweeps = command("sweeps", "list sweeps, newest first: progress and the best job", read=True)
    sweeps.set_defaults(run=run_sweeps)

    gpus = command(
        "gpus",
        "every GPU and who holds it; `towerq gpus drain HOST INDEX...`: no new work on those GPUs, their jobs "
        "finish (admins); `towerq gpus undrain HOST INDEX...`: give them back to the scheduler",
        read=True,
    )
    gpus.add_argument("action", nargs="?", choices=("drain", "undrain"), default=None, help="drain or undrain")
    gpus.add_argument("host", nargs="?", default=None, help="with drain or undrain: the GPUs' host")
    gpus.add_argument("indices", type=int, nargs="*", metavar="INDEX", help="with drain or undrain: the GPUs' indices")
    gpus.set_defaults(run=run_gpus)

    queue = command("queue", "jobs waiting, in the order they will start, and why they wait", read=True)
    user_options(queue)
    queue.set_defaults(run=run_queue)

    usage = command("usage", "GPU hours, jobs, waits and how busy GPUs were per user, host or group", read=True)
    usage.add_argument("--since", default="7d", help="ISO time, or an age: 30m, 24h, 7d (default 7d)")
    usage.add_argument("--until", default=None, help="ISO time, or an age (default now)")
    usage.add_argument("--by", choices=("user", "host", "group"), default="user")
    usage.set_defaults(run=run_usage)

    fair = command(
        "fair-share",
        "each group's and user's decayed usage, share and the rank term the scheduler gives them (the tree)",
        read=True,
    )
    fair.set_defaults(run=run_fair_share)


def _add_file_commands(commands: Any, command: CommandMaker) -> None:
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
        connection_options(sub)
        if action == "list":
            output_option(sub)
        if action == "rm":
            sub.add_argument("name", help="the dataset's name")
        if action == "upload":  # `upload PATH` names it by the file: towerq data upload cells.npz -> cells
            sub.add_argument(
                "name",
                nargs="?",
                metavar="[NAME]",
                help="its name (letters, digits, _ . -; default: PATH's, less its extension)",
            )
            sub.add_argument("path", type=Path, nargs="?", metavar="PATH", help="the file, or a folder of images")
            sub.usage = "%(prog)s [-h] [--api API] [--token TOKEN] [NAME] PATH"
        sub.set_defaults(run={"upload": run_data_upload, "list": run_data_list, "rm": run_data_rm}[action])


def run_login(args: argparse.Namespace) -> int:
    """Check the URL and token against the API, then save both in the config file (0600)."""
    import getpass

    url, token = args.url, args.token
    if url.startswith("tq_") and token is None:  # `towerq login TOKEN`, as before
        url, token = DEFAULT_URL, url
    token = token or os.environ.get("TOWERQ_TOKEN") or getpass.getpass("token: ").strip()
    with Client(url=url, token=token, retries=1) as client:
        me = client.me()
    path = write_config(client.url, token)
    print(f"logged in to {client.url} as {me['user']}{' (admin)' if me['is_admin'] else ''}; saved in {path}")
    return 0


def run_submit(args: argparse.Namespace) -> int:
    if args.spec is None and args.clone is None:
        raise UsageError("towerq submit SPEC: which spec? (a file, - for stdin, or --clone ID)")
    given = read_spec(args.spec) if args.spec is not None else {}  # a bad file says so before the API is asked
    api = Api(args)
    spec = api.client.cloned_spec(args.clone) if args.clone is not None else {}
    spec.update(given)
    for assignment in args.set:
        set_field(spec, assignment)
    spec.update(after_fields(args, spec))
    if args.group:
        spec["group"] = args.group
    if args.hold:
        spec["hold"] = True
    if args.begin:
        spec["begin_at"] = begun(args)
    if args.dry_run:
        if args.code is not None:
            raise UsageError("--dry-run does not upload --code: check the spec without it, or submit")
        answer = api.client.dry_run(spec)
        if args.output_format == "json":
            return print_json(answer)
        print(f"dry run, nothing submitted: {dry_run_line(answer)}")
        return 0
    if args.code is not None:
        spec["code"] = upload_code(api, args.code)
    job = api.client.submit(spec)
    if args.output_format == "json":  # the API's answer; with --follow, the job as it ended
        if args.follow:
            job.wait()
        print_json(job.data)
        return EXIT_FOR_STATE.get(job.data["state"], 1) if args.follow else 0
    print(f"job {job.id} submitted ({job.name}), {job.state}{held(job)}", flush=True)
    if args.follow:
        return follow_job(api.client, job.id)
    return 0


def run_jobs(args: argparse.Namespace) -> int:
    client = Api(args).client
    page = client.jobs_page(state=args.state, user=chosen_user(args, client), limit=args.limit)
    if args.output_format == "json":
        return print_json(page)
    print("\n".join(views.jobs_table(page)))
    return 0


def run_show(args: argparse.Namespace) -> int:
    client = Api(args).client
    job = client.job(args.id).data
    if args.output_format == "json":
        return print_json(job)
    warned = None
    if job["state"] == "queued":
        with contextlib.suppress(ApiError):  # a log the caller may not read: the page without it
            warned = views.waiting_warning(job, client.logs(args.id, tail=WARNINGS_LOOKED_AT))
    print("\n".join(views.job_page(job, client.url, warned)))
    return 0


def run_follow(args: argparse.Namespace) -> int:
    return follow_job(Api(args).client, args.id, logs=args.logs)


def run_logs(args: argparse.Namespace) -> int:
    client = Api(args).client
    lines = client.log_tail(args.id, args.tail)
    if args.output_format == "json" and not args.follow:
        return print_json(lines)
    for line in lines:
        print(log_line(line), flush=True)
    if args.follow:  # each line once, in order, until the job ends (`Client.log_lines`)
        for line in client.log_lines(args.id, after=lines[-1]["id"] if lines else 0, follow=True):
            print(log_line(line), flush=True)
    return 0


def tail_count(text: str) -> int:
    """`--tail`'s N: a whole number of lines, from 1 to what the database keeps."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of lines") from None
    if not 1 <= count <= LOG_LINES_KEPT:
        raise argparse.ArgumentTypeError(
            f"{count} lines: from 1 to {LOG_LINES_KEPT:,} (the database keeps a job's newest)"
        )
    return count
