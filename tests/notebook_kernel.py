"""Driving a notebook session's JupyterLab from a test, as a client does: through towerq's
proxy, over REST and a kernel's WebSocket (Jupyter's messaging protocol, JSON frames)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
from websockets.sync.client import connect

from tests.stack import wait_for


def xsrf_headers(client: httpx.Client, job_id: int) -> dict[str, str]:
    """JupyterLab's XSRF cookie (set by its page) as the header its API wants on a change."""
    client.get(f"/sessions/{job_id}/lab")
    session = f"/sessions/{job_id}/"
    own = [c.value for c in client.cookies.jar if c.name == "_xsrf" and session.startswith(c.path.rstrip("/") + "/")]
    return {"X-XSRFToken": (own or [""])[-1] or ""}


def wait_ready(client: httpx.Client, job_id: int, timeout: float = 120) -> None:
    """The session runs and its JupyterLab answers through the proxy."""

    def answers() -> bool:
        response = client.get(f"/sessions/{job_id}/api/status")
        assert response.status_code in (200, 503), response.text
        return response.status_code == 200

    wait_for(answers, timeout, f"session {job_id}'s JupyterLab", 0.5)


def start_kernel(client: httpx.Client, job_id: int) -> str:
    response = client.post(
        f"/sessions/{job_id}/api/kernels", json={"name": "python3"}, headers=xsrf_headers(client, job_id)
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def run_code(client: httpx.Client, api_url: str, token: str, job_id: int, kernel: str, code: str) -> str:
    """Run `code` in the kernel; what it printed (stdout and stderr, and an error's text)."""
    ws_url = api_url.replace("http://", "ws://") + f"/sessions/{job_id}/api/kernels/{kernel}/channels"
    msg_id = uuid.uuid4().hex
    request: dict[str, Any] = {
        "header": {
            "msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex,
            "msg_type": "execute_request", "version": "5.3",
        },
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {
            "code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False,
        },
    }  # fmt: skip
    printed: list[str] = []
    with connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=30) as ws:
        ws.send(json.dumps(request))
        while True:
            message = json.loads(ws.recv(timeout=60))
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                printed.append(content["text"])
            elif kind == "error":
                printed.append(f"{content['ename']}: {content['evalue']}")
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(printed)
