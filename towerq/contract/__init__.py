"""The contract the service, the worker, the trainer and the client share: the job spec
(`spec`), the built-in models and datasets (`catalog`) and the job folder's layout and
confinement (`paths`). Pure pydantic and the standard library: it imports nothing of
towerq's service, worker or client, so a trainer in its sandbox sees it and nothing more."""
