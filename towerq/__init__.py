"""The towerq Python client: drive a towerq service from a script or a notebook.

from towerq import Client

client = Client()                      # TOWERQ_API_URL / TOWERQ_TOKEN, else `towerq login`
job = client.submit({"model": "lenet5", "dataset": "digits", "gpu_count": 2})
for row in job.follow():               # metric rows as they arrive
    print(row["step"], row["loss"])
job.wait().state                       # "succeeded"
job.metrics(as_frame=True)             # a pandas DataFrame (with pandas installed)
job.download("model.keras", to="out/")
"""

from towerq.client import (
    FINAL_STATES,
    ApiError,
    AuthError,
    Client,
    Config,
    Job,
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
    "TowerqError",
    "UnreachableError",
]
