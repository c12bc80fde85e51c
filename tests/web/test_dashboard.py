"""The dashboard in a real headless Chromium against a real stack (API, scheduler, worker,
trainer processes): what a lab member does with it, and what they must see."""

from __future__ import annotations

import re
import tarfile
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from service.core.db import Database
from service.core.models import Job, Metric, Notification
from tests.service.api.test_usage import add_run
from tests.stack import Stack, load_stretch, wait_for
from tests.web.conftest import shot
from towerq.contract.paths import job_folder
from worker.host import host_info, register
from worker.inventory import SimulatedInventory

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def field(page, name: str):
    # Field ids hold dots (f-hyperparameters.steps), which CSS would read as classes.
    return page.locator(f'[id="f-{name}"]')


def error_of(page, name: str):
    return page.locator(f'[id="err-{name}"]')


def gpu_row(page, host: str, index: int):
    return page.locator(f'[data-host="{host}"] tr[data-gpu="{index}"]')


def test_submit_through_the_form_watch_it_train_and_cancel_it(
    stack: Stack, make_token: Callable[..., str], open_page: Callable[..., object]
) -> None:
    url = stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register its GPUs")
    page = open_page()

    page.goto(f"{url}/?token={make_token('alice')}#/submit")
    page.wait_for_selector("#submit")
    assert "token" not in page.url  # the login link's token leaves the address bar
    assert page.locator("#who").inner_text() == "alice"
    assert page.locator("#gpu-0").is_checked()  # a free GPU is picked for you
    field(page, "model").select_option("mlp")
    field(page, "name").fill("browser-run")
    field(page, "hyperparameters.steps").fill("100000")
    field(page, "hyperparameters.log_every").fill("5")
    field(page, "hyperparameters.eval_every").fill("100")
    field(page, "precision").select_option("mixed_bfloat16")
    field(page, "jit_compile").check()
    field(page, "time_limit_s").fill("1h 30x")
    page.click("#submit")
    assert "is no duration" in error_of(page, "time_limit_s").inner_text()
    field(page, "time_limit_s").fill("2h")  # a duration as people write it
    shot(page, "submit-form")
    page.click("#submit")
    page.wait_for_url(re.compile(r"#/jobs/\d+$"))
    job_id = int(page.url.rsplit("/", 1)[1])
    stored = client.get(f"/api/jobs/{job_id}").json()["spec"]
    assert (stored["precision"], stored["jit_compile"], stored["time_limit_s"]) == ("mixed_bfloat16", True, 7200)

    # The list: the row appears and turns running without a reload.
    page.click('nav a[data-nav="jobs"]')
    row = page.locator(f'tr[data-job="{job_id}"]')
    row.wait_for()
    assert row.locator(".name").inner_text() == "browser-run"
    page.wait_for_selector(f'tr[data-job="{job_id}"][data-state="running"]', timeout=120_000)
    assert "lab-a:0" in row.inner_text()
    shot(page, "jobs-running")

    # The job: its charts gain points while it trains.
    row.locator(".name a").click()
    page.wait_for_selector('#charts[data-points]:not([data-points="0"])', timeout=60_000)
    first = int(page.locator("#charts").get_attribute("data-points") or 0)
    page.wait_for_function(f"Number(document.querySelector('#charts')?.dataset.points) > {first}", timeout=30_000)
    assert page.locator(".job-header .badge").inner_text() == "running"
    assert page.locator('dd[data-field="Time limit"]').inner_text().startswith("2h 0m · stops it ~")
    # The summary follows the stream too: an ETA from the step time, the latest evaluation.
    for name in ("ETA", "Eval accuracy"):
        page.wait_for_function(f"(document.querySelector('dd[data-field=\"{name}\"]')?.textContent ?? '–') !== '–'")
    # Its speed over wall time (its evaluations included), the trainer's rate while training beside it.
    speed = "document.querySelector('dd[data-field=\"Examples/s\"]')?.textContent ?? ''"
    page.wait_for_function(f"/^[0-9,.]+ \\([0-9,.]+ while training\\)$/.test({speed})")
    assert page.locator("#chart-loss canvas").count() == 1
    page.check("#log-scale")
    page.wait_for_selector("#chart-loss canvas")
    shot(page, "job-training")

    # The GPUs page shows who holds GPU 0.
    page.click('nav a[data-nav="gpus"]')
    gpu_row(page, "lab-a", 0).wait_for()
    assert f"job {job_id}" in gpu_row(page, "lab-a", 0).inner_text()
    assert gpu_row(page, "lab-a", 0).get_attribute("data-free") == "0"
    assert "simulated" in page.locator('[data-host="lab-a"] h2').inner_text()

    # Cancel from the job's page (after confirming), then the GPU is free again.
    page.go_back()
    page.wait_for_selector("#cancel:not([disabled])")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel")
    try:  # the trainer checkpoints on SIGTERM, with up to TOWERQ_CANCEL_GRACE_S (30 s) before SIGKILL
        page.wait_for_selector('.job-header .badge:text("cancelled")', timeout=60_000 * load_stretch())
    except PlaywrightTimeout as timeout:
        ended = client.get(f"/api/jobs/{job_id}").json()
        lines = client.get(f"/api/jobs/{job_id}/logs", params={"tail": 12}).json()
        said = "\n".join(f"{line['time']} {line['message']}" for line in lines)
        raise AssertionError(
            f"the page never said cancelled; the job is {ended['state']}, its log ends:\n{said}"
        ) from timeout
    assert page.locator("#cancel").count() == 0  # an ended job offers no cancel
    page.wait_for_selector('dd[data-field="Cancelled"]')  # said plainly, not as an error in red
    assert page.locator('dd[data-field="Cancelled"]').inner_text() == "cancelled by alice"
    assert page.locator('dd[data-field="Error"]').count() == 0
    # Its artifacts are links, not server paths: the stop's checkpoint, the whole log.
    page.wait_for_selector('#artifacts a:text("checkpoints/checkpoint")')
    assert page.locator("#download-model").count() == 0  # no model.keras: it did not finish
    # it wrote TensorBoard events: the command that shows them at home, and the events alone
    assert f"TensorBoard at home: towerq tensorboard {job_id}" in page.locator("#artifacts").inner_text()
    with page.expect_download() as download:
        page.click("#download-tensorboard")
    with tarfile.open(download.value.path()) as events:
        names = events.getnames()
    assert names and all(name.rpartition("/")[2].startswith("events.out.tfevents.") for name in names), names
    with page.expect_download() as download:
        page.click("#download-log")
    assert "attempt 1" in Path(download.value.path()).read_text()
    shot(page, "job-artifacts")
    page.click('nav a[data-nav="gpus"]')
    page.wait_for_selector('[data-host="lab-a"] tr[data-gpu="0"][data-free="1"]', timeout=30_000)
    assert "free" in gpu_row(page, "lab-a", 0).inner_text()
    shot(page, "gpus-after-cancel")
    assert client.get(f"/api/jobs/{job_id}").json()["state"] == "cancelled"


