"""scripts/gpu-check, the real-GPU check (docs/gpu-check.md), run here against the fake NVML
of tests/fakenvml: every check of its table passes, so the script is ready for a GPU host."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu-check"


def test_gpu_check_passes_against_the_fake_nvml(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--fake-nvml", "--json", str(results)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = json.loads(results.read_text())["results"]
    assert [row["ok"] for row in rows] == [True] * 7, rows
    assert "over its share of 32,431 MiB" in rows[2]["figure"]
    assert rows[4]["figure"].startswith("succeeded: idle for") and "kernel: sees " in rows[4]["figure"], rows[4]
    assert "| GPUs page shows the real GPU | yes |" in done.stdout
    assert rows[6]["figure"].endswith("the spinning process's part 60.0%, the idle one's 0.0%"), rows[6]
