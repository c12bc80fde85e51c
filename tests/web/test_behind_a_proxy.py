"""The dashboard behind a reverse proxy that serves towerq under a path (/towerq/) and
strips it, as docs/deployment.md sets nginx up: with TOWERQ_ROOT_PATH the login, the job
list, the live job page (its event stream too) and the artifact links all work through it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.conftest import free_port
from tests.stack import Stack, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.browser]
PREFIX = "/towerq"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@pytest.fixture
def settings(make_settings: Callable[..., object], sqlite_url: str) -> object:
    return make_settings(sqlite_url, api_workers=1, root_path=PREFIX)


def proxy_app(upstream: str) -> Starlette:
    client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(30, read=None))

    async def forward(request: Request) -> Response:
        path = request.url.path
        if not path.startswith(f"{PREFIX}/"):
            return PlainTextResponse("only /towerq/ is proxied", status_code=404)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        outgoing = client.build_request(
            request.method,
            path[len(PREFIX) :],
            params=request.query_params,
            headers=headers,
            content=await request.body(),
        )
        answer = await client.send(outgoing, stream=True)
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP | {"content-encoding"}}
        return StreamingResponse(
            answer.aiter_raw(), status_code=answer.status_code, headers=kept, background=BackgroundTask(answer.aclose)
        )

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "PATCH", "DELETE"])])


@pytest.fixture
def proxy(stack: Stack) -> Iterator[str]:
    upstream = stack.start_api()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(proxy_app(upstream), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    wait_for(lambda: server.started, 10, "the proxy to listen")
    yield f"http://127.0.0.1:{port}{PREFIX}"
    server.should_exit = True
    thread.join(10)


def test_the_dashboard_works_under_a_proxy_path(
    stack: Stack, proxy: str, make_token: Callable[..., str], open_page: Callable[..., object]
) -> None:
    stack.start_scheduler()
    stack.start_worker("lab-a", 1)
    token = make_token("alice")
    direct = stack.client(token)
    wait_for(lambda: direct.get("/api/gpus").json(), 30, "the worker to register its GPUs")
    spec = {"model": "mlp", "dataset": "digits", "gpus": [0], "hyperparameters": {"steps": 400, "log_every": 10}}
    job_id = direct.post("/api/jobs", json=spec).json()["id"]

    page = open_page()
    page.goto(f"{proxy}/?token={token}")
    page.wait_for_selector(f'tr[data-job="{job_id}"]')
    assert page.locator("#who").inner_text() == "alice"
    cookies = page.context.cookies()
    assert [c["path"] for c in cookies if c["name"] == "towerq_token"] == [f"{PREFIX}/"]
    page.locator(f'tr[data-job="{job_id}"] .name a').click()
    page.wait_for_selector('#charts[data-points]:not([data-points="0"])', timeout=60_000)  # the live stream
    page.wait_for_selector('.job-header .badge:text("succeeded")', timeout=120_000)
    page.wait_for_selector("#download-log")
    assert page.locator("#download-log").get_attribute("href") == f"api/jobs/{job_id}/logs.txt"
    with page.expect_download() as download:
        page.click("#download-log")
    assert "exported the trained model" in Path(download.value.path()).read_text()
    direct.close()