def test_a_bad_field_gets_its_error_next_to_it_and_nothing_is_stored(
    stack: Stack, make_token: Callable[..., str], add_host: Callable[..., None], open_page: Callable[..., object]
) -> None:
    url = stack.start_api()
    add_host("lab-a", 2)
    page = open_page()
    page.goto(f"{url}/?token={make_token('alice')}#/submit")
    page.wait_for_selector("#submit")

    field(page, "hyperparameters.learning_rate").fill("-1")
    page.click("#submit")
    message = error_of(page, "hyperparameters.learning_rate")
    message.wait_for()
    page.wait_for_function("document.getElementById('err-hyperparameters.learning_rate').textContent.length > 0")
    assert "greater than 0" in message.inner_text()
    assert field(page, "hyperparameters.learning_rate").get_attribute("aria-invalid") == "true"
    assert field(page, "hyperparameters.learning_rate").evaluate("e => e === document.activeElement")
    shot(page, "submit-error")

    # Errors the form catches itself: bad JSON, no GPU picked.
    field(page, "hyperparameters.learning_rate").fill("0.01")
    field(page, "dataset_options").fill("{shape: 3")
    page.click("#submit")
    assert error_of(page, "dataset_options").inner_text() == "not valid JSON"
    assert error_of(page, "hyperparameters.learning_rate").inner_text() == ""
    field(page, "dataset_options").fill("")
    page.uncheck("#gpu-0")
    page.click("#submit")
    assert error_of(page, "gpus").inner_text() == "pick at least one GPU"

    # An unknown model, named by the API.
    page.check("#gpu-1")
    field(page, "dataset").fill("no-such-dataset")
    page.click("#submit")
    error_of(page, "dataset").wait_for()
    page.wait_for_function("document.getElementById('err-dataset').textContent.length > 0")
    assert "no-such-dataset" in error_of(page, "dataset").inner_text()

    # What the trainer would refuse later is refused now, next to its field.
    field(page, "dataset").fill("digits")
    field(page, "dataset_options").fill('{"classes": 5}')
    page.click("#submit")
    page.wait_for_function("document.getElementById('err-dataset_options').textContent.length > 0")
    assert "classes does not apply to dataset 'digits'" in error_of(page, "dataset_options").inner_text()

    # "When would it start?": a dry run, nothing stored; then the same error a submit gets.
    field(page, "dataset_options").fill("")
    page.click("#estimate")
    page.wait_for_function("document.getElementById('estimate-answer').textContent.length > 0")
    assert "would start at once on lab-a" in page.locator("#estimate-answer").inner_text()
    shot(page, "submit-estimate")
    field(page, "hold").check()  # queued on hold: it would not start until released
    page.click("#estimate")
    page.wait_for_function("document.getElementById('estimate-answer').textContent.includes('on hold')")
    field(page, "hold").uncheck()
    tomorrow = f"{(datetime.now() + timedelta(days=1)).date()}T22:00"
    field(page, "begin_at").fill(tomorrow)  # its begin ahead: it would not start before then
    page.click("#estimate")
    page.wait_for_function("document.getElementById('estimate-answer').textContent.includes('its begin time')")
    assert page.locator("#estimate-answer").inner_text().startswith("It would not start yet: not before ")
    field(page, "begin_at").fill("")
    field(page, "dataset").fill("no-such-dataset")
    page.click("#estimate")
    page.wait_for_function("document.getElementById('err-dataset').textContent.length > 0")
    assert page.locator("#estimate-answer").inner_text() == ""

    assert page.url.endswith("#/submit")
    assert stack.client(make_token("bob")).get("/api/jobs").json()["total"] == 0
    page.goto(f"{url}/#/jobs")  # an empty lab says how to start, not that a filter found nothing
    empty = page.locator("table.jobs")
    empty.wait_for()
    assert "No jobs yet: submit one" in empty.inner_text()
    page.goto(f"{url}/#/jobs?state=failed")
    page.wait_for_function("document.querySelector('table.jobs')?.innerText.includes('No jobs match.')")


