"""Bring your own model: a folder with a model and a `metrics` function goes up with
`towerq submit --code`, trains on 2 simulated GPUs, and its own metric is stored, charted on
the job page and offered on the compare page; the job page lists the bundle's files. The
submit form takes a code file too."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.stack import REPO, Stack, wait_for
from tests.web.conftest import shot

pytestmark = [pytest.mark.slow, pytest.mark.browser]
FINAL = ("succeeded", "failed", "cancelled")

NETS = '''
import tensorflow as tf
import keras

from lab.layers import hidden

print("building the lab's net")


def build(params):
    inputs = keras.Input(params["input_shape"])
    hidden_layer = hidden(48)(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(params["num_classes"])(hidden_layer))


def metrics(labels, logits):
    """Top-2 accuracy and the margin of the right class, per example."""
    labels = tf.cast(labels, tf.int32)
    top2 = tf.cast(tf.math.in_top_k(labels, logits, 2), tf.float32)
    right = tf.gather(logits, labels, batch_dims=1)
    return {"top2": top2, "margin": right - tf.reduce_max(logits, axis=-1)}
'''

LAYERS = """
import keras


def hidden(units):
    return keras.layers.Dense(units, activation="relu")
"""


def test_a_folder_of_code_with_its_own_metric_trains_and_is_charted(
    stack: Stack, make_token: Callable[..., str], open_page: Callable[..., object], tmp_path: Path
) -> None:
    folder = tmp_path / "my-research"
    (folder / "lab").mkdir(parents=True)
    (folder / "lab" / "__init__.py").write_text("")
    (folder / "lab" / "nets.py").write_text(NETS)
    (folder / "lab" / "layers.py").write_text(LAYERS)
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "lab" / "__pycache__").mkdir()
    (folder / "lab" / "__pycache__" / "nets.cpython-311.pyc").write_bytes(b"\0" * 64)
    (folder / "weights.bin").write_bytes(b"\0" * 10_500_000)
    (folder / ".gitignore").write_text("*.bin\n")
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps({"model": "lab.nets:build", "dataset": "digits", "gpus": [0, 1], "hyperparameters": {"steps": 60}})
    )

    url = stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2)
    token = make_token("alice")
    client = stack.client(token)
    wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register its GPUs")

    command = [sys.executable, "-m", "service.cli", "submit", str(spec), "--code", str(folder)]
    submitted = subprocess.run(
        [*command, "--api", url, "--token", token], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert submitted.returncode == 0, submitted.stderr
    first = submitted.stdout.splitlines()[0]
    assert first.startswith("code: 4 files,"), submitted.stdout
    assert first.endswith("(sent); left out: weights.bin"), first  # .gitignore's; .git and caches unsaid
    job_id = int(submitted.stdout.split("job ")[1].split()[0])
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 240, "the job", 1)
    assert job["state"] == "succeeded", job["error"]
    assert job["towers"] == 2
    bundle = client.get(f"/api/code/{job['spec']['code']}").json()
    assert [f["path"] for f in bundle["files"]] == [".gitignore", "lab/__init__.py", "lab/layers.py", "lab/nets.py"]
    log = client.get(f"/api/jobs/{job_id}/logs.txt").text
    assert "building the lab's net" in log
    # Each evaluation is logged with the model's own metrics (the trainer sends them as `metrics`).
    said = [line for line in log.splitlines() if "evaluation at step " in line]
    assert said and all(", margin " in line and ", top2 " in line for line in said), said[-3:]

    # The metric, averaged over both towers' examples like accuracy, in train and eval points.
    points = client.get(f"/api/jobs/{job_id}/metrics").json()
    for point in points:
        assert set(point["custom"]) == {"top2", "margin"}, point
        assert point["accuracy"] - 1e-6 <= point["custom"]["top2"] <= 1.0
        assert point["custom"]["margin"] <= 0.0  # the right class's logit minus the largest
    final = [p for p in points if p["split"] == "eval"][-1]
    assert final["accuracy"] - 1e-6 <= final["custom"]["top2"] and final["custom"]["top2"] > 0.6

    page = open_page()
    page.goto(f"{url}/?token={token}#/jobs/{job_id}")
    page.wait_for_selector("#chart-custom-top2 canvas")
    assert "top2" in page.locator("#chart-custom-top2 figcaption").inner_text()
    page.wait_for_selector('#code a:text("lab/nets.py")')
    with page.context.expect_page() as opened:
        page.click('#code a:text("lab/nets.py")')
    opened.value.wait_for_load_state()
    assert "def metrics(labels, logits)" in opened.value.content()
    opened.value.close()
    page.wait_for_selector("#download-model")
    assert "null" not in page.locator("#artifacts").inner_text()
    shot(page, "job-own-code")

    # The job keeps its latest own metrics, and the jobs list offers each as a column per split.
    latest = client.get(f"/api/jobs/{job_id}").json()["latest"]
    assert latest["eval_custom_metrics"]["top2"] == final["custom"]["top2"]
    assert set(latest["custom_metrics"]) == {"top2", "margin"}
    page.goto(f"{url}/#/jobs")
    page.wait_for_selector("table.jobs[data-drawn]")
    page.click("#columns summary")
    page.check('#columns input[value="m:eval:top2"]')
    assert "top2 (eval)" in page.locator("table.jobs th").all_inner_texts()
    cells = page.locator(f'tr[data-job="{job_id}"] td').all_inner_texts()
    assert f"{final['custom']['top2']:.4g}".rstrip("0").rstrip(".") in cells, cells

    # The compare page offers the metric as a curve.
    other = client.post("/api/jobs", json={**job["spec"], "name": "again", "hyperparameters": {"steps": 20}}).json()
    wait_for(lambda: client.get(f"/api/jobs/{other['id']}").json()["state"] in FINAL, 240, "the clone", 1)
    page.goto(f"{url}/#/compare?ids={job_id},{other['id']}&metric=eval_custom_top2")
    page.wait_for_selector('#compare-chart[data-series="2"]')
    assert page.locator("#metric").input_value() == "eval_custom_top2"
    client.close()


def submit_page(stack: Stack, token: str, open_page: Callable[..., Any], **worker: Any) -> tuple[str, Any, Any]:
    """An API and a one-GPU worker (`worker`: its options), and the submit page open with
    `token`: the API's URL, a client and the page."""
    url = stack.start_api()
    stack.start_worker("lab-a", 1, **worker)
    client = stack.client(token)
    wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register its GPUs")
    page = open_page()
    page.goto(f"{url}/?token={token}#/submit")
    page.wait_for_selector("#submit")
    return url, client, page


