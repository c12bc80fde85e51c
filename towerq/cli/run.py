"""`towerq run --gpus 2 -- python train.py --lr 0.1`: this folder's program as a command job.

Packs the folder (leaving out what `.gitignore` and `.towerqignore` name, version control,
virtual environments and caches), uploads it unless the API already has the same files
(same content, same id), submits the command and follows the job like `towerq submit
--follow`, printing its output (the job's log) as it comes unless `--no-logs`. Ctrl+C
detaches (the job runs on); with `--cancel-on-interrupt` it cancels.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from towerq.cli.follow import follow_job
from towerq.cli.session import Api, UsageError
from towerq.contract.paths import bundle_id
from towerq.errors import ApiError

ALWAYS_LEFT_OUT = (".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
                   ".ipynb_checkpoints", "node_modules", ".tox", ".nox", ".venv", "venv")  # fmt: skip
IGNORE_FILES = (".gitignore", ".towerqignore")
BUNDLE_LIMIT_BYTES = 20_000_000
"""The API's default `TOWERQ_MAX_CODE_BYTES`: a larger folder is refused here, before it is
sent, naming its biggest files (the API refuses it too, past its own setting)."""


@dataclass
class Ignore:
    """The patterns of `.gitignore` files (and `.towerqignore`): `name`, `*.ext`, `dir/`,
    `/anchored`, `a/b`, `**`, and `!negation`; the last matching line wins, as in git."""

    rules: list[tuple[Path, str, bool, bool]] = field(default_factory=list)
    """(the folder of the file that said it, the pattern, negated, folders only)"""

    def read(self, folder: Path) -> None:
        for name in IGNORE_FILES:
            path = folder / name
            if not path.is_file():
                continue
            for raw in path.read_text(errors="replace").splitlines():
                line = raw.strip()
                if not line or line.startswith("#"):
                    continue
                negated = line.startswith("!")
                line = line.removeprefix("!")
                only_folders = line.endswith("/")
                self.rules.append((folder, line.rstrip("/"), negated, only_folders))

    def ignored(self, path: Path, is_folder: bool) -> bool:
        verdict = False
        for base, pattern, negated, only_folders in self.rules:
            if only_folders and not is_folder:
                continue
            try:
                relative = path.relative_to(base).as_posix()
            except ValueError:
                continue
            if _matches(relative, pattern):
                verdict = not negated
        return verdict


def _matches(relative: str, pattern: str) -> bool:
    if pattern.startswith("/") or "/" in pattern.rstrip("/"):
        pattern = pattern.removeprefix("/").replace("**/", "*")
        return fnmatch.fnmatchcase(relative, pattern)
    return fnmatch.fnmatchcase(relative.rsplit("/", 1)[-1], pattern)


@dataclass
class Packed:
    data: bytes
    entries: list[dict[str, Any]]
    left_out: list[str]

    @property
    def size(self) -> int:
        return sum(int(e["size"]) for e in self.entries)

    @property
    def id(self) -> str:
        return bundle_id(self.entries)


def pack(folder: Path) -> Packed:
    """The folder's files as a .tar.gz, with each file's path, size and SHA-256 (what the API
    makes the bundle's id of)."""
    ignore = Ignore()
    entries: list[dict[str, Any]] = []
    left_out: list[str] = []
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for current, subfolders, names in os.walk(folder):
            here = Path(current)
            ignore.read(here)
            for name in sorted(subfolders):
                path = here / name
                if name in ALWAYS_LEFT_OUT or (path / "pyvenv.cfg").exists() or path.is_symlink():
                    subfolders.remove(name)
                elif ignore.ignored(path, is_folder=True):
                    subfolders.remove(name)
                    left_out.append(f"{path.relative_to(folder).as_posix()}/")
            subfolders.sort()
            for name in sorted(names):
                path = here / name
                relative = path.relative_to(folder).as_posix()
                if path.is_symlink() or not path.is_file() or name.endswith((".pyc", ".pyo")):
                    continue
                if ignore.ignored(path, is_folder=False):
                    left_out.append(relative)
                    continue
                content = path.read_bytes()
                entries.append({"path": relative, "size": len(content), "sha256": hashlib.sha256(content).hexdigest()})
                info = archive.gettarinfo(str(path), arcname=relative)
                archive.addfile(info, io.BytesIO(content))
    return Packed(buffer.getvalue(), entries, left_out)


def upload_folder(api: Api, folder: Path) -> str:
    """The bundle id of `folder`'s code on the API: sent only when the API lacks it."""
    if not folder.is_dir():
        raise UsageError(f"--folder {folder}: no such folder")
    packed = pack(folder)
    if not packed.entries:
        raise UsageError(f"{folder}: no files to send (all left out, or the folder is empty)")
    if packed.size > BUNDLE_LIMIT_BYTES:
        biggest = sorted(packed.entries, key=lambda e: -int(e["size"]))[:5]
        named = ", ".join(f"{e['path']} ({_mb(int(e['size']))})" for e in biggest)
        raise UsageError(
            f"{folder} holds {_mb(packed.size)} of files, over the {_mb(BUNDLE_LIMIT_BYTES)} a code bundle may "
            f"hold; the biggest: {named}. Name data and weights in .towerqignore and upload data as a "
            "dataset (towerq data upload)"
        )
    try:
        api.client.request("GET", f"/api/code/{packed.id}")
        print(f"code: {len(packed.entries)} files, {_mb(packed.size)}, bundle {packed.id[:12]} (already there)")
        return packed.id
    except ApiError:
        pass  # not there, or not yet yours: send it
    bundle = api.client.upload_code(f"{folder.resolve().name or 'code'}.tar.gz", packed.data)
    note = f"; left out: {', '.join(packed.left_out[:10])}" if packed.left_out else ""
    print(f"code: {len(packed.entries)} files, {_mb(packed.size)}, bundle {str(bundle['id'])[:12]} (sent){note}")
    return str(bundle["id"])


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def add_run_command(commands: Any, command: Any) -> None:
    run: argparse.ArgumentParser = command(
        "run", "run this folder's program as a job: towerq run --gpus 2 -- python train.py --lr 0.1"
    )
    run.add_argument("program", nargs=argparse.REMAINDER, help="the command, after --")
    add_placement_options(run)
    run.add_argument("--priority", choices=("low", "normal", "high"), default=None)
    run.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="an environment variable")
    run.add_argument("--resumable", action="store_true", help="it resumes from TOWERQ_CHECKPOINT_DIR")
    run.add_argument(
        "--min-gpus",
        type=int,
        default=None,
        metavar="N",
        help="elastic (with --resumable): it may run on as few as N of its --gpus, resized from its checkpoint",
    )
    run.add_argument(
        "--per-gpu", action="store_true", help="one process per GPU, with RANK, WORLD_SIZE, MASTER_ADDR, TF_CONFIG"
    )
    run.add_argument(
        "--network", action="store_true", help="the hosts' network (an admin's grant): needed over several hosts"
    )
    run.add_argument("--folder", type=Path, default=Path("."), help="the folder to send (default: this one)")
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
    parser.add_argument("--fraction", type=float, default=None, metavar="F", help="gpu_memory_fraction: share GPUs")
    parser.add_argument("--name", default=None)
    parser.add_argument("--time-limit", type=int, default=None, metavar="SECONDS")
    parser.add_argument("--dataset", default=None, help="an uploaded dataset (kind:PATH), read only")
    parser.add_argument("--group", default=None)


