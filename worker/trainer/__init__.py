"""The TensorFlow side: a spec file in, JSON lines out, files in the job's artifact folder.

Imports neither `service` nor the rest of `worker` (only `worker.trainer.*`): it runs as its
own process, `python -m worker.trainer SPEC.json`, and speaks to its parent through stdout
lines (see `protocol`) and signals (SIGTERM: checkpoint, then exit).
"""
