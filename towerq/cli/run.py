"""`towerq run --gpus 2 -- python train.py --lr 0.1`: this folder's program as a command job.

Packs the folder (`towerq.bundle`: leaving out what `.gitignore` and `.towerqignore` name,
version control, virtual environments and caches), uploads it unless the API already has
the same files (same content, same id), submits the command and follows the job like `towerq submit
--follow`, printing its output (the job's log) as it comes unless `--no-logs`. Ctrl+C
detaches (the job runs on); with `--cancel-on-interrupt` it cancels.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from towerq.bundle import FolderError
from towerq.cli import views
from towerq.cli.follow import follow_job
from towerq.cli.session import PRIORITIES, Api, UsageError, duration, moment
from towerq.client import Job
from towerq.contract.catalog import BUILTIN_DATASETS


def upload_folder(api: Api, folder: Path) -> str:
    """The bundle id of `folder`'s code on the API: sent only when the API lacks it."""
    try:
        sent = api.client.send_code(folder)
    except FolderError as err:
        raise UsageError(str(err)) from None
    api.say(sent)
    return sent.id


def add_run_command(commands: Any, command: Any) -> None:
    run: argparse.ArgumentParser = command(
        "run", "run this folder's program as a job: towerq run --gpus 2 -- python train.py --lr 0.1"
    )
    run.add_argument("program", nargs=argparse.REMAINDER, help="the command, after --")
    add_placement_options(run)
    run.add_argument("--priority", choices=PRIORITIES, default=None)
    run.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="an environment variable")
    run.add_argument("--resumable", action="store_true", help="it resumes from TOWERQ_CHECKPOINT_DIR")
    run.add_argument(
        "--requirements", "-r", type=Path, default=None, metavar="FILE",
        help="packages it needs besides the lab's, one a line (requirements.txt): installed on the host once",
    )  # fmt: skip
    run.add_argument(
        "--min-gpus",
        type=int,
        default=None,
        metavar="N",
        help="elastic (with --resumable): it may run on as few as N of its --gpus, resized from its checkpoint",
    )
    run.add_argument(
        "--signal", default=None, metavar="SIG@SECONDS",
        help="warn it before its --time-limit, as sbatch --signal: USR1@600 sends SIGUSR1 600 s before",
    )  # fmt: skip
    run.add_argument(
        "--per-gpu", action="store_true", help="one process per GPU, with RANK, WORLD_SIZE, MASTER_ADDR, TF_CONFIG"
    )
    run.add_argument(
        "--network", action="store_true", help="the hosts' network (an admin's grant): needed over several hosts"
    )
    run.add_argument("--folder", type=Path, default=Path("."), help="the folder to send (default: this one)")
    add_after_options(run)
    run.add_argument(
        "--hold", action="store_true", help="queue it on hold: it starts once released (towerq release ID)"
    )
    run.add_argument("--detach", action="store_true", help="submit and return; do not follow")
    run.add_argument(
        "--no-logs", action="store_true", help="follow its progress only, without its output (towerq logs ID has it)"
    )
    run.add_argument(
        "--cancel-on-interrupt", action="store_true", help="Ctrl+C cancels the job (default: detaches, it runs on)"
    )
    run.set_defaults(run=run_run)


def add_placement_options(parser: argparse.ArgumentParser) -> None:
    """Where and for how long a job runs, as `towerq run` and `towerq notebook` ask for it."""
    parser.add_argument("--gpus", type=int, default=None, metavar="N", help="this many GPUs (default 1)")
    parser.add_argument("--gpu-ids", default=None, metavar="I,J", help="these GPU indices (with --host)")
    parser.add_argument("--host", default=None)
    parser.add_argument(
        "--fraction", "--gpu-memory-fraction", dest="fraction", type=float, default=None, metavar="F",
        help="share GPUs: this fraction of each one's memory (the spec's gpu_memory_fraction)",
    )  # fmt: skip
    parser.add_argument("--name", default=None)
    parser.add_argument(
        "--time-limit", type=duration, default=None, metavar="DURATION",
        help="stop it after this long: 2h, 90m, 1:30:00 (a number alone: seconds)",
    )  # fmt: skip
    parser.add_argument(
        "--begin", default=None, metavar="WHEN",
        help="start no earlier than this, as sbatch --begin: 22:00 (its next one), +2h, 2026-12-07T09:00",
    )  # fmt: skip
    parser.add_argument(
        "--dataset", default=None, help="an uploaded dataset, read only: its name (towerq data list) or kind:PATH"
    )
    parser.add_argument("--group", default=None)


def add_after_options(parser: argparse.ArgumentParser) -> None:
    """`--after REFS [--after-any]`: a pipeline, as `towerq submit` and `towerq run` ask for it."""
    parser.add_argument(
        "--after", default=None, metavar="REFS",
        help="start after these jobs, comma-separated: job ids, or sweep:ID for all of a sweep's jobs "
        "(they must succeed; with --after-any, end); their folders are the job's inputs",
    )  # fmt: skip
    parser.add_argument("--after-any", action="store_true", help="with --after: start once they end, however")


def after_fields(args: argparse.Namespace, spec: dict[str, Any]) -> dict[str, Any]:
    """The spec's `after` and `after_condition` from `--after` and `--after-any` (what `spec`
    has already stays where they are not given)."""
    fields: dict[str, Any] = {}
    if args.after:
        fields["after"] = [int(ref) if ref.strip().isdigit() else ref.strip() for ref in args.after.split(",")]
    if args.after_any:
        if not args.after and not spec.get("after"):
            raise UsageError("--after-any needs --after (or `after` in the spec)")
        fields["after_condition"] = "afterany"
    return fields


