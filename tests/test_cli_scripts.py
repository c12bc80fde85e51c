"""The CLI for scripts: every command that takes `-o json` prints the API's JSON (checked
command by command, and the list of such commands read from the parser, so a new one
cannot be left out), `towerq sweep cancel`, a dry run that resolves `after` as a submit
does, and the config file under `XDG_CONFIG_HOME`."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from service.cli.command import parser
from service.core.settings import Settings
from tests.conftest import free_port
from tests.stack import REPO, Stack, wait_for
from towerq import ApiError, Client
from towerq.client import FINAL_STATES

pytestmark = pytest.mark.slow
LONG = {"model": "mlp", "dataset": "digits", "gpu_count": 1, "hyperparameters": {"steps": 100_000_000}}


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def commands_with_json(top: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command (`data list` as two words) whose parser takes `-o table|json`."""
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands_with_json(sub, (*path, name))
    if any(action.dest == "output_format" for action in top._actions):
        yield path


class Cli:
    def __init__(self, home: Path, xdg: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOWERQ_")}
        self.env = {**env, "HOME": str(home), "XDG_CONFIG_HOME": str(xdg), "PYTHONPATH": str(REPO)}

    def __call__(
        self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "service.cli", *args]
        environment = {**self.env, **(env or {})}
        return subprocess.run(command, capture_output=True, text=True, env=environment, input=stdin, timeout=240)

    def json(self, *args: str, stdin: str | None = None, code: int = 0, env: dict[str, str] | None = None) -> object:
        done = self(*args, "-o", "json", stdin=stdin, env=env)
        assert done.returncode == code, (args, done.stdout, done.stderr)
        return json.loads(done.stdout)


def test_every_json_command_prints_json_sweeps_cancel_and_dry_runs_see_after(
    stack: Stack, make_token: Callable[..., str], tmp_path: Path
) -> None:
    url = stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2)
    token = make_token("alice")
    wait_for(lambda: Client(url, token).request("GET", "/api/gpus"), 30, "the worker to register its GPUs")
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    home.mkdir()
    cli = Cli(home, xdg)

    # `towerq login` writes where XDG_CONFIG_HOME says, and the commands read it there.
    assert cli("login", url, "--token", token).returncode == 0
    assert token in (xdg / "towerq" / "config.toml").read_text()
    assert not (home / ".config").exists()

    # submit -o json: the API's job, as `| jq .id` wants it; with --follow, the job as it ended
    running = cli.json("submit", "-", stdin=json.dumps(LONG))
    assert isinstance(running, dict) and running["state"] == "queued" and running["id"] > 0
    short = {**LONG, "hyperparameters": {"steps": 20}}
    ended = cli.json("submit", "-", "--follow", stdin=json.dumps(short))
    assert isinstance(ended, dict) and ended["state"] == "succeeded", ended

    # a dry run resolves `after` as a submit does: a missing job is refused, a running one holds it
    missing = cli("submit", "-", "--dry-run", "--after", "99999", stdin=json.dumps(short))
    assert missing.returncode == 1 and "after" in missing.stderr and "does not exist" in missing.stderr
    held = cli.json("submit", "-", "--dry-run", "--after", str(running["id"]), stdin=json.dumps(short))
    assert isinstance(held, dict) and held["starts_now"] is False, held
    assert held["reason"].startswith(f"waiting for job {running['id']} to succeed"), held
    ran = cli("submit", "-", "--dry-run", "--after", str(ended["id"]), stdin=json.dumps(short))
    assert ran.returncode == 0 and "waiting for" not in ran.stdout, ran.stdout

    # sweep SPEC -o json: the sweep and its jobs; `towerq sweep cancel ID` stops them all
    body = {"name": "lr", "base": LONG, "grid": {"hyperparameters.learning_rate": [0.1, 0.01]}, "metric": "loss"}
    sweep = cli.json("sweep", "-", stdin=json.dumps(body))
    assert isinstance(sweep, dict) and sweep["total"] == 2 and len(sweep["jobs"]) == 2
    shown = cli("sweep", "cancel", str(sweep["id"]))
    assert shown.returncode == 0 and f"sweep {sweep['id']} (lr): cancelled" in shown.stdout, shown
    assert cli("sweep", "cancel").returncode == 2
    client = Client(url, token)
    for job in sweep["jobs"]:
        wait_for(lambda j=job: client.job(j["id"]).state == "cancelled", 60, f"sweep job {job['id']} cancelled")
    again = cli.json("sweep", "cancel", str(sweep["id"]))
    assert isinstance(again, dict) and again["counts"].get("cancelled") == 2, again
    client.cancel(running["id"])

    # --code: the folder packed and sent, every job's code; its words on stderr, stdout JSON alone
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import sys; print('lr', sys.argv[2])\n")
    program = {"name": "cmd", "base": {"command": ["python", "train.py", "--lr", "{lr}"], "hold": True}}
    swept = cli(
        "sweep", "-", "--code", str(project), "-o", "json", stdin=json.dumps({**program, "grid": {"lr": [0.1]}})
    )
    assert swept.returncode == 0 and swept.stderr.startswith("code: 1 file,"), swept
    bundle_id = swept.stderr.split("bundle ")[1].split()[0]
    (job,) = json.loads(swept.stdout)["jobs"]
    spec = client.job(job["id"]).data["spec"]
    assert spec["command"] == ["python", "train.py", "--lr", "0.1"] and spec["code"].startswith(bundle_id), spec
    client.cancel(job["id"])
    shown = cli("sweep", "show", "1", "--code", str(project))
    assert shown.returncode == 2 and "--code goes with a sweep's file" in shown.stderr, shown
    submitted = cli.json("submit", "-", "--code", str(project), stdin=json.dumps(program["base"]))
    assert isinstance(submitted, dict) and submitted["spec"]["code"].startswith(bundle_id), submitted
    client.cancel(submitted["id"])

    # `towerq data upload PATH`: named by its file, less its extension
    cells = tmp_path / "cells.npz"
    np.savez(cells, x=np.zeros((10, 3), np.float32), y=np.arange(10) % 2)
    uploaded = cli("data", "upload", str(cells))
    assert uploaded.returncode == 0 and uploaded.stdout.startswith("dataset cells: "), uploaded
    pictures = tmp_path / "pictures"  # an image folder: packed (on disk) as a .zip of its class sub-folders
    for label in ("cat", "dog"):
        (pictures / label).mkdir(parents=True)
        (pictures / label / "1.png").write_bytes(b"\x89PNG")
    uploaded = cli("data", "upload", str(pictures))
    assert uploaded.returncode == 0 and 'as "dataset": "images:users/alice/pictures/' in uploaded.stdout, uploaded
    # ... and a program asks for it by that name
    ran = cli("run", "--dataset", "cells", "--hold", "--folder", str(project), "--", "python", "train.py")
    assert ran.returncode == 0, ran
    held = client.job(int(ran.stdout.split("job ")[1].split()[0]))
    assert held.data["spec"]["dataset"] == "npz:users/alice/cells/data.npz", held.data["spec"]
    # submit --clone ID: its spec again (its command, code, dataset), changed by --set; not on hold
    cloned = cli.json("submit", "--clone", str(held.id), "--set", "env.SEED=two")
    assert isinstance(cloned, dict) and cloned["on_hold_by"] is None, cloned
    same = ("command", "code", "dataset")
    assert [cloned["spec"][k] for k in same] == [held.data["spec"][k] for k in same], cloned["spec"]
    assert cloned["spec"]["env"] == {"SEED": "two"}, cloned["spec"]
    assert cli("submit").returncode == 2
    client.cancel(held.id)
    wait_for(lambda: client.job(cloned["id"]).state in FINAL_STATES, 60, "the clone to end")  # not on hold: it ran
    missing = cli("run", "--dataset", "cellz", "--folder", str(project), "--", "python", "train.py")
    assert (
        missing.returncode == 2
        and "--dataset cellz: no upload of that name (towerq data list: cells, pictures)" in (missing.stderr)
    ), missing

    # every command that takes -o json prints JSON
    job, sweep_id = str(ended["id"]), str(sweep["id"])
    arguments = {
        ("submit",): ["-"],
        ("show",): [job],
        ("logs",): [job],
        ("webhooks",): [job],
        ("sweep",): ["show", sweep_id],
        ("simulate",): ["--from-db", "--since", "1d"],  # on the database's machine, an admin's
    }
    database = {"TOWERQ_DATABASE_URL": stack.settings.database_url}
    for command in commands_with_json(parser()):
        stdin = json.dumps(short) if command == ("submit",) else None
        cli.json(*command, *arguments.get(command, []), stdin=stdin, env=database if command == ("simulate",) else None)
    sweep_spec = json.dumps({**body, "name": "again"})
    assert isinstance(cli.json("sweep", "-", stdin=sweep_spec), dict)  # the other form of `sweep`


