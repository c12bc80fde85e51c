"""The client itself: HTTP with retries, jobs, sweeps, uploads, metrics (where it finds
the API and its token: `towerq.config`; following a job live: `towerq.following`; the
lab's calls, tokens, users, GPUs, groups and reservations: `towerq.lab_calls`).

Standard library and httpx only: it imports nothing of the service, so a laptop needs
neither TensorFlow nor a database driver to use it.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from towerq.bundle import Sent, packed_folder
from towerq.config import Config
from towerq.contract.api import LOG_LINES_KEPT, LOG_TRIMMED_HEADER, SHELL_INPUT_VARIABLE, dataset_name_problem
from towerq.errors import ApiError, AuthError, MissingPackageError, TowerqError, UnreachableError
from towerq.lab_calls import LabCalls

FINAL_STATES = ("succeeded", "failed", "cancelled")
LOG_PAGE = 1000
"""Log lines read at once (the API's most); a full page is followed by the next at once."""
__all__ = [
    "FINAL_STATES", "ApiError", "AuthError", "Client", "Config", "Job", "MissingPackageError", "TowerqError",
    "UnreachableError",
]  # fmt: skip
RETRY_STATUSES = (502, 503, 504)
BACKOFF_MAX_S = 10.0


class Client(LabCalls):
    """A towerq API: `Client(url=None, token=None)` (see `Config`). Requests that find the
    API down, or a gateway error, are retried with back-off (`retries` times)."""

    def __init__(
        self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0, retries: int = 4
    ) -> None:
        self.config = Config.load(url, token)
        self.url = self.config.url
        self.retries = retries
        headers = {"Authorization": f"Bearer {self.config.token}"} if self.config.token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- HTTP -----------------------------------------------------------------------------

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON answer of `method path`; raises ApiError, AuthError or UnreachableError."""
        response = self._send(lambda: self.http.request(method, path, **kwargs))
        return response.json() if response.content else None

    def _send(self, send: Callable[[], httpx.Response]) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                response = send()
            except httpx.TransportError as err:
                if attempt == self.retries:
                    raise UnreachableError(f"cannot reach the API at {self.url}: {err}") from err
            else:
                if response.status_code not in RETRY_STATUSES or attempt == self.retries:
                    return checked(response)
            time.sleep(backoff(attempt))
        raise AssertionError("unreachable")

    # -- jobs -------------------------------------------------------------------------------

    def submit(self, spec: dict[str, Any], *, idempotency_key: str | None = None) -> Job:
        """Submit a job spec; a retried submit (same `idempotency_key`, one is made for you)
        never makes two jobs."""
        key = idempotency_key or uuid.uuid4().hex
        data = self.request("POST", "/api/jobs", json=spec, headers={"Idempotency-Key": key})
        return Job(self, data)

    def job(self, job_id: int) -> Job:
        return Job(self, self.request("GET", f"/api/jobs/{job_id}"))

    def cloned_spec(self, job_id: int) -> dict[str, Any]:
        """Job `job_id`'s spec to submit again (its model or command, code bundle, dataset): not
        on hold (a hold is the submitter's choice), its begin only while it is ahead."""
        spec = dict(self.job(job_id).data["spec"])
        spec.pop("hold", None)
        begin = spec.get("begin_at")
        if begin and datetime.fromisoformat(begin) <= datetime.now(UTC):
            spec.pop("begin_at")
        return spec

    def clone(self, job_id: int, **changes: Any) -> Job:
        """Submit job `job_id` again, its spec's top-level fields replaced by `changes`
        (`client.clone(12, hyperparameters={**old, "learning_rate": 0.01})`, `gpu_count=4`):
        `towerq submit --clone`, the dashboard's Clone."""
        return self.submit({**self.cloned_spec(job_id), **changes})

    def jobs(self, *, state: str | list[str] | None = None, user: str | None = None, limit: int = 20) -> list[Job]:
        return [Job(self, item) for item in self.jobs_page(state=state, user=user, limit=limit)["items"]]

    def jobs_page(
        self, *, state: str | list[str] | None = None, user: str | None = None, limit: int = 20, offset: int = 0
    ) -> dict[str, Any]:
        """Jobs newest first, as the API pages them (`limit` at most 500, after the first
        `offset`): `items` and the `total` that match."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if state:
            params["state"] = [state] if isinstance(state, str) else state
        if user:
            params["user"] = user
        return dict(self.request("GET", "/api/jobs", params=params))

    def dry_run(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Check a spec and say where and when it would start; submits nothing."""
        return dict(self.request("POST", "/api/jobs", params={"dry_run": "true"}, json=spec))

    def logs(self, job_id: int, *, tail: int | None = None, after_id: int | None = None) -> list[dict[str, Any]]:
        """A job's log lines (`id`, `time`, `level`, `message`): the last `tail`, or those
        after the line `after_id`."""
        params = {k: v for k, v in (("tail", tail), ("after_id", after_id)) if v is not None}
        return list(self._logs_answer(job_id, params).json())

    def log_tail(self, job_id: int, tail: int | None = None) -> list[dict[str, Any]]:
        """The job's last `tail` log lines, oldest first (None: every line the database keeps,
        its newest `LOG_LINES_KEPT`). Where lines before them were trimmed from the database,
        a line of level `towerq` first says so, and where they all are (its `log.txt`)."""
        page = self._logs_answer(job_id, {"tail": tail or LOG_LINES_KEPT})
        rows = list(page.json())
        trimmed = int(page.headers.get(LOG_TRIMMED_HEADER, 0))
        if trimmed and (tail is None or len(rows) < tail):
            return [trimmed_line(job_id, trimmed, rows, EARLIER_TRIMMED), *rows]
        return rows

    def log_lines(
        self, job_id: int, *, after: int = 0, follow: bool = False, poll_s: float = 1.0
    ) -> Iterator[dict[str, Any]]:
        """The job's log lines after the line `after` (0: its last `LOG_PAGE`), each once and in
        order; with `follow`, the lines to come too, read every `poll_s`, until the job ends
        and its last line is read. Where lines after `after` were trimmed from the database
        before they were read (it keeps a job's newest `LOG_LINES_KEPT`), a line of level
        `towerq` says so in their place, once: its `log.txt` has them all."""
        while True:
            ended = follow and self.job(job_id).done  # asked first: the lines it wrote before it ended follow
            page = self._logs_answer(job_id, {"after_id": after, "tail": LOG_PAGE})
            rows = page.json()
            trimmed = int(page.headers.get(LOG_TRIMMED_HEADER, 0))
            if 0 < after < trimmed:
                yield trimmed_line(job_id, trimmed, rows)
                after = trimmed
            yield from rows
            after = max([after, *(int(row["id"]) for row in rows)])
            if len(rows) == LOG_PAGE:
                continue
            if not follow or ended:
                return
            time.sleep(poll_s)

    def _logs_answer(self, job_id: int, params: dict[str, int]) -> httpx.Response:
        """`GET /api/jobs/{id}/logs` whole: its lines, and its headers (`LOG_TRIMMED_HEADER`)."""
        return self._send(lambda: self.http.get(f"/api/jobs/{job_id}/logs", params=params))

    def cancel(self, job_id: int) -> Job:
        return Job(self, self.request("POST", f"/api/jobs/{job_id}/cancel"))

    def hold(self, job_id: int) -> Job:
        """Put a queued job on hold: it waits until released (`release`); yours, or any as an
        admin. `ApiError` 409 for a job that is not queued."""
        return Job(self, self.request("POST", f"/api/jobs/{job_id}/hold"))

    def release(self, job_id: int) -> Job:
        """Release a job on hold (one you held, or any as an admin): it queues again, as if it
        had waited only while it was not on hold."""
        return Job(self, self.request("POST", f"/api/jobs/{job_id}/release"))

    def change(
        self,
        job_id: int,
        *,
        name: str | None = None,
        priority: str | None = None,
        time_limit_s: int | None = None,
        begin_at: str | None = None,
    ) -> Job:
        """Rename a job (at any time), change a queued job's `priority` (`low`, `normal`,
        `high`: up to your highest), its `begin_at` until it first runs (an ISO time: it
        starts no earlier), or its `time_limit_s` until it ends (a running job's counts from
        its start; once it started only an admin lengthens it, `ApiError` 403); only the
        fields given change. A job that has left the queue keeps its priority and begin, an
        ended one its time limit (`ApiError` 409)."""
        fields = {"name": name, "priority": priority, "time_limit_s": time_limit_s, "begin_at": begin_at}
        body = {key: value for key, value in fields.items() if value is not None}
        return Job(self, self.request("PATCH", f"/api/jobs/{job_id}", json=body))

    def share(self, job_id: int, visibility: str = "lab") -> Job:
        """Let every member read the job's log, artifacts and code (`visibility="lab"`), or
        only you and the admins again (`"private"`, the default of a new job)."""
        return Job(self, self.request("PATCH", f"/api/jobs/{job_id}", json={"visibility": visibility}))

    def resend_webhook(self, job_id: int, delivery: int) -> Job:
        """Send a failed webhook delivery of the job again (its owner or an admin), once its
        receiver is mended: the same body and delivery number (`notifications` of the job
        list them). `ApiError` 409 for one pending or delivered, 404 for none of the job's."""
        return Job(self, self.request("POST", f"/api/jobs/{job_id}/notifications/{delivery}/resend"))

    def sweep(self, body: dict[str, Any]) -> dict[str, Any]:
        """Launch a sweep (`name`, `base`, `grid` or `random`, `metric`, `goal`, ...; see
        docs/sweeps.md): the sweep with its jobs (`jobs`: id, setting, state)."""
        return dict(self.request("POST", "/api/sweeps", json=body))

    def sweeps(self) -> list[dict[str, Any]]:
        """Every sweep, newest first: its progress and best job (without its jobs)."""
        return list(self.request("GET", "/api/sweeps")["items"])

    def sweep_status(self, sweep_id: int) -> dict[str, Any]:
        """A sweep's progress, results and best job."""
        return dict(self.request("GET", f"/api/sweeps/{sweep_id}"))

    def cancel_sweep(self, sweep_id: int) -> dict[str, Any]:
        """Cancel every unfinished job of a sweep (yours, or any as an admin); the sweep."""
        return dict(self.request("POST", f"/api/sweeps/{sweep_id}/cancel"))

    def send_code(self, folder: str | Path = ".") -> Sent:
        """`folder`'s code as a bundle on the API (`towerq.bundle`: what `.gitignore` and
        `.towerqignore` name left out), sent only when the API lacks the same files; what
        was sent, with its id for a spec's `code`. `FolderError` for a folder that cannot be
        a bundle (missing, empty, over the limit: naming its biggest files)."""
        packed = packed_folder(Path(folder))
        held = (packed.id, len(packed.entries), packed.size, packed.left_out)
        try:
            self.request("GET", f"/api/code/{packed.id}")
            return Sent(*held, sent=False)
        except ApiError:
            pass  # not there, or not yet yours: send it
        answer = self.upload_code(f"{Path(folder).resolve().name or 'code'}.tar.gz", packed.data)
        return Sent(str(answer["id"]), *held[1:], sent=True)

    def run(self, command: list[str], folder: str | Path = ".", gpus: int = 1, **fields: Any) -> Job:
        """Run `command` (a list, as `towerq run -- ...` takes it) from `folder`'s code as a
        command job on `gpus` GPUs; `fields`: the spec's others (`env`, `processes`,
        `resumable`, `time_limit_s`, ...; docs/command-jobs.md). The job, as submitted."""
        if fields.get("dataset") and ":" not in fields["dataset"]:  # an upload by its name
            fields["dataset"] = self.dataset_reference(fields["dataset"]) or fields["dataset"]
        sent = self.send_code(folder)
        return self.submit({"command": list(command), "code": sent.id, "gpu_count": gpus, **fields})

    def upload_code(self, name: str, data: bytes) -> dict[str, Any]:
        """Upload a code bundle (a .py, or a .zip / .tar.gz of a folder); its id and files."""
        return dict(self.request("POST", "/api/code", files={"file": (name, data)}))

    # -- notebook sessions ------------------------------------------------------------------

    def open_terminal(self, job_id: int, piped: bool = False) -> str:
        """A new terminal (a shell) in running notebook session `job_id`; its name. Its
        WebSocket is at `socket_url(f"/sessions/{job_id}/terminals/websocket/{name}")`.
        `piped`: what will be typed is a script, which the shell reads without prompts or
        echo, as `ssh host bash < script` does (a session older than this ignores it)."""
        body = {"extra_env": {SHELL_INPUT_VARIABLE: "piped"}} if piped else {}
        made = self.request("POST", f"/sessions/{job_id}/api/terminals", json=body, headers=self._xsrf(job_id))
        return str(made["name"])

    def close_terminal(self, job_id: int, name: str) -> None:
        """End a terminal of the session, and its shell."""
        self._send(lambda: self.http.delete(f"/sessions/{job_id}/api/terminals/{name}", headers=self._xsrf(job_id)))

    def shut_down(self, job_id: int) -> None:
        """End running notebook session `job_id` as JupyterLab's File > Shut Down does: its
        kernels and terminals end, and so does the session (`succeeded`). A session that is
        not running: ApiError (`cancel` ends it)."""
        self._send(lambda: self.http.post(f"/sessions/{job_id}/api/shutdown", headers=self._xsrf(job_id)))

    def socket_url(self, path: str) -> str:
        """The ws:// (wss://) URL of the API's `path`."""
        return "ws" + self.url.rstrip("/").removeprefix("http") + path

    def _xsrf(self, job_id: int) -> dict[str, str]:
        """JupyterLab's XSRF header, which a change through the session's proxy needs (from
        the cookie its page sets, once)."""
        path = f"/sessions/{job_id}/"

        def own() -> list[str]:
            jar = self.http.cookies.jar
            return [c.value or "" for c in jar if c.name == "_xsrf" and path.startswith(c.path.rstrip("/") + "/")]

        if not own():
            self._send(lambda: self.http.get(f"{path}lab"))
        return {"X-XSRFToken": (own() or [""])[-1]}

    # -- datasets and the lab ---------------------------------------------------------------

    def upload_dataset(self, name: str, filename: str, content: bytes | BinaryIO) -> dict[str, Any]:
        """Upload a dataset (.npz, .tfrecord, or a .zip of images, one folder per class). A
        name the API would refuse is refused before a byte is sent (`ApiError` 422 on `name`)."""
        if problem := dataset_name_problem(name):
            raise ApiError(422, [{"loc": ["body", "name"], "msg": problem}])
        timeout = httpx.Timeout(30, read=3600, write=3600)
        answer = self.request(
            "POST", "/api/datasets", data={"name": name}, files={"file": (filename, content)}, timeout=timeout
        )
        return dict(answer)

    def datasets(self) -> dict[str, Any]:
        """Your datasets and the lab's shared ones (`items`), with your quota."""
        return dict(self.request("GET", "/api/datasets"))

    def dataset_reference(self, name: str) -> str | None:
        """Your upload `name` (else the lab's shared one of that name) as a spec names it
        (`npz:users/alice/cells/data.npz`); None where there is none."""
        named = [item for item in self.datasets()["items"] if item["name"] == name]
        own = [item for item in named if item["dataset"].partition(":")[2].startswith("users/")]
        return str((own or named)[0]["dataset"]) if named else None

    def delete_dataset(self, name: str) -> None:
        self.request("DELETE", f"/api/datasets/{name}")

    def me(self) -> dict[str, Any]:
        """Who the token belongs to: `user`, `is_admin`, and the token's `token_id`."""
        return dict(self.request("GET", "/api/me"))

    def metrics(self, job_id: int, split: str | None = None, *, as_frame: bool = False) -> Any:
        """Every metric row of a job (a list of dicts; a pandas DataFrame with `as_frame`)."""
        rows: list[dict[str, Any]] = []
        for chosen in [split] if split else ["train", "eval"]:
            rows += self.metric_rows(job_id, chosen, -1)
        rows.sort(key=lambda row: (row["step"], row["split"]))
        if not as_frame:
            return rows
        try:
            import pandas
        except ModuleNotFoundError:
            raise MissingPackageError("metrics(as_frame=True) needs pandas: pip install pandas") from None
        flat = [{**{k: v for k, v in row.items() if k != "custom"}, **(row.get("custom") or {})} for row in rows]
        return pandas.DataFrame(flat)

    def metric_rows(self, job_id: int, split: str, after: int) -> list[dict[str, Any]]:
        """A split's stored metric rows after the step `after`, in order (every page)."""
        rows: list[dict[str, Any]] = []
        while True:
            params = {"split": split, "after_step": after, "limit": 20000}
            page = self.request("GET", f"/api/jobs/{job_id}/metrics", params=params)
            rows += page
            if len(page) < 20000:
                return rows
            after = page[-1]["step"]

    def events(self, job_id: int) -> Iterator[dict[str, Any]]:
        """The job's live events (`metric`, `eval`, `log`, `state`, each a dict with `type`)
        until it ends. When the connection drops (the API restarted) it reconnects with
        back-off, first replaying the metric rows stored meanwhile, so none is missed
        (`towerq.following`)."""
        from towerq.following import events

        return events(self, job_id)

    def download(self, job_id: int, path: str | None = None, to: str | Path = ".") -> Path:
        """A file of the job's artifacts into the folder `to` (a folder, or everything, as a
        `.tar.gz`); returns where it landed."""
        route = f"/api/jobs/{job_id}/artifacts/{path.strip('/')}" if path else f"/api/jobs/{job_id}/artifacts.tar.gz"
        target = Path(to) / (Path(path).name if path else f"job-{job_id}.tar.gz")
        headers = self.stream_to(route, target)
        if path and headers.get("x-towerq-archive") == "folder":
            target = target.replace(target.with_name(target.name + ".tar.gz"))
        return target

    def stream_to(
        self, route: str, target: Path, progress: Callable[[int, int | None], None] | None = None
    ) -> httpx.Headers:
        """Stream `route` into `target` (through `target.part`, renamed when complete);
        `progress(bytes so far, total or None)` after each chunk. The response's headers."""
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        try:
            with self.http.stream("GET", route, timeout=httpx.Timeout(30, read=300)) as response:
                checked(response, streaming=True)
                total = int(response.headers.get("content-length") or 0) or None
                received = 0
                with partial.open("wb") as out:
                    for chunk in response.iter_bytes(256 * 1024):
                        out.write(chunk)
                        received += len(chunk)
                        if progress is not None:
                            progress(received, total)
        except httpx.TransportError as err:
            partial.unlink(missing_ok=True)
            raise UnreachableError(f"download from {self.url} failed: {err}") from err
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        partial.replace(target)
        return response.headers


UNREAD_TRIMMED = "some lines were not read before the database trimmed them: it keeps a job's newest"
EARLIER_TRIMMED = f"earlier lines were trimmed from the database: it keeps a job's newest {LOG_LINES_KEPT:,}"


def trimmed_line(
    job_id: int, trimmed: int, after_it: list[dict[str, Any]], why: str = UNREAD_TRIMMED
) -> dict[str, Any]:
    """A log line that says lines were trimmed before they were read, in their place (its
    `id` is the newest trimmed; its time the next line's, else now)."""
    when = after_it[0]["time"] if after_it else datetime.now(UTC).isoformat()
    message = f"({why}; its log.txt has every line: towerq download {job_id} log.txt)"
    attempt = after_it[0]["attempt"] if after_it else None
    return {"id": trimmed, "time": when, "level": "towerq", "message": message, "attempt": attempt}


def backoff(attempt: int) -> float:
    """0.5 s, 1 s, 2 s ... up to 10 s, with jitter so many clients do not retry in step."""
    return min(BACKOFF_MAX_S, 0.5 * 2**attempt) * (0.75 + 0.5 * random.random())


def checked(response: httpx.Response, streaming: bool = False) -> httpx.Response:
    if response.status_code < 400:
        return response
    if streaming:
        response.read()
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text[:500]
    if response.status_code == 401:
        raise AuthError(401, detail, refused=True)
    raise ApiError(response.status_code, detail)


class Job:
    """One job as the API last described it (`data`); its methods ask the API again."""

    def __init__(self, client: Client, data: dict[str, Any]) -> None:
        self.client = client
        self.data = data

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.name!r} {self.state}>"

    @property
    def id(self) -> int:
        return int(self.data["id"])

    @property
    def name(self) -> str:
        return str(self.data["name"])

    @property
    def state(self) -> str:
        return str(self.data["state"])

    @property
    def done(self) -> bool:
        return self.state in FINAL_STATES

    def refresh(self) -> Job:
        self.data = self.client.job(self.id).data
        return self

    def wait(self, timeout: float | None = None, poll_s: float = 1.0) -> Job:
        """Block until the job ends (succeeded, failed or cancelled); returns it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.refresh().done:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} still {self.state} after {timeout} s")
            time.sleep(poll_s)
        return self

    def log_lines(self, follow: bool = True) -> Iterator[dict[str, Any]]:
        """Its log's lines (`id`, `time`, `level`, `message`; from its last thousand), and with
        `follow` those to come, until it ends: a command job's output as it prints it."""
        yield from self.client.log_lines(self.id, follow=follow)

    def follow(self) -> Iterator[dict[str, Any]]:
        """The job's metric rows (train and eval, with `split`) as they arrive, until it ends."""
        for event in self.client.events(self.id):
            if event.get("type") in ("metric", "eval"):
                row = {k: v for k, v in event.items() if k not in ("type", "job_id")}
                row.setdefault("split", "eval" if event["type"] == "eval" else "train")
                yield row
        self.refresh()

    def metrics(self, split: str | None = None, *, as_frame: bool = False) -> Any:
        return self.client.metrics(self.id, split, as_frame=as_frame)

    def cancel(self) -> Job:
        self.data = self.client.cancel(self.id).data
        return self

    def share(self, visibility: str = "lab") -> Job:
        self.data = self.client.share(self.id, visibility).data
        return self

    def download(self, path: str | None = None, to: str | Path = ".") -> Path:
        return self.client.download(self.id, path, to)
