"""A sandbox without network looks names up in `/etc/hosts` alone (`worker.sandbox_names`):
an address that misses it is named by its number and a name that misses it is unknown at
once, where DNS, out of reach, made both a "temporary failure" (PyTorch's c10d warned of
it on every connection of every DDP job). With network, the host's switch stands."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker import sandbox, sandbox_names

NOBODY = (65534, 65534)
PROBE = r"""
import json, socket
found = {}
for address in ("::ffff:127.0.0.1", "192.0.2.1"):
    try:
        found[address] = socket.getnameinfo((address, 0), 0)[0]
    except OSError as err:
        found[address] = err.errno
try:
    socket.getaddrinfo("no-such-host.invalid", 80)
except socket.gaierror as err:
    found["unknown name"] = err.errno
found["switch"] = open("/etc/nsswitch.conf").read()
print(json.dumps(found))
"""


@pytest.mark.parametrize(
    ("host", "seen"),
    [
        ("passwd: files\nhosts: files dns\nnetworks: files\n", "passwd: files\nnetworks: files\nhosts: files\n"),
        ("hosts:  files mdns4_minimal [NOTFOUND=return] dns myhostname\n", "hosts: files myhostname\n"),
        ("# hosts: dns\ngroup: files systemd\n", "# hosts: dns\ngroup: files systemd\nhosts: files\n"),
        ("hosts: dns\n", "hosts: files\n"),
    ],
)
def test_the_offline_switch_keeps_the_hosts_local_sources_and_every_other_line(host: str, seen: str) -> None:
    assert sandbox_names.offline_switch(host) == seen


@pytest.fixture
def lab() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as folder:
        root = Path(folder)
        root.chmod(0o755)
        for name in ("job", "models", "data"):
            (root / name).mkdir()
        (root / "probe.py").write_text(PROBE)
        yield root


def probe(lab: Path, network: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    monkeypatch.setattr(sandbox, "python_paths", lambda *_args, **_kw: [])  # the system's Python is enough here
    own = lab / "towerq-own"
    own.mkdir(mode=0o700)  # as TOWERQ_VAR_DIR: the job's user does not look through it
    command = sandbox.bwrap_command(
        ["/usr/bin/python3", "/probe.py"],
        job_folder=lab / "job",
        repo_root=lab,
        models_path=lab / "models",
        data_dir=lab / "data",
        datasets=[],
        code_path=None,
        devices=[],
        identity=NOBODY,
        tmp_mb=16,
        network=network,
        own_folder=own,
    )
    at = command.index("--chdir")
    command[at:at] = ["--ro-bind", str(lab / "probe.py"), "/probe.py"]
    sandbox.hand_over(lab / "job", NOBODY)
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_without_network_a_lookup_that_misses_etc_hosts_never_waits_on_dns(
    lab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = probe(lab, False, monkeypatch)
    assert found["::ffff:127.0.0.1"] == "::ffff:127.0.0.1" and found["192.0.2.1"] == "192.0.2.1", found
    assert found["unknown name"] == -2, "EAI_NONAME: unknown, not a temporary failure (-3)"
    assert found["switch"] == sandbox_names.offline_switch(Path("/etc/nsswitch.conf").read_text())


def test_with_network_the_hosts_switch_stands(lab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert probe(lab, True, monkeypatch)["switch"] == Path("/etc/nsswitch.conf").read_text()
