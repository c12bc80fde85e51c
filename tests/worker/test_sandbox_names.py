"""A sandbox without network looks names up in `/etc/hosts` alone (`worker.sandbox_names`):
an address that misses it is named by its number and a name that misses it is unknown at
once, where DNS, out of reach, made both a "temporary failure" (PyTorch's c10d warned of
it on every connection of every DDP job). With network, the host's switch stands."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox_probe import NOBODY, run_probe, sandbox_lab
from worker import sandbox_names

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
    with sandbox_lab(PROBE) as root:
        yield root


def probe(lab: Path, network: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    own = lab / "towerq-own"
    own.mkdir(mode=0o700)  # as TOWERQ_VAR_DIR: the job's user does not look through it
    return run_probe(lab, NOBODY, monkeypatch, network=network, own_folder=own)


def test_without_network_a_lookup_that_misses_etc_hosts_never_waits_on_dns(
    lab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = probe(lab, False, monkeypatch)
    assert found["::ffff:127.0.0.1"] == "::ffff:127.0.0.1" and found["192.0.2.1"] == "192.0.2.1", found
    assert found["unknown name"] == -2, "EAI_NONAME: unknown, not a temporary failure (-3)"
    assert found["switch"] == sandbox_names.offline_switch(Path("/etc/nsswitch.conf").read_text())


def test_with_network_the_hosts_switch_stands(lab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert probe(lab, True, monkeypatch)["switch"] == Path("/etc/nsswitch.conf").read_text()
