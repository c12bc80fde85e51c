"""`pip install towerq` without extras is the client alone (issue 45, part 5): the wheel's
own requirements are httpx, pydantic and PyYAML (the server is the `server` extra), and in an
environment holding only those the `towerq` command runs the member commands against a real
API and answers a server command with the extra to install."""

from __future__ import annotations

import argparse
import email
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from service.cli import SERVER_PACKAGES
from service.cli.command import parser
from tests.stack import REPO, Stack, load_script
from towerq.cli.main import SERVER_COMMANDS, client_parser

SPEC = "model: mlp\ndataset: digits\ngpu_count: 1\nhyperparameters:\n  steps: 20\n"


def base_requirements(wheel: Path) -> list[Requirement]:
    """What `pip install` of the wheel itself brings: its requirements outside any extra."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(archive.read(name))
    return [r for r in map(Requirement, metadata.get_all("Requires-Dist") or []) if not r.marker]


def client_only_environment(tmp_path: Path) -> Path:
    """A virtual environment with the wheel and, beside it, only its base requirements (linked
    from this suite's environment: nothing is downloaded). Its `towerq` command."""
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)]
    subprocess.run([*build, str(REPO)], check=True, capture_output=True, cwd=tmp_path)
    (wheel,) = wheels.glob("towerq-*.whl")
    requirements = base_requirements(wheel)
    assert {r.name for r in requirements} == {"httpx", "httpcore", "anyio", "pydantic", "pyyaml", "websockets"}, (
        requirements
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)]
    subprocess.run(install, check=True, capture_output=True)
    deps = tmp_path / "client-deps"
    deps.mkdir()
    for dist in load_script("lock.py").closure(requirements).values():
        root = Path(str(dist.locate_file("")))
        for top in {f.parts[0] for f in dist.files or [] if not f.parts[0].startswith("..")}:
            if not (deps / top).exists():
                (deps / top).symlink_to(root / top)
    purelib = subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    (Path(purelib.decode().strip()) / "client-deps.pth").write_text(f"{deps}\n")
    return venv / "bin" / "towerq"


def test_the_client_only_command_knows_every_server_command_by_name() -> None:
    whole = command_names(parser())
    member = command_names(client_parser())
    assert set(SERVER_COMMANDS) == whole - member and member < whole


def command_names(top: argparse.ArgumentParser) -> set[str]:
    (subcommands,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    return set(subcommands.choices)


@pytest.mark.slow
def test_a_client_only_install_runs_the_member_commands_and_names_the_extra_for_server_ones(
    stack: Stack, make_token: Callable[..., str], tmp_path: Path
) -> None:
    towerq = client_only_environment(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOWERQ_") and k != "PYTHONPATH"}
    env["HOME"] = str(tmp_path)

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(towerq), *args], env={**env, **extra}, cwd=tmp_path, capture_output=True, text=True)

    python = towerq.parent / "python"
    for module in sorted(SERVER_PACKAGES | {"tensorflow"}):  # none of the server is there
        probe = subprocess.run([python, "-c", f"import {module}"], env=env, capture_output=True, text=True)
        assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, module

    shown = run("--help")
    assert shown.returncode == 0 and "submit" in shown.stdout and "pip install 'towerq[server]'" in shown.stdout
    up = run("up")
    assert up.returncode == 2 and "`towerq up` is a server command" in up.stderr, up.stderr
    assert "pip install 'towerq[server]'" in up.stderr and "Traceback" not in up.stderr

    stack.start_api()
    login = {"TOWERQ_API_URL": str(stack.api_url), "TOWERQ_TOKEN": make_token("alice")}
    (tmp_path / "job.yaml").write_text(SPEC)
    submitted = run("submit", "job.yaml", "-o", "json", **login)
    assert submitted.returncode == 0, submitted.stderr
    listed = run("jobs", **login)
    assert listed.returncode == 0 and "mlp" in listed.stdout and "queued" in listed.stdout, listed.stdout
    refused = run("submit", "job.yaml", "--set", "gpu_count=-1", **login)
    assert refused.returncode == 1 and "gpu_count" in refused.stderr and "Traceback" not in refused.stderr
    shell = run("shell", "99", **login)  # its WebSocket library is the client's own
    assert shell.returncode == 1 and "job 99 not found" in shell.stderr, shell.stderr
    unreachable = run("jobs", TOWERQ_API_URL="http://127.0.0.1:9", TOWERQ_TOKEN="tq_x")
    assert unreachable.returncode == 4 and "cannot reach the API" in unreachable.stderr, unreachable.stderr
    # tokens go through the API: a member makes one for a script from the client alone
    made = run("token", "create", "--user", "alice", "--name", "ci", **login)
    assert made.returncode == 0 and made.stdout.splitlines()[-1].startswith("tq_"), made.stderr
    assert "ci" in run("token", "list", **login).stdout
    lost = run("token", "list")  # not logged in, and no database here to fall back on
    assert lost.returncode == 1 and "not logged in: `towerq login URL" in lost.stderr, lost.stderr
