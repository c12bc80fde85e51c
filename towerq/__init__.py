"""The towerq Python client: drive a towerq service from a script or a notebook.

from towerq import Client

client = Client()                      # TOWERQ_API_URL / TOWERQ_TOKEN, else `towerq login`
job = client.submit({"model": "lenet5", "dataset": "digits", "gpu_count": 2})
for row in job.follow():               # metric rows as they arrive
    print(row["step"], row["loss"])
job.wait().state                       # "succeeded"
job.metrics(as_frame=True)             # a pandas DataFrame (with pandas installed)
job.download("model.keras", to="out/")

towerq.report(step=120, loss=0.31)     # inside a command job: a point of its charts
towerq.report_logs(120, logs)          # a framework's dict of numbers (val_/eval_: an evaluation)

`towerq.contract` is the job spec, the catalog and the job-folder layout: the one contract the
service, the trainer and this client share. The trainer imports it in its sandbox, so this
package loads the client (and httpx) only when a name of the client is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from towerq.client import (
        FINAL_STATES,
        ApiError,
        AuthError,
        Client,
        Config,
        Job,
        MissingPackageError,
        TowerqError,
        UnreachableError,
    )

__all__ = [
    "FINAL_STATES",
    "ApiError",
    "AuthError",
    "Client",
    "Config",
    "Job",
    "MissingPackageError",
    "TowerqError",
    "UnreachableError",
]


def __getattr__(name: str) -> Any:
    if name in ("report", "report_logs"):  # a command job's metrics: the standard library only, no client
        return getattr(importlib.import_module("towerq.reporting"), name)
    if name in __all__:
        return getattr(importlib.import_module("towerq.client"), name)
    raise AttributeError(f"module 'towerq' has no attribute {name!r}")