def test_a_dataset_name_the_api_would_refuse_is_refused_before_a_byte_is_sent(tmp_path: Path) -> None:
    """Nothing listens at the URL: an upload that tried to send would be unreachable."""
    nowhere = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ApiError) as refused:
        Client(nowhere, "tq_x", retries=0).upload_dataset("bad name!", "d.npz", b"x" * 1000)
    assert refused.value.status == 422 and refused.value.detail.startswith("name: 'bad name!': letters, digits")
    folder = tmp_path / "images"
    (folder / "cats").mkdir(parents=True)
    (folder / "cats" / "a.png").write_bytes(b"x")
    cli = Cli(tmp_path, tmp_path / "xdg")
    said = cli("data", "upload", "bad name!", str(folder), "--api", nowhere, "--token", "tq_x")
    assert said.returncode == 2 and "name: 'bad name!'" in said.stderr, said
    # named by its file: one the API would refuse says how to name it
    spaced = tmp_path / "my cells.npz"
    spaced.write_bytes(b"x")
    said = cli("data", "upload", str(spaced), "--api", nowhere, "--token", "tq_x")
    assert said.returncode == 2 and f"(from my cells.npz: name it, towerq data upload NAME '{spaced}')" in said.stderr
    said = cli("data", "upload", "--api", nowhere, "--token", "tq_x")
    assert said.returncode == 2 and "towerq data upload [NAME] PATH: which file or folder?" in said.stderr, said
    # a folder with no class sub-folder is refused before anything is packed or sent
    flat = tmp_path / "flat"
    flat.mkdir()
    for n in range(7):
        (flat / f"{n}.png").write_bytes(b"x")
    said = cli("data", "upload", str(flat), "--api", nowhere, "--token", "tq_x")
    assert said.returncode == 1 and said.stderr.strip() == (
        f"towerq: {flat}: an image folder holds one sub-folder per class (cat/, dog/, ...); "
        "it holds 0.png, 1.png, 2.png, 3.png, 4.png, ..."
    ), said
