"""A notebook session in a real browser: the job page's Open button, JupyterLab through
towerq's proxy on the dashboard's login, a cell that prints the job's GPU, a terminal; and
the session's page cannot reach towerq's API with that login."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.core.settings import Settings
from tests.notebook_kernel import wait_ready
from tests.stack import Stack, wait_for
from tests.web.conftest import shot

pytestmark = pytest.mark.slow


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url, api_workers=1)


def test_a_session_opens_from_the_job_page_runs_a_cell_on_its_gpu_and_a_terminal(
    stack: Stack, settings: Settings, make_token: Callable[..., str], open_page: Callable[..., object]
) -> None:
    url = stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2, sandbox="bwrap", trainer_pool=0)
    token = make_token("alice")
    client = stack.client(token)
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    created = client.post("/api/jobs", json={"kind": "notebook", "gpu_count": 1})
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    wait_ready(client, job_id)
    gpu = client.get(f"/api/jobs/{job_id}").json()["cuda_visible_devices"]

    page = open_page()
    page.goto(f"{url}/?token={token}#/jobs/{job_id}")
    page.wait_for_selector("#open-session")
    assert page.locator("#shell-hint code").inner_text() == f"towerq shell {job_id}"
    with page.context.expect_page() as opened:
        page.locator("#open-session").click()
    lab = opened.value
    sockets: list[str] = []
    lab.on("websocket", lambda ws: sockets.append(ws.url))
    lab.wait_for_selector(".jp-LauncherCard", timeout=60_000)

    # the page keeps to its session: towerq's API is out of its reach, its own path is not
    reach = "path => fetch(path).then(r => 'reached ' + r.status, () => 'blocked')"
    assert lab.evaluate(reach, "/api/me") == "blocked"
    assert lab.evaluate(reach, f"/sessions/{job_id}/api/status") == "reached 200"

    lab.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
    cell = lab.locator(".jp-Notebook .jp-Cell .cm-content").first
    cell.wait_for(timeout=60_000)
    code = "import os; print('GPU', os.environ['CUDA_VISIBLE_DEVICES'])"

    def typed() -> bool:  # on a loaded machine the editor may take keys only once it has focus
        if "CUDA_VISIBLE_DEVICES" not in cell.inner_text():
            cell.click()
            lab.keyboard.type(code)
        return "CUDA_VISIBLE_DEVICES" in cell.inner_text()

    wait_for(typed, 60, "the cell to take the code", 1.0)

    def kernel_idle() -> bool:  # on a loaded machine the kernel may start long after the notebook shows
        sessions = client.get(f"/sessions/{job_id}/api/sessions").json()
        return any((s.get("kernel") or {}).get("execution_state") == "idle" for s in sessions)

    wait_for(kernel_idle, 180, "the notebook's kernel to start", 1.0)
    output = lab.locator(".jp-OutputArea-output").first
    prompt = lab.locator(".jp-Cell .jp-InputPrompt").first

    def ran() -> bool:
        """Run the cell in place until it printed; a run sent before the page knew its kernel
        is lost (or answered by a kernel dialog), so it is sent again while nothing runs."""
        if output.count():
            return True
        if lab.locator(".jp-Dialog").count():
            lab.keyboard.press("Escape")
        if "*" not in prompt.inner_text():
            cell.click()
            lab.keyboard.press("Control+Enter")
        return False

    try:
        wait_for(ran, 180, "the cell's output", 5.0)
    except AssertionError:
        raise AssertionError(f"no output; kernels: {client.get(f'/sessions/{job_id}/api/kernels').text}") from None
    assert output.inner_text().strip() == f"GPU {gpu}"
    shot(lab, "notebook-cell")

    lab.locator('[data-command="launcher:create"]').first.click()  # the file browser's "+": a launcher
    lab.locator('.jp-LauncherCard[data-category="Other"]', has_text="Terminal").first.click()
    lab.wait_for_selector(".jp-Terminal .xterm", timeout=60_000)
    wait_for(lambda: any("/terminals/websocket/" in u for u in sockets), 30, "the terminal's WebSocket")
    assert any(f"/sessions/{job_id}/api/kernels/" in u for u in sockets), sockets
    shot(lab, "notebook-terminal")
    lab.close()
    assert client.post(f"/api/jobs/{job_id}/cancel").status_code == 202
