"""Following a job live: its event stream (`/api/jobs/{id}/stream`), with the metric rows
stored meanwhile replayed whenever the stream (re)starts, so that a follower misses and
repeats no row across an API restart (`Client.events`, `Job.follow`, `towerq follow`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx

from towerq.client import FINAL_STATES, Client, Job, backoff, checked
from towerq.contract.messages import MessageError, decode
from towerq.errors import UnreachableError

FOLLOW_GIVE_UP_S = 300.0
"""How long following a job waits for an unreachable API (one restarting) before it gives up."""
CONNECTED = "connected"
"""What `stream` yields once the API listens on the job's channel (never passed on)."""
GAP_WAIT_S = 10.0
"""How long a follower that just connected waits for the worker to store the rows published
before it listened (it writes them every quarter of a second)."""


def ended(job: Job) -> dict[str, Any]:
    """A followed job's end, as the `state` event the stream would have sent."""
    return {"type": "state", "state": job.state, "message": job.data.get("error")}


def stored_after(client: Client, job_id: int, seen: dict[str, int]) -> Iterator[dict[str, Any]]:
    """The stored rows of both splits after the steps `seen` (which it advances), as events."""
    for split in ("train", "eval"):
        for row in client.metric_rows(job_id, split, seen[split]):
            seen[split] = row["step"]
            yield {"type": "metric" if split == "train" else "eval", **row}


def rows_before(client: Client, job_id: int, split: str, after: int, step: int) -> list[dict[str, Any]]:
    """The stored rows after step `after` and before `step`, read once the row at `step`
    is stored too (the worker writes in order), or after GAP_WAIT_S."""
    deadline = time.monotonic() + GAP_WAIT_S
    while True:
        rows = client.metric_rows(job_id, split, after)
        if (rows and rows[-1]["step"] >= step) or time.monotonic() > deadline:
            return [row for row in rows if row["step"] < step]
        time.sleep(0.1)


def events(client: Client, job_id: int) -> Iterator[dict[str, Any]]:
    """The job's live events (`metric`, `eval`, `log`, `state`, each a dict with `type`)
    until it ends. When the connection drops (the API restarted) it reconnects with
    back-off, first replaying the metric rows stored meanwhile, so none is missed."""
    seen = {"train": -1, "eval": -1}
    failures = 0
    unreachable_since: float | None = None
    while True:
        try:
            job = client.job(job_id)
            unreachable_since = None
            yield from stored_after(client, job_id, seen)
            if job.state in FINAL_STATES:
                yield ended(job)
                return
            # The rows published before the stream listened but written after the read
            # above (the worker writes in batches) came on neither: the first row of
            # each split on this stream is preceded by those stored before it.
            filling = {"train", "eval"}
            for event in stream(client, job_id):
                failures = 0
                kind = event.get("type")
                if kind == CONNECTED:
                    # The job may have ended between the read above and the stream's
                    # start: its state came on neither. Listening now, ask again.
                    job = client.job(job_id)
                    if job.state in FINAL_STATES:
                        yield from stored_after(client, job_id, seen)
                        yield ended(job)
                        return
                    continue
                if kind in ("metric", "eval"):
                    split = "train" if kind == "metric" else "eval"
                    if event.get("step", -1) <= seen[split]:
                        continue
                    if split in filling:
                        filling.discard(split)
                        for row in rows_before(client, job_id, split, seen[split], event["step"]):
                            seen[split] = row["step"]
                            yield {"type": kind, **row}
                    seen[split] = event["step"]
                yield event
                if kind == "state" and event.get("state") in FINAL_STATES:
                    # Rows published while this stream was being opened are stored by
                    # now (the worker writes them before the job ends): the rest.
                    yield from stored_after(client, job_id, seen)
                    return
        except (httpx.TransportError, UnreachableError) as err:
            # The API may be restarting (the catch-up above is retried too, not only the
            # stream): give up only once it has been unreachable for FOLLOW_GIVE_UP_S.
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > FOLLOW_GIVE_UP_S:
                raise UnreachableError(f"cannot reach the API at {client.url} for {FOLLOW_GIVE_UP_S:.0f} s") from err
            time.sleep(backoff(failures))
            failures += 1


def stream(client: Client, job_id: int) -> Iterator[dict[str, Any]]:
    """The job's channel as the API streams it (server-sent events), each event decoded;
    `CONNECTED` once the API listens (what is published from then on comes here)."""
    timeout = httpx.Timeout(10.0, read=60.0)  # the API sends a keepalive every 15 s
    with client.http.stream("GET", f"/api/jobs/{job_id}/stream", timeout=timeout) as response:
        checked(response, streaming=True)
        data: list[str] = []
        for line in response.iter_lines():
            if line.startswith("data:"):
                data.append(line[5:].strip())
            elif line.startswith(": connected"):
                yield {"type": CONNECTED}  # the API listens from here on
            elif not line and data:
                try:
                    yield decode("\n".join(data)).model_dump(mode="json")
                except MessageError:
                    pass
                data = []
