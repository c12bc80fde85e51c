"""`towerq notebook --gpus 1`: a JupyterLab session on the lab's GPUs (docs/notebooks.md).

Queues the session, waits while it is queued (saying why, as `towerq follow` does) and until
its JupyterLab answers through the API, then prints its URL (`--open`: opens it in this
machine's browser). The browser gets in with the dashboard's login: log in there first.
Ctrl+C while it waits leaves the session queued; `towerq cancel ID` ends it.
"""

from __future__ import annotations

import argparse
import time
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import Any

from towerq.cli.run import (
    add_placement_options,
    dataset_reference,
    env_variables,
    placement_fields,
    requirements_of,
)
from towerq.cli.session import Api, duration
from towerq.cli.transfer import upload_code
from towerq.client import FINAL_STATES
from towerq.contract.times import span_text
from towerq.errors import ApiError

POLL_S = 1.0


def add_notebook_command(command: Any) -> None:
    notebook: argparse.ArgumentParser = command(
        "notebook", "a JupyterLab session on the lab's GPUs, ended when idle: towerq notebook --gpus 1"
    )
    add_placement_options(notebook)
    add_session_options(notebook)
    notebook.add_argument("--open", action="store_true", help="open it in this machine's browser once it is ready")
    notebook.add_argument("--detach", action="store_true", help="queue it and return; do not wait")
    notebook.set_defaults(run=run_notebook)


def add_session_options(parser: argparse.ArgumentParser) -> None:
    """What a session starts with besides its place, as `towerq notebook` and `towerq shell` ask."""
    parser.add_argument(
        "--idle-timeout", type=duration, default=None, metavar="DURATION",
        help="end it after this long idle: 30m, 2h (lab default)",
    )  # fmt: skip
    parser.add_argument(
        "--code", type=Path, default=None, metavar="PATH",
        help="a .py file or a folder to import from in the session (read only, at $TOWERQ_CODE_DIR)",
    )  # fmt: skip
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="an environment variable")
    parser.add_argument(
        "--requirements", "-r", type=Path, default=None, metavar="FILE",
        help="packages besides the lab's, one a line (requirements.txt): its Python and kernel have them",
    )  # fmt: skip


def notebook_spec(args: argparse.Namespace, code: str | None = None) -> dict[str, Any]:
    optional = {
        **placement_fields(args), "idle_timeout_s": args.idle_timeout, "code": code, "env": env_variables(args.env),
        "requirements": requirements_of(args.requirements) if args.requirements else None,
    }  # fmt: skip
    return {"kind": "notebook", **{key: value for key, value in optional.items() if value is not None}}


def run_notebook(args: argparse.Namespace) -> int:
    notebook_spec(args)  # a bad --env or -r says so before a folder is packed or a byte sent
    api = Api(args)
    args.dataset = dataset_reference(api, args.dataset)
    code = upload_code(api, args.code) if args.code is not None else None
    job = api.client.submit(notebook_spec(args, code))
    url = api.client.url.rstrip("/") + str(job.data["url"])
    idle = job.data["spec"].get("idle_timeout_s")
    print(f"session {job.id} queued ({job.data['gpu_count']} GPU, ends after {span_text(idle)} idle)", flush=True)
    if args.detach:
        print(f"it opens at {url} once it runs (towerq show {job.id})")
        return 0
    try:
        ended = wait_open(api, job.id)
    except KeyboardInterrupt:
        print(f"\nstopped waiting: session {job.id} stays queued (towerq cancel {job.id} ends it)", flush=True)
        return 0
    if ended is not None:
        print(f"session {job.id} {ended['state']}: {ended.get('error') or last_message(ended)}", flush=True)
        return 1
    print(f"session {job.id} is ready: {url}")
    print(f"(your browser gets in with the dashboard's login: {api.client.url.rstrip('/')}/)")
    ends = f"it ends after {span_text(idle)} idle, or with towerq cancel {job.id}"
    print(f"{ends}; your notebooks are kept for the next one")
    if args.open:
        webbrowser.open(url)
    return 0


def wait_open(api: Api, job_id: int, say: Callable[[str], None] | None = None) -> dict[str, Any] | None:
    """Wait until the session's JupyterLab answers, saying why it waits (`say`: a line of
    progress, printed by default); the job if it ended first."""
    said = None
    while True:
        data = api.client.request("GET", f"/api/jobs/{job_id}")
        if data["state"] in FINAL_STATES:
            return data
        if data["state"] == "running":
            try:
                api.client.request("GET", f"/sessions/{job_id}/api/status")
                return None
            except ApiError as err:
                if err.status != 503:
                    raise
        news = data["state"] if data["state"] != "queued" else f"queued: {data.get('reason') or 'waiting'}"
        if news != said:
            (say or print_now)(f"  {news}")
            said = news
        time.sleep(POLL_S)


def print_now(text: str) -> None:
    print(text, flush=True)


def last_message(job: dict[str, Any]) -> str:
    events = job.get("events") or []
    return str(events[-1].get("message") or "") if events else ""
