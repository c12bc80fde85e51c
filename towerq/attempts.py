"""The attempt protocol over HTTP (`towerq.contract.attempts`): the channel of an executor's
remote side (a Slurm node's batch script) to the API's `/api/attempts/{job}/{attempt}/...`,
with the attempt's own token and no database or Redis credential.

Standard library, httpx and the contract only. A request that got no answer (the API is
restarting, the network blinked), or that it could not answer yet (503: it could not ask the
cluster where the attempt runs), is sent again with back-off for up to `RETRY_FOR_S`: each
call is safe to repeat (a report is numbered and stored once, `running` twice is taken, an
end twice finds the attempt over), except the live copies, which are not sent again.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import Any

import httpx

from towerq.contract.attempts import (
    AttemptEnd,
    AttemptStatus,
    Claim,
    EndIn,
    Figures,
    LineIn,
    PointIn,
    Refused,
    Report,
    ReportIn,
    RungsOut,
    RunningIn,
    StaleAttempt,
    StatusOut,
    Stored,
)
from towerq.errors import describe

RETRY_FOR_S = 60.0
"""How long a request the API did not receive is tried again before the error is raised."""
BACKOFF_MAX_S = 5.0
STATUS_TIMEOUT_S = 5.0
LIVE_BATCHES = 256
"""Batches of live copies waiting to be sent; past it the newest are dropped (the reports
store everything: a chart that missed them catches up from the stored points)."""


class HttpChannel:
    """`AttemptChannel` for job `job_id`'s attempt `attempt` through the API at `url`."""

    def __init__(
        self,
        url: str,
        token: str,
        job_id: int,
        attempt: int,
        *,
        http: httpx.Client | None = None,
        retry_for: float = RETRY_FOR_S,
    ) -> None:
        self.job_id = job_id
        self.retry_for = retry_for
        """How long a request without an answer, or answered 503, is sent again."""
        self.attempt = attempt
        self.path = f"/api/attempts/{job_id}/{attempt}"
        self.http = http or httpx.Client(base_url=url, timeout=30.0)
        self.headers = {"Authorization": f"Bearer {token}"}
        self._live: queue.Queue[list[str] | None] = queue.Queue(LIVE_BATCHES)
        self._reports = 0
        """Reports sent so far (each numbered: a resend is stored once)."""
        self._sender: threading.Thread | None = None

    def close(self) -> None:
        if self._sender is not None:
            self._live.put(None)
            self._sender.join(10)
        self.http.close()

    def claim(self, node: str) -> Claim:
        return Claim.model_validate(self._taken("POST", "/claim", {"node": node}).json())

    def status(self) -> AttemptStatus:
        """Asked every second by the runner's reading thread, which must not stall on an API
        that restarts: one try, a short timeout, and an unanswered question changes nothing
        (the attempt goes on; a stop asked meanwhile is read at the next answer)."""
        try:
            answer = self._send("GET", "", retry_for=0, timeout=STATUS_TIMEOUT_S)
        except StaleAttempt:
            return AttemptStatus(current=False)
        except httpx.HTTPError:
            return AttemptStatus(current=True)
        return AttemptStatus(**StatusOut.model_validate(answer.json()).model_dump())

    def running(self, pid: int, cuda_visible_devices: str, artifacts_dir: str) -> None:
        body = RunningIn(pid=pid, cuda_visible_devices=cuda_visible_devices, artifacts_dir=artifacts_dir)
        self._send("POST", "/running", body.model_dump(mode="json"))

    def stored(self) -> Stored:
        said = self._send("GET", "/stored").json()
        return Stored(log_bytes=int(said["log_bytes"]), metric_points=int(said["metric_points"]))

    def rungs(self) -> tuple[str, list[int]]:
        said = RungsOut.model_validate(self._send("GET", "/rungs").json())
        return said.split, said.steps

    def report(self, report: Report) -> None:
        self._reports += 1
        body = ReportIn(
            number=self._reports,
            metrics=[PointIn.model_validate({k: v for k, v in m.items() if k != "job_id"}) for m in report.metrics],
            logs=[LineIn(time=line["time"], level=line["level"], message=line["message"]) for line in report.logs],  # type: ignore[arg-type]
            fields=Figures.model_validate(report.fields),
            log_bytes=report.log_bytes,
            last_words=report.last_words,
            held=report.held,
            rung=report.rung,
        )
        self._send("POST", "/reports", body.model_dump(mode="json", exclude_unset=True))

    def publish(self, payloads: list[str]) -> None:
        """Handed to a thread of its own: the runner's reading thread calls this after each
        read of the trainer's output and must never wait on the network."""
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_live, name=f"live-{self.job_id}", daemon=True)
            self._sender.start()
        try:
            self._live.put_nowait(payloads)
        except queue.Full:
            pass  # live copies only: the reports store what they carry

    def _send_live(self) -> None:
        while (payloads := self._live.get()) is not None:
            try:
                self._send("POST", "/publish", {"messages": payloads}, retry_for=0)
            except (httpx.HTTPError, StaleAttempt):
                pass

    def forget_after(self, step: int) -> None:
        self._send("POST", "/forget", {"step": step})

    def end(self, end: AttemptEnd) -> None:
        body = EndIn(
            ending=end.ending,
            message=end.message,
            exit_code=end.exit_code,
            crashed=end.crashed,
            out_of_memory=end.out_of_memory,
        )
        self._send("POST", "/end", body.model_dump(mode="json"))

    def drain(self, host: str, indices: list[int]) -> None:
        self._send("POST", "/drain", {"host": host, "indices": indices})

    def open_door(self, address: str, key: str) -> None:
        self._taken("POST", "/door", {"address": address, "key": key})

    def close_door(self) -> None:
        self._send("DELETE", "/door")

    def _taken(self, method: str, path: str, body: dict[str, Any]) -> httpx.Response:
        """`_send`, where the API may refuse what the attempt says: `Refused` with its words
        for a refusal (422) and for an API that could not take it (503, no answer)."""
        try:
            return self._send(method, path, body)
        except httpx.HTTPStatusError as err:
            if err.response.status_code not in (422, 503):
                raise
            raise Refused(detail_of(err.response), passing=err.response.status_code == 503) from err
        except httpx.TransportError as err:
            raise Refused(f"the API at {self.http.base_url} did not answer: {err}", passing=True) from err

    def _send(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        retry_for: float | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        """The API's answer; `StaleAttempt` for 409 (the job moved on from the attempt) and
        401 (the attempt's token is refused: it ended with the attempt, or a newer
        submission of the attempt has its own), `httpx.HTTPStatusError` for another error."""
        content = json.dumps(body).encode() if body is not None else None
        headers = {**self.headers, "Content-Type": "application/json"} if content else self.headers
        give_up = time.monotonic() + (self.retry_for if retry_for is None else retry_for)
        wait = 0.25
        while True:
            try:
                answer = self.http.request(
                    method,
                    self.path + path,
                    content=content,
                    headers=headers,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.TransportError:  # no answer: it may or may not have arrived
                if time.monotonic() + wait > give_up:
                    raise
            else:
                if answer.status_code != 503 or time.monotonic() + wait > give_up:
                    break  # 503: the API cannot answer yet (Slurm cannot be asked): try again
            time.sleep(wait)
            wait = min(wait * 2, BACKOFF_MAX_S)
        if answer.status_code in (401, 409):  # the token ends with the attempt: either way it is over
            raise StaleAttempt(detail_of(answer))
        if answer.status_code >= 400:
            raise httpx.HTTPStatusError(
                f"{method} {self.path}{path}: {answer.status_code} {detail_of(answer)}",
                request=answer.request,
                response=answer,
            )
        return answer


def detail_of(answer: httpx.Response) -> str:
    """What the API said of an error, in its words (`towerq.errors.describe`: each refused
    field's message, naming the field)."""
    try:
        detail = answer.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return describe(detail) if detail is not None else answer.text[:500]
