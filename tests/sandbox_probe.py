"""A probe program run in a sandbox from `worker.sandbox.bwrap_command` itself, with no
worker around it: what a job's code would find there (tests/security/test_host_root.py,
tests/worker/test_sandbox_names.py)."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from worker import sandbox

NOBODY = (65534, 65534)


@contextmanager
def sandbox_lab(probe: str) -> Iterator[Path]:
    """Folders any user may look through (a worker that is not root must reach them), and
    the `probe` program."""
    with tempfile.TemporaryDirectory(dir="/var/tmp") as folder:
        root = Path(folder)
        root.chmod(0o755)
        for name in ("job", "models", "data"):
            (root / name).mkdir()
        (root / "probe.py").write_text(probe)
        yield root


def run_probe(
    lab: Path, identity: sandbox.Identity | None, monkeypatch: pytest.MonkeyPatch, **view: Any
) -> dict[str, Any]:
    """The lab's probe in a sandbox (`view`: more of `bwrap_command`'s arguments), as a root
    worker runs it (`identity`) or one that is not root (None); the JSON it printed last."""
    monkeypatch.setattr(sandbox, "python_paths", lambda *_args, **_kw: [])  # the system's Python is enough here
    command = sandbox.bwrap_command(
        ["/usr/bin/python3", "/probe.py"],
        job_folder=lab / "job",
        repo_root=lab,
        models_path=lab / "models",
        data_dir=lab / "data",
        datasets=[],
        code_path=None,
        devices=view.pop("devices", None) or [],
        identity=identity,
        tmp_mb=16,
        **view,
    )
    at = command.index("--chdir")  # the probe itself, read-only, beside the job's view
    command[at:at] = ["--ro-bind", str(lab / "probe.py"), "/probe.py"]
    if identity is None:  # a worker that is not root: bwrap itself runs unprivileged
        sandbox.hand_over(lab / "job", NOBODY)
        uid, gid = NOBODY
        command = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *command]
    else:
        sandbox.hand_over(lab / "job", identity)
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))