def put_metrics(db: Database, job_id: int, losses: list[float], eval_accuracy: float) -> None:
    now = datetime.now(UTC)
    with db.write() as session:
        for i, loss in enumerate(losses, start=1):
            session.add(Metric(job_id=job_id, attempt=1, step=10 * i, split="train", loss=loss, accuracy=0.5, time=now))
        step = 10 * len(losses)
        session.add(
            Metric(job_id=job_id, attempt=1, step=step, split="eval", loss=losses[-1], accuracy=eval_accuracy, time=now)
        )
        job = session.get(Job, job_id)
        assert job is not None
        job.eval_accuracy, job.eval_loss, job.step = eval_accuracy, losses[-1], step


def test_clone_compare_keyboard_and_phone(
    stack: Stack,
    make_token: Callable[..., str],
    add_host: Callable[..., None],
    db: Database,
    open_page: Callable[..., object],
) -> None:
    url = stack.start_api()
    add_host("lab-a", 4)
    client = stack.client(make_token("alice"))
    spec = {
        "model": "mlp",
        "dataset": "digits",
        "gpu_count": 2,
        "hyperparameters": {"steps": 50, "learning_rate": 0.05},
    }
    admin = stack.client(make_token("root", admin=True))
    assert admin.patch("/api/users/alice", json={"max_priority": "high"}).status_code == 200
    first = client.post("/api/jobs", json={**spec, "name": "first"}).json()["id"]
    second = client.post("/api/jobs", json={**spec, "name": "second", "priority": "high"}).json()["id"]
    put_metrics(db, first, [2.0, 1.0, 0.5], 0.8)
    put_metrics(db, second, [2.0, 1.5, 1.2, 1.1], 0.6)

    page = open_page()
    page.goto(f"{url}/?token={make_token('alice')}#/jobs")
    page.wait_for_selector("table.jobs[data-drawn]")
    assert page.locator("tbody tr").first.get_attribute("data-job") == str(second)  # newest first
    assert "waiting" in page.locator(f'tr[data-job="{first}"] td.why').inner_text()

    # Axis labels of small values (a learning rate, a log-scale loss) read as numbers.
    ticks = page.evaluate("import('./charts.js').then(m => [0, 0.0005, 0.0001, 0.00001, 0.25].map(m.tickText))")
    assert ticks == ["0", "0.0005", "0.0001", "1e-5", "0.25"]

    # A job whose folder holds no TensorBoard events is offered no TensorBoard command.
    folder = job_folder(stack.settings.artifacts_dir, first)
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("no events here\n")
    with db.write() as session:  # what its worker sampled of its GPUs (`worker.gpu_use`)
        job = session.get(Job, first)
        assert job is not None
        use = {"rank": 0, "gpus": 2, "samples": 6, "busy_pct": 31.0, "memory_peak_mb": 20000, "memory_total_mb": 81559}
        job.gpu_use = {"1.0": use}
    page.goto(f"{url}/#/jobs/{first}")
    page.wait_for_selector('#artifacts a:text("notes.txt")')
    assert "TensorBoard" not in page.locator("#artifacts").inner_text()
    gpu_use = page.locator('dd[data-field="GPU use"]').inner_text()
    assert gpu_use == "busy 31% of the time, at most 20,000 of 81,559 MiB held", gpu_use

    # Clone opens the form filled with the job's spec.
    page.click("#clone")
    page.wait_for_selector("#submit")
    assert field(page, "hyperparameters.learning_rate").input_value() == "0.05"
    assert field(page, "hyperparameters.steps").input_value() == "50"
    assert page.locator("#mode-count").is_checked()
    assert field(page, "gpu_count").input_value() == "2"

    # Compare overlays the two curves and tabulates final metrics and settings.
    page.goto(f"{url}/#/compare?ids={first},{second}&metric=loss")
    page.wait_for_selector("#compare-chart[data-series='2'] canvas")
    table = page.locator("table").last.inner_text()
    assert "80.0%" in table and "60.0%" in table and "0.05" in table
    shot(page, "compare")

    # Jobs are found with the search box and added; a chosen one can be removed.
    page.goto(f"{url}/#/compare?ids={first}&metric=loss")
    page.wait_for_selector(f'.chips li[data-job="{first}"]')
    page.fill("#compare-search", "second")
    page.click(f'#compare-results li[data-job="{second}"] button')
    page.wait_for_selector("#compare-chart[data-series='2'] canvas")
    assert page.url.endswith(f"ids={first},{second}&metric=loss")
    page.click(f'.chips li[data-job="{first}"] button')
    page.wait_for_selector(f'.chips li[data-job="{first}"]', state="detached")
    page.wait_for_function("document.querySelectorAll('.chips li').length === 1")
    assert page.locator(".chips li").get_attribute("data-job") == str(second)

    # Keyboard, on a fresh load: skip link first, then the menu; Enter follows a link.
    page.goto(f"{url}/#/jobs")
    page.reload()
    page.wait_for_selector("table.jobs[data-drawn]")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip"
    for _ in range(4):  # the brand, Jobs, Sweeps, GPUs
        page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.dataset.nav") == "gpus"
    page.keyboard.press("Enter")
    page.wait_for_selector('[data-host="lab-a"]')
    assert page.url.endswith("#/gpus")

    # A phone: every page fits the screen's width (tables scroll inside their box).
    phone = open_page(viewport=(390, 844))
    phone.goto(f"{url}/?token={make_token('alice')}#/jobs")
    phone.wait_for_selector("#who:has-text('alice')")  # logged in before leaving the page
    for route, ready in [
        ("#/jobs", "table.jobs[data-drawn]"),
        (f"#/jobs/{first}", "#charts canvas"),
        ("#/gpus", "[data-host]"),
        ("#/submit", "#submit"),
        (f"#/compare?ids={first},{second}", "#compare-chart canvas"),
        ("#/usage", "#chart-gpus-per-user canvas"),
        ("#/tokens", "#tokens table"),
    ]:
        phone.goto(f"{url}/{route}")
        phone.wait_for_selector(ready)
        overflow = phone.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"{route} is {overflow}px wider than a phone"
        shot(phone, f"phone-{route.split('?')[0].strip('#/').replace('/', '-') or 'jobs'}")


