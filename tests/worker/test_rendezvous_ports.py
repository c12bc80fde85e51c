"""The run of ports a rank takes at the rendezvous (`worker.rendezvous.free_port`): a command
job's rank over several hosts listens on its first port and the next ones (`worker.gang`)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from service.core.settings import Settings
from worker.rendezvous import RendezvousError, free_port


def a_free_span(width: int) -> int:
    """The first port of `width` free ports in a row on loopback (the kernel's pick, then checked)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            low = probe.getsockname()[1]
        if low + width < 65535 and all(_bindable(port) for port in range(low, low + width)):
            return int(low)
    raise AssertionError("no free span of ports on this machine")


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_rank_takes_the_first_run_of_free_ports_and_skips_one_in_use(
    make_settings: Callable[..., Settings], sqlite_url: str
) -> None:
    low = a_free_span(10)
    settings = make_settings(sqlite_url, rank_ports=f"{low}-{low + 9}")
    with socket.create_server(("127.0.0.1", low + 1)):  # another program's listener
        assert free_port(settings, "127.0.0.1", 0, count=1) == low
        assert free_port(settings, "127.0.0.1", 0, count=3) == low + 2, "the run starts past the port in use"
        assert free_port(settings, "127.0.0.1", 8, count=3) == low + 2, "a run does not wrap past the range's end"
        with pytest.raises(RendezvousError, match="no 9 free ports in a row"):
            free_port(settings, "127.0.0.1", 0, count=9)