def test_the_submit_form_takes_a_code_file(
    stack: Stack, make_token: Callable[..., str], open_page: Callable[..., object], tmp_path: Path
) -> None:
    single = tmp_path / "tiny.py"
    single.write_text(
        "import keras\n\n\ndef build(params):\n"
        '    layers = [keras.Input(params["input_shape"]), keras.layers.Flatten()]\n'
        '    return keras.Sequential([*layers, keras.layers.Dense(params["num_classes"])])\n'
    )
    url, client, page = submit_page(stack, make_token("alice"), open_page)
    page.locator('[id="f-model"]').select_option("")
    page.locator('[id="f-entry"]').fill("tiny")
    page.click("#submit")
    assert "module:function" in page.locator('[id="err-entry"]').inner_text()
    page.locator('[id="f-entry"]').fill("tiny:build")
    page.click("#submit")
    assert "choose the file" in page.locator('[id="err-code"]').inner_text()
    page.locator('[id="f-code"]').set_input_files(str(single))
    page.click("#submit")
    page.wait_for_url(lambda address: "#/jobs/" in address)
    job_id = int(page.url.rsplit("/", 1)[1])
    job = client.get(f"/api/jobs/{job_id}").json()
    assert job["spec"]["model"] == "tiny:build" and len(job["spec"]["code"]) == 64
    assert client.get(f"/api/code/{job['spec']['code']}").json()["files"] == [
        {"path": "tiny.py", "size": single.stat().st_size}
    ]
    # A clone keeps the bundle.
    page.goto(f"{url}/#/submit?clone={job_id}")
    page.wait_for_selector("#code-kept:text('Uses code bundle')")
    client.close()