def dataset_reference(api: Api, given: str | None) -> str | None:
    """`--dataset cells`: the member's upload of that name (else the lab's shared one) as a
    spec names it (`npz:users/alice/cells/data.npz`); a `kind:PATH` as given."""
    if given is None or ":" in given:
        return given
    found = api.client.dataset_reference(given)
    if found is None and given not in BUILTIN_DATASETS:  # a built-in: the API says what a program reads instead
        names = ", ".join(sorted({item["name"] for item in api.client.datasets()["items"]})) or "none"
        raise UsageError(
            f"--dataset {given}: no upload of that name (towerq data list: {names}); "
            f"towerq data upload {given} FILE adds it"
        )
    return found or given


def placement_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The spec's fields `add_placement_options` asked for (None where not given)."""
    return {
        "gpu_count": args.gpus,
        "gpus": [int(i) for i in args.gpu_ids.split(",")] if args.gpu_ids else None,
        "host": args.host,
        "gpu_memory_fraction": args.fraction,
        "name": args.name,
        "time_limit_s": args.time_limit,
        "begin_at": begun(args),
        "dataset": args.dataset,
        "group": args.group,
    }


def begun(args: argparse.Namespace) -> str | None:
    """`--begin` as the spec's `begin_at`, an ISO time with its zone."""
    return moment(args.begin, "--begin").isoformat() if getattr(args, "begin", None) else None


def env_variables(entries: list[str]) -> dict[str, str] | None:
    """`--env NAME=VALUE`, each, as the spec's `env` (none given: None)."""
    env = {}
    for entry in entries:
        name, equals, value = entry.partition("=")
        if not equals or not name:
            raise UsageError(f"--env {entry!r}: write NAME=VALUE")
        env[name] = value
    return env or None


def run_spec(args: argparse.Namespace, code: str) -> dict[str, Any]:
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        raise UsageError("name the program after --, e.g. towerq run --gpus 1 -- python train.py")
    spec: dict[str, Any] = {"command": program, "code": code}
    optional = {
        "env": env_variables(args.env),
        **placement_fields(args),
        "priority": args.priority,
        "resumable": args.resumable or None,
        "min_gpu_count": getattr(args, "min_gpus", None),
        "network": args.network or None,
        "processes": "per_gpu" if getattr(args, "per_gpu", False) else None,
        "hold": getattr(args, "hold", False) or None,
        "signal": getattr(args, "signal", None),
        "requirements": requirements_of(args.requirements) if getattr(args, "requirements", None) else None,
    }
    spec.update({key: value for key, value in optional.items() if value is not None})
    spec.update(after_fields(args, spec))
    return spec


def requirements_of(path: Path) -> list[str]:
    """The packages a requirements file lists: one a line, comments and blank lines left out;
    an option line (`-r`, `--index-url`, `-e`) is refused, naming it (the lab's index is the
    admin's: TOWERQ_PIP_OPTIONS)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"--requirements {path}: cannot read it ({err})") from None
    listed = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise UsageError(
                f"--requirements {path}, line {number}: {line!r}: only packages and their versions "
                "(the index is the lab's; a folder of your own goes in the code)"
            )
        listed.append(line)
    if not listed:
        raise UsageError(f"--requirements {path}: it lists no package")
    return listed


def requirements_hint(args: argparse.Namespace) -> str | None:
    """A line for a folder sent with a `requirements.txt` but without `-r`: the file goes
    with the code, but nothing installs what it lists (a new user expects it to)."""
    found = args.folder / "requirements.txt"
    if args.requirements is not None or not found.is_file():
        return None
    return (
        f"note: {found} is sent, not installed: the job has the lab's packages; "
        f"towerq run -r {found} ... installs what it lists besides them (once per host)"
    )


def held(job: Job) -> str:
    """What a submit on hold, or with its begin ahead, adds to the line that says it: how to
    let it start."""
    if job.data.get("on_hold_by"):
        return f" on hold: towerq release {job.id} lets it start"
    begin = job.data["spec"].get("begin_at")
    if begin and datetime.fromisoformat(begin) > datetime.now(UTC):
        return f", not before {views.local_clock(begin)} (towerq update {job.id} --begin now lets it start)"
    return ""


def run_run(args: argparse.Namespace) -> int:
    api = Api(args)
    run_spec(args, "")  # what is wrong on the command line (its program, --env, -r) says so before a byte is sent
    args.dataset = dataset_reference(api, args.dataset)
    hint = requirements_hint(args)
    if hint:
        api.say(hint)
    code = upload_folder(api, args.folder)
    job = api.client.submit(run_spec(args, code))
    print(f"job {job.id} submitted ({job.name}), {job.state}{held(job)}", flush=True)
    if args.detach or args.hold:
        return 0
    try:
        return follow_job(api.client, job.id, logs=not args.no_logs)
    except KeyboardInterrupt:
        if args.cancel_on_interrupt:
            api.client.request("POST", f"/api/jobs/{job.id}/cancel")
            print(f"\njob {job.id}: cancel requested (it saves and stops within its grace)", flush=True)
            return 3
        print(f"\ndetached: job {job.id} runs on (towerq follow {job.id}; towerq cancel {job.id})", flush=True)
        return 0
