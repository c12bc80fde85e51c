"""Client commands that move files: code bundles and datasets up, artifacts down, TensorBoard over a job's events."""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from towerq.bundle import human_bytes
from towerq.cli.run import upload_folder
from towerq.cli.session import Api, ClientError, UsageError, print_json
from towerq.contract.api import dataset_name_problem
from towerq.errors import ApiError


def upload_code(api: Api, path: Path) -> str:
    """Upload `path` (a .py file, or a folder as `towerq run` sends it) as a code bundle;
    returns its id."""
    if path.is_dir():
        return upload_folder(api, path)
    if not path.is_file():
        raise ClientError(f"--code {path}: no such file or folder")
    bundle = api.client.upload_code(path.name, path.read_bytes())
    api.say(f"code: 1 file, {human_bytes(bundle['size'])}, bundle {bundle['id'][:12]}")
    return str(bundle["id"])


def run_tensorboard(args: argparse.Namespace) -> int:
    """Each job's TensorBoard events, wherever in its folder it wrote them (towerq's trainer
    in `tensorboard/`, a program in `work/runs/`, `output/`...), into
    ~/.cache/towerq/tensorboard/job-<id>, then TensorBoard on all of them (named by job)
    unless --no-launch. A job with none yet is left out, saying so (all of them: exit 1)."""
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
            try:
                api.download(f"/api/jobs/{job_id}/tensorboard.tar.gz", archive)
            except ApiError as err:
                if err.status != 404 or len(args.ids) == 1:
                    raise
                print(f"towerq: {err.detail}: left out", file=sys.stderr)
                continue
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            with tarfile.open(archive) as events:
                events.extractall(target, filter="data")
        spec.append(f"job-{job_id}:{runs_folder(target)}")
    if not spec:
        raise ClientError("none of these jobs wrote TensorBoard events")
    logdir_spec = ",".join(spec)
    if args.no_launch:
        print(logdir_spec)
        return 0
    binary = shutil.which("tensorboard")
    if binary is None:
        raise ClientError(f"tensorboard is not installed here (pip install tensorboard); the events are in {root}")
    return subprocess.call([binary, "--logdir_spec", logdir_spec, "--port", str(args.port)])


def runs_folder(folder: Path) -> Path:
    """The folder the job's runs are named from: down through folders that hold one folder
    and nothing else (`job-7/work/runs/Dec07_01-16-34_vm` is run `job-7`; a trainer's
    `job-8/tensorboard` too; a job that wrote events in two places has both as its runs)."""
    while len(entries := list(folder.iterdir())) == 1 and entries[0].is_dir():
        folder = entries[0]
    return folder


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


def dataset_name_of(path: Path) -> str:
    """A dataset's name from its file or folder: `cells.npz` -> cells, `train.tfrecord.gz` ->
    train, `images/` -> images."""
    return (path.resolve() if path.name in ("", "..") else path).name.split(".", 1)[0]


def check_image_folder(path: Path) -> None:
    """An image folder holds one sub-folder per class: said before anything is packed or sent."""
    entries = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
    if not any((path / entry).is_dir() for entry in entries):
        holds = f"it holds {', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''}" if entries else "it is empty"
        raise ClientError(f"{path}: an image folder holds one sub-folder per class (cat/, dog/, ...); {holds}")


def run_data_upload(args: argparse.Namespace) -> int:
    import contextlib
    import tempfile
    import zipfile

    if args.name is None:
        raise UsageError("towerq data upload [NAME] PATH: which file or folder?")
    path: Path = args.path if args.path is not None else Path(args.name)
    name = args.name if args.path is not None else dataset_name_of(path)
    if problem := dataset_name_problem(name):  # before a folder is packed or a byte sent
        how = (
            ""
            if args.path is not None
            else f" (from {path.name}: name it, towerq data upload NAME {shlex.quote(str(path))})"
        )
        raise UsageError(f"name: {problem}{how}")
    api = Api(args)
    with contextlib.ExitStack() as held:
        if path.is_dir():  # an image folder goes up as a .zip of its class sub-folders, packed on disk
            check_image_folder(path)
            packed = held.enter_context(tempfile.TemporaryFile())
            with zipfile.ZipFile(packed, "w", zipfile.ZIP_STORED) as archive:
                for file in sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink()):
                    archive.write(file, file.relative_to(path).as_posix())
            packed.seek(0)
            upload: tuple[str, Any] = (f"{name}.zip", packed)
        elif path.is_file():
            upload = (path.name, held.enter_context(path.open("rb")))
        else:
            raise ClientError(f"{path}: no such file or folder")
        print(f"uploading {path} …", file=sys.stderr, flush=True)
        described = api.client.upload_dataset(name, *upload)
    print(
        f'dataset {described["name"]}: {human_bytes(described["size"])}; use it as "dataset": "{described["dataset"]}"'
    )
    return 0


def run_data_list(args: argparse.Namespace) -> int:
    listing = Api(args).client.datasets()
    if args.output_format == "json":
        return print_json(listing)
    print(f"{'NAME':<28} {'OWNER':<12} {'KIND':<9} {'SIZE':>10}  USE AS")
    for item in listing["items"]:
        size = human_bytes(item["size"]) if item["size"] is not None else "-"
        print(f"{item['name'][:28]:<28} {item['owner'][:12]:<12} {item['kind']:<9} {size:>10}  {item['dataset']}")
    print(f"(your uploads take {human_bytes(listing['used_bytes'])} of {human_bytes(listing['quota_bytes'])})")
    return 0


def run_data_rm(args: argparse.Namespace) -> int:
    Api(args).client.delete_dataset(args.name)
    print(f"dataset {args.name} deleted")
    return 0