def test_the_submit_form_runs_a_program_or_a_session_and_a_clone_runs_it_again(
    stack: Stack, make_token: Callable[..., str], open_page: Callable[..., object], tmp_path: Path
) -> None:
    """The form was a model's alone: a command job's Clone showed "Could not show this page:
    Cannot read properties of undefined (reading 'batch_size')" (it has no hyperparameters)."""
    train = tmp_path / "train.py"
    train.write_text("import sys\nprint(sys.argv)\n")
    url, client, page = submit_page(stack, make_token("alice"), open_page, sandbox="bwrap", trainer_pool=0)
    page.locator('[id="f-kind"]').select_option("command")
    # what a program does not have is not asked: the model, hyperparameters, towers
    for hidden in ("f-model", "f-hyperparameters.learning_rate", "f-tower_weights", "f-precision"):
        assert not page.locator(f'[id="{hidden}"]').is_visible(), hidden
    assert page.locator('[id="f-dataset"]').input_value() == ""
    assert page.locator('[id="f-dataset"] ~ small').inner_text().startswith("optional: an upload")
    page.locator('[id="f-command"]').fill('python train.py --note "two words')
    page.click("#submit")
    assert "choose the file" in page.locator('[id="err-code"]').inner_text()
    page.locator('[id="f-code"]').set_input_files(str(train))
    page.click("#submit")
    assert "quote is not closed" in page.locator('[id="err-command"]').inner_text()
    page.locator('[id="f-command"]').fill('python train.py --note "two words" it\\\'s')
    page.locator('[id="f-env"]').fill('{"SEED": "1"}')
    page.locator('[id="f-requirements"]').fill("-e /")
    page.click("#submit")
    page.wait_for_selector('[id="err-requirements"]:text("is not a package")')
    page.locator('[id="f-requirements"]').fill("# what it needs\neinops  # any\n\ntqdm==4.67.1")
    shot(page, "submit-program")
    page.click("#submit")
    page.wait_for_url(lambda address: "#/jobs/" in address)
    job_id = int(page.url.rsplit("/", 1)[1])
    spec = client.get(f"/api/jobs/{job_id}").json()["spec"]
    assert spec["command"] == ["python", "train.py", "--note", "two words", "it's"], spec
    assert spec["env"] == {"SEED": "1"} and len(spec["code"]) == 64 and "hyperparameters" not in spec, spec
    assert spec["requirements"] == ["einops", "tqdm==4.67.1"], spec
    assert "dataset" not in spec or spec["dataset"] is None, spec

    # its Clone is the same program over the same code
    page.goto(f"{url}/#/submit?clone={job_id}")
    page.wait_for_selector("#code-kept:text('Uses code bundle')")
    assert page.locator('[id="f-kind"]').input_value() == "command"
    assert page.locator('[id="f-command"]').input_value() == "python train.py --note 'two words' 'it'\\''s'"
    page.click("#submit")
    page.wait_for_url(lambda address: "#/jobs/" in address and not address.endswith(f"/{job_id}"))
    again = client.get(f"/api/jobs/{int(page.url.rsplit('/', 1)[1])}").json()["spec"]
    assert (again["command"], again["code"], again["env"]) == (spec["command"], spec["code"], spec["env"]), again
    assert again["requirements"] == spec["requirements"], again

    # a notebook session, ended when idle
    page.goto(f"{url}/#/submit")
    page.wait_for_selector("#submit")
    page.locator('[id="f-kind"]').select_option("notebook")
    assert not page.locator('[id="f-command"]').is_visible()
    page.locator('[id="f-idle_timeout_s"]').fill("30m")
    assert page.locator('[id="f-requirements"]').input_value() == "", "a new form asks for none"
    page.locator('[id="f-requirements"]').fill("einops")
    page.click("#submit")
    page.wait_for_url(lambda address: "#/jobs/" in address)
    session = client.get(f"/api/jobs/{int(page.url.rsplit('/', 1)[1])}").json()
    assert session["spec"]["kind"] == "notebook" and session["spec"]["idle_timeout_s"] == 1800, session["spec"]
    assert session["spec"]["requirements"] == ["einops"], session["spec"]
    page.goto(f"{url}/#/submit?clone={session['id']}")
    page.wait_for_selector("#submit")
    assert page.locator('[id="f-kind"]').input_value() == "notebook"
    assert page.locator('[id="f-idle_timeout_s"]').input_value() == "30m 0s"
    assert page.locator('[id="f-requirements"]').input_value() == "einops"
    page.locator('[id="f-kind"]').select_option("model")
    assert not page.locator('[id="f-requirements"]').is_visible(), "a model runs in towerq's trainer"
    client.close()