def test_a_running_job_whose_gpus_are_idle_says_so_in_the_list_and_on_its_page(
    stack: Stack,
    make_token: Callable[..., str],
    add_host: Callable[..., None],
    db: Database,
    open_page: Callable[..., object],
) -> None:
    """Its worker found its GPUs idle past the lab's warning time (`worker.gpu_use`): the
    jobs list's "Why" and the job page's "GPU use" say so, with since when; its page's
    "Webhooks" says whether `job.idle` got through, to the lab's webhook and its own, and its
    owner sends a failed one again."""
    url = stack.start_api()
    add_host("lab-a", 2)
    now = datetime.now(UTC)
    job_id = add_run(db, "alice", "lab-a", [0], now - timedelta(hours=2), now - timedelta(hours=1), None)
    since = now - timedelta(minutes=40)
    with db.write() as session:
        job = session.get(Job, job_id)
        assert job is not None
        use = {"rank": 0, "gpus": 1, "samples": 360, "busy_pct": 12.5, "memory_peak_mb": 900}
        job.gpu_use = {"1.0": {**use, "memory_total_mb": 81559, "idle_since": since.isoformat()}}
        mine = "https://hooks.example/alice"
        session.add(Notification(job_id=job_id, url=None, event="job.idle", state="delivered", attempts=1,
                                 delivered_at=now - timedelta(minutes=9)))  # fmt: skip
        session.add(Notification(job_id=job_id, url=mine, event="job.idle", attempts=2, last_error="HTTP 500"))
        session.add(Notification(job_id=job_id, url=mine, event="job.idle", state="failed", attempts=9,
                                 last_error="HTTP 404"))  # fmt: skip
    page = open_page()
    page.goto(f"{url}/?token={make_token('alice')}#/jobs")
    page.wait_for_selector(f'tr[data-job="{job_id}"][data-state="running"]')
    why = page.locator(f'tr[data-job="{job_id}"] td.why').inner_text()
    assert why == "its GPUs have been idle for 40m (busy under 5% at every sample)", why
    page.goto(f"{url}/#/jobs/{job_id}")
    page.wait_for_selector('dd[data-field="GPU use"]')
    shown = page.locator('dd[data-field="GPU use"]').inner_text()
    assert shown.startswith("busy 12.5% of the time, at most 900 of 81,559 MiB held · idle since "), shown
    rows = page.locator("#webhooks tbody tr")
    said = [[cell.strip() for cell in rows.nth(i).inner_text().split("\t")] for i in range(rows.count())]
    assert [row[0:2] for row in said] == [["job.idle", "the lab's webhook"], ["job.idle", mine], ["job.idle", mine]]
    assert said[0][2].startswith("delivered ") and said[1][2:5] == ["pending", "2", "HTTP 500"], said
    assert said[2][2:6] == ["failed", "9", "HTTP 404", "Send again"], said  # its owner may send it again
    assert rows.nth(1).locator("button").count() == 0 and rows.nth(0).locator("button").count() == 0
    rows.nth(2).locator("button.resend").click()
    page.wait_for_selector("#webhooks tbody tr[data-state='failed']", state="detached")
    assert rows.nth(2).inner_text().split("\t")[2:4] == ["pending", "0"]


