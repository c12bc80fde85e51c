"""The suite's Slurm itself: a port another process took between its pick and the daemon's
bind is not the test's failure (it starts again on others)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests import slurm_cluster
from tests.slurm_cluster import SlurmCluster, missing

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")


def test_a_port_taken_before_slurmd_binds_it_is_given_up_for_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        picks = iter([slurm_cluster._free_port(), taken.getsockname()[1]])  # slurmctld's, then slurmd's
        real = slurm_cluster._free_port
        monkeypatch.setattr(slurm_cluster, "_free_port", lambda: next(picks, None) or real())
        cluster = SlurmCluster(tmp_path / "slurm", gpus=1, cpus=2)
        try:
            cluster.start()
            assert cluster.node_idle()
            assert "Address already in use" in (tmp_path / "slurm" / "log" / "slurmd.out").read_text()
        finally:
            cluster.stop()