def placement_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The spec's fields `add_placement_options` asked for (None where not given)."""
    return {
        "gpu_count": args.gpus,
        "gpus": [int(i) for i in args.gpu_ids.split(",")] if args.gpu_ids else None,
        "host": args.host,
        "gpu_memory_fraction": args.fraction,
        "name": args.name,
        "time_limit_s": args.time_limit,
        "dataset": args.dataset,
        "group": args.group,
    }


def run_spec(args: argparse.Namespace, code: str) -> dict[str, Any]:
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        raise UsageError("name the program after --, e.g. towerq run --gpus 1 -- python train.py")
    spec: dict[str, Any] = {"command": program, "code": code}
    env = {}
    for entry in args.env:
        name, equals, value = entry.partition("=")
        if not equals or not name:
            raise UsageError(f"--env {entry!r}: write NAME=VALUE")
        env[name] = value
    optional = {
        "env": env or None,
        **placement_fields(args),
        "priority": args.priority,
        "resumable": args.resumable or None,
        "min_gpu_count": getattr(args, "min_gpus", None),
        "network": args.network or None,
        "processes": "per_gpu" if getattr(args, "per_gpu", False) else None,
    }
    spec.update({key: value for key, value in optional.items() if value is not None})
    return spec


def run_run(args: argparse.Namespace) -> int:
    api = Api(args)
    if not (args.program[1:] if args.program[:1] == ["--"] else args.program):
        raise UsageError("name the program after --, e.g. towerq run --gpus 1 -- python train.py")
    code = upload_folder(api, args.folder)
    job = api.client.submit(run_spec(args, code))
    print(f"job {job.id} submitted ({job.name}), {job.state}", flush=True)
    if args.detach:
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