def test_a_refresh_that_fails_is_shown_and_clears_when_it_works_again(
    stack: Stack, make_token: Callable[..., str], add_host: Callable[..., None], open_page: Callable[..., object]
) -> None:
    url = stack.start_api()
    add_host("lab-a", 2)
    page = open_page(unreachable_ok=True)
    page.goto(f"{url}/?token={make_token('alice')}#/gpus")
    page.wait_for_selector('[data-host="lab-a"]')
    assert page.locator(".problem").inner_text() == ""
    page.context.clear_cookies()  # logged out behind the page's back: the next poll gets 401
    page.wait_for_selector(".problem:has-text('Refreshing the GPUs failed')", timeout=10_000)
    page.goto(f"{url}/?token={make_token('alice')}#/gpus")
    page.wait_for_selector('[data-host="lab-a"]')
    assert page.locator(".problem").inner_text() == ""
    stack.stop("api")  # the service stops (Ctrl+C) under the open page: said as such, not "Failed to fetch"
    page.wait_for_selector(".problem:has-text('towerq does not answer')", timeout=15_000)
    assert "Failed to fetch" not in page.locator(".problem").inner_text()


def test_a_host_whose_job_folders_are_measured_or_that_runs_no_sessions_says_so_on_its_card(
    stack: Stack, make_token: Callable[..., str], db: Database, open_page: Callable[..., object]
) -> None:
    """A worker that cannot give job folders a hard size (not root, no loop devices, network
    storage) measures them: its card says so, one that uses disk images says nothing. One
    that runs no notebook sessions says so, and why (a member whose session waits while
    that host's GPUs stand free sees where sessions run)."""
    url = stack.start_api()
    why = "JupyterLab is not installed where towerq runs (pip install 'towerq[notebook]')"
    with db.write() as session:
        register(session, "lab-a", SimulatedInventory("lab-a", 1), host_info(True, job_disks=True, no_notebooks=why))
        register(session, "lab-b", SimulatedInventory("lab-b", 1), host_info(True, job_disks=False))
    page = open_page()
    page.goto(f"{url}/?token={make_token('alice')}#/gpus")
    badge = page.locator('[data-host="lab-b"] h2 .badge.measured')
    badge.wait_for()
    assert badge.inner_text() == "folders measured" and "TOWERQ_JOB_DISK" in (badge.get_attribute("title") or "")
    assert page.locator('[data-host="lab-a"] .badge.measured').count() == 0
    sessions = page.locator('[data-host="lab-a"] h2 .badge.no-notebooks')
    assert sessions.inner_text() == "no notebooks" and why in (sessions.get_attribute("title") or "")
    assert page.locator('[data-host="lab-b"] .badge.no-notebooks').count() == 0


def test_an_admin_drains_a_gpu_from_its_card_and_others_get_no_button(
    stack: Stack, make_token: Callable[..., str], add_host: Callable[..., None], open_page: Callable[..., object]
) -> None:
    url = stack.start_api()
    add_host("lab-a", 2)
    page = open_page()
    page.goto(f"{url}/?token={make_token('root', admin=True)}#/gpus")
    row = gpu_row(page, "lab-a", 1)
    row.get_by_role("button", name="Drain").click()
    page.wait_for_selector('[data-host="lab-a"] tr[data-gpu="1"] .badge.drained')
    assert "drained" not in gpu_row(page, "lab-a", 0).inner_text()
    drained = stack.client(make_token("bob")).get("/api/gpus").json()
    assert [g["drained"] for g in drained] == [False, True]
    shot(page, "gpus-drained")
    row.get_by_role("button", name="Undrain").click()
    page.wait_for_selector('[data-host="lab-a"] tr[data-gpu="1"]:not(:has(.badge.drained))')

    user = open_page()
    user.goto(f"{url}/?token={make_token('bob')}#/gpus")
    gpu_row(user, "lab-a", 0).wait_for()
    assert user.locator('[data-host="lab-a"] button').count() == 0
