"""scripts/check-gpus.py, the GPU host check: NVML's view of this host, as the worker sees it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from worker.inventory import open_nvml

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check-gpus.py"


def test_check_gpus_reports_the_driver_or_its_absence() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    report = json.loads(done.stdout)
    nvml, why = open_nvml()
    if nvml is None:  # no driver (CI, this machine): said in words, and a failing exit
        assert done.returncode == 1
        assert report == {"nvml": False, "error": f"{why}: a worker here gets simulated GPUs"}
        assert "NVIDIA" in why or "nvidia-ml-py" in why
    else:
        nvml.nvmlShutdown()
        assert done.returncode == 0, done.stdout
        assert report["ok"] is True and report["gpus"]
        assert all(g["uuid"].startswith("GPU-") and not g["simulated"] for g in report["gpus"])
