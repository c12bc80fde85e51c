"""Command jobs: a member's own program (`"command": [...]`) runs as a towerq job through the
real API, scheduler, worker and bubblewrap, with its GPUs, folders, metrics and artifacts."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.core.settings import Settings
from tests.faults.helpers import assert_metrics_continuous, backdate_allocations, job_of, wait_state, wait_step
from tests.stack import FINAL, REPO, Stack, finished, log_messages, program_run, upload_code, wait_for
from towerq import Client
from towerq.bundle import FolderError

pytestmark = pytest.mark.slow

TRAIN = """
import json, os, sys
from pathlib import Path

import numpy as np
import towerq

steps = int(sys.argv[sys.argv.index("--steps") + 1])
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 4))
y = x @ np.array([1.0, -2.0, 0.5, 3.0])
w = np.zeros(4)
checkpoints = Path(os.environ["TOWERQ_CHECKPOINT_DIR"])
start = 0
if (checkpoints / "w.npy").exists():
    w = np.load(checkpoints / "w.npy")
    start = int((checkpoints / "step").read_text())
seen = {name: os.environ.get(name) for name in
        ("TOWERQ_JOB_ID", "TOWERQ_ATTEMPT", "CUDA_VISIBLE_DEVICES", "GREETING", "TF_FORCE_GPU_ALLOW_GROWTH",
         "TOWERQ_GPU_COUNT", "TOWERQ_BATCH_GPUS")}
print("ENV " + json.dumps(seen), flush=True)
print("a line to stderr", file=sys.stderr, flush=True)
print("I1206 21:29:30.743000 2 run.py:874] an INFO line of absl's", file=sys.stderr, flush=True)
for step in range(start + 1, steps + 1):
    grad = 2 * x.T @ (x @ w - y) / len(x)
    w -= 0.1 * grad
    loss = float(np.mean((x @ w - y) ** 2))
    towerq.report(step=step, loss=loss, grad_norm=float(np.linalg.norm(grad)), total_steps=steps)
    if step % 5 == 0:
        np.save(checkpoints / "w.npy", w)
        (checkpoints / "step").write_text(str(step))
towerq.report(step=steps, split="eval", loss=loss)
print(json.dumps({"event": "done", "step": 0}), flush=True)  # the trainer's word: text from a program
Path(os.environ["TOWERQ_OUTPUT_DIR"], "weights.json").write_text(json.dumps(list(w)))
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def test_a_numpy_program_runs_reports_and_leaves_its_output(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    client = stack.sandboxed_lab(make_token("alice"), 2)
    code = upload_code(client, {"train.py": TRAIN})
    spec = {
        "command": ["python", "train.py", "--steps", "20"],
        "code": code,
        "gpu_count": 1,
        "env": {"GREETING": "hello"},
    }
    created = client.post("/api/jobs", json=spec)
    assert created.status_code == 201, created.text
    assert created.json()["name"] == "python train.py --steps 20"
    job_id = created.json()["id"]
    job = finished(client, job_id)
    lines = client.get(f"/api/jobs/{job_id}/logs", params={"tail": 1000}).json()
    messages = [line["message"] for line in lines]
    assert job["state"] == "succeeded", (job["error"], messages[-30:])

    env = json.loads(next(m for m in messages if m.startswith("ENV "))[4:])
    assert env["TOWERQ_JOB_ID"] == str(job_id) and env["TOWERQ_ATTEMPT"] == "1"
    assert env["GREETING"] == "hello" and env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert env["CUDA_VISIBLE_DEVICES"] in ("0", "1")
    assert (env["TOWERQ_GPU_COUNT"], env["TOWERQ_BATCH_GPUS"]) == ("1", "1")
    assert job["total_steps"] == 20 and job["step"] == 20, "its steps are its program's word, not the trainer's 1,000"
    assert "a line to stderr" in messages
    assert "I1206 21:29:30.743000 2 run.py:874] an INFO line of absl's" in messages, "a program's INFO lines are kept"
    assert any('"event": "done"' in m for m in messages), "a program's `done` line is text"

    points = client.get(f"/api/jobs/{job_id}/metrics").json()
    train = [p for p in points if p["split"] == "train"]
    assert [p["step"] for p in train] == list(range(1, 21))
    assert train[-1]["loss"] < train[0]["loss"]
    assert set(train[0]["custom"]) == {"grad_norm"}
    assert [p["step"] for p in points if p["split"] == "eval"] == [20]

    listed = {entry["path"] for entry in client.get(f"/api/jobs/{job_id}/artifacts").json()["items"]}
    assert {"output/weights.json", "checkpoints/w.npy"} <= listed, listed
    weights = client.get(f"/api/jobs/{job_id}/artifacts/output/weights.json").json()
    assert weights[1] == pytest.approx(-2.0, abs=0.3)


def test_a_failing_program_fails_with_its_last_words(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    client = stack.sandboxed_lab(make_token("alice"))
    code = upload_code(
        client, {"crash.py": "import sys\nprint('working')\nraise SystemExit('no data found in /data')\n"}
    )
    created = client.post("/api/jobs", json={"command": ["python", "crash.py"], "code": code})
    assert created.status_code == 201, created.text
    job = finished(client, created.json()["id"])
    assert job["state"] == "failed"
    assert job["error"] == "the program exited with code 1: no data found in /data", job["error"]


BAD = [
    ({"command": ["python", "train.py"]}, "code", "code bundle"),
    ({"command": ["nosuchprogram"], "code": "CODE"}, "command", "no program 'nosuchprogram'"),
    ({"command": ["./missing.sh"], "code": "CODE"}, "command", "is not a file of bundle"),
    ({"command": ["train.py"], "code": "CODE"}, "command", "run it as ./train.py, or python train.py"),
    ({"command": [], "code": "CODE"}, "command", "at least 1 item"),
    ({"command": "python train.py", "code": "CODE"}, "command", "valid list"),
    ({"command": ["python", "train.py"], "code": "CODE", "env": {"LD_PRELOAD": "x"}}, "env", "LD_PRELOAD"),
    ({"command": ["python", "train.py"], "code": "CODE", "env": {"TOWERQ_JOB_ID": "9"}}, "env", "TOWERQ_JOB_ID"),
    ({"command": ["python", "train.py"], "code": "CODE", "gpu_count": 3}, "gpu_count", "the largest host has 2"),
    ({"command": ["python"], "code": "CODE", "hyperparameters": {"steps": 2}}, "hyperparameters", "model jobs"),
    ({"command": ["python"], "code": "CODE", "model": "mlp", "dataset": "digits"}, "command", "not both"),
]


BAR = """
import os, sys, time

for epoch in range(2):
    for i in range(11):  # as tqdm draws: a carriage return, then the bar
        sys.stderr.write(f"\\repoch {epoch}: {i * 10:3d}%|{'#' * i:10s}| {i}/10")
        sys.stderr.flush()
        time.sleep(0.02)
    sys.stderr.write("\\n")
print(f"\\x1b[32mrank {os.environ['RANK']} saved\\x1b[0m", flush=True)  # coloured, as loguru told to
"""


def test_a_progress_bar_is_one_line_of_the_log_from_each_rank(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    """A program's tqdm-style bar (redrawn with carriage returns) is one line of the job's
    log as it ended, each rank's marked with its rank; before, a line of every drawing side
    by side, and over a gang a rank's redraws lost their mark. A coloured line is its text."""
    client = stack.sandboxed_lab(make_token("alice"), 2)
    job, messages = program_run(client, {"bar.py": BAR}, ["python", "bar.py"], gpu_count=2, processes="per_gpu")
    assert job["state"] == "succeeded", (job["error"], messages[-20:])
    bars = [message for message in messages if "epoch" in message]
    assert sorted(bars) == sorted(
        f"{mark}epoch {epoch}: 100%|##########| 10/10" for mark in ("", "[rank 1] ") for epoch in (0, 1)
    ), bars
    assert {"rank 0 saved", "[rank 1] rank 1 saved"} <= set(messages)


SHARED = """
import subprocess, sys, time
import towerq

# another process on the same stdout writes part of a line (an unbuffered print's newline
# comes apart), and the point comes meanwhile, as torchrun's ranks do
other = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdout.write('rank 1 done'); "
                          "sys.stdout.flush(); time.sleep(1.5); sys.stdout.write('\\\\n')"])
time.sleep(0.5)
towerq.report(step=1, loss=0.5, total_steps=1)
other.wait()
"""


def test_a_point_reported_while_another_process_wrote_part_of_a_line_is_kept(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    """Processes sharing a program's stdout (torchrun's ranks, a DataLoader's workers) write
    lines in parts: the point `towerq.report` printed after another's part of a line was
    glued to it, text, and lost (torchrun's rank 0 lost its last step so, tried by hand).
    In a job it starts a line of its own; the other's line is kept as it was written."""
    client = stack.sandboxed_lab(make_token("alice"), 1)
    job, messages = program_run(client, {"shared.py": SHARED}, ["python", "shared.py"])
    assert job["state"] == "succeeded", (job["error"], messages[-20:])
    assert [point["step"] for point in client.get(f"/api/jobs/{job['id']}/metrics").json()] == [1], messages[-5:]
    assert "rank 1 done" in messages


WRITES_HERE = """
import os
from pathlib import Path

print("working in", os.getcwd(), flush=True)
Path("runs/Dec07_01-16-34_vm").mkdir(parents=True)  # as PyTorch's SummaryWriter() names its run
Path("runs/Dec07_01-16-34_vm/events.out.tfevents.1796606194.vm").write_text("written where it runs")
with open("train.py", "a") as code:
    code.write("# its own copy of its code")
"""


def test_a_program_writes_where_it_runs_and_it_is_kept_with_its_artifacts(
    stack: Stack, settings: Settings, make_token: Callable[..., str], tmp_path: Path
) -> None:
    """A program writes relative to where it runs (TensorBoard's `runs/`, Lightning's
    `lightning_logs/`): it runs in a copy of its code in the job's folder (`work/`), kept
    with its artifacts. Before, its folder was the read-only bundle: `OSError: [Errno 30]
    Read-only file system: 'runs'`. (Its next attempt finds it: tests/faults/test_command_job_killed.py.)
    `towerq tensorboard ID` finds its events there (it looked in `tensorboard/` alone: a 404)."""
    token = make_token("alice")
    client = stack.sandboxed_lab(token, 1)
    job, messages = program_run(client, {"train.py": WRITES_HERE}, ["python", "train.py"])
    assert job["state"] == "succeeded", (job["error"], messages[-20:])
    assert "working in /job/work" in messages, messages
    run = "work/runs/Dec07_01-16-34_vm"
    assert client.get(f"/api/jobs/{job['id']}/artifacts/{run}/events.out.tfevents.1796606194.vm").text == (
        "written where it runs"
    )
    board = towerq_cli(
        "tensorboard", str(job["id"]), "999999", "--no-launch", cwd=tmp_path, api=str(stack.api_url), token=token
    )
    name, _, folder = board.stdout.strip().partition(":")
    assert board.returncode == 0 and name == f"job-{job['id']}" and folder.endswith(run), board
    assert "job 999999" in board.stderr and "left out" in board.stderr, board  # one without: the rest shown
    assert [path.name for path in Path(folder).iterdir()] == ["events.out.tfevents.1796606194.vm"]
    assert client.get(f"/api/jobs/{job['id']}/artifacts/work/train.py").text.endswith("# its own copy of its code")
    again = client.post("/api/jobs", json={"command": ["python", "train.py"], "code": job["spec"]["code"]})
    assert finished(client, again.json()["id"])["state"] == "succeeded", (
        "its code is the bundle's, not the first's copy"
    )


PREPARES = """
import os
with open(os.path.join(os.environ["TOWERQ_OUTPUT_DIR"], "prepared.txt"), "w") as out:
    out.write("ready")
"""
USES = """
import json, os
for job, folder in json.loads(os.environ["TOWERQ_INPUTS"]).items():
    print("input", job, folder, open(os.path.join(folder, "output", "prepared.txt")).read())
    try:
        open(os.path.join(folder, "output", "mine.txt"), "w")
    except OSError as err:
        print("read only:", type(err).__name__)
"""


def test_a_program_after_another_reads_its_folder_at_towerq_inputs(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    """A pipeline of programs (`after`): the next finds what the first wrote through
    `$TOWERQ_INPUTS`, read only, and its log says where (it said a model's `params['inputs']`)."""
    client = stack.sandboxed_lab(make_token("alice"), 1)
    first, _ = program_run(client, {"prep.py": PREPARES}, ["python", "prep.py"])
    assert first["state"] == "succeeded", first["error"]
    job, messages = program_run(client, {"use.py": USES}, ["python", "use.py"], after=[first["id"]])
    assert job["state"] == "succeeded", (job["error"], messages[-20:])
    fid = first["id"]
    assert f"input {fid} /inputs/job-{fid} ready" in messages, messages
    assert [m for m in messages if m.startswith("read only: ")], messages  # EROFS (OSError), or EACCES
    assert f"job {fid}'s folder is an input (read-only): $TOWERQ_INPUTS (JSON) ['{fid}']" in messages, messages


WHOLE_LINES = """
import subprocess, sys, time

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3); print('the child says hi')"])
sys.stdout.write("the parent says")  # a line in two writes, as an unbuffered print writes its newline
time.sleep(1.0)
sys.stdout.write(" hello\\n")
child.wait()
"""


def test_processes_sharing_the_jobs_output_write_whole_lines(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    """A job's Python processes write each line whole (`worker/program_site`): torchrun's
    ranks printed into each other's lines (`rank 0 of 2rank 1 of 2`) under
    PYTHONUNBUFFERED, which writes a print's text and its newline apart."""
    client = stack.sandboxed_lab(make_token("alice"), 1)
    job, messages = program_run(client, {"lines.py": WHOLE_LINES}, ["python", "lines.py"])
    assert job["state"] == "succeeded", (job["error"], messages[-20:])
    assert messages[-2:] == ["the child says hi", "the parent says hello"], messages


def test_a_bad_command_job_gets_a_422_naming_its_field(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_worker("lab-a", 2, sandbox="bwrap", trainer_pool=0)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    code = upload_code(client, {"train.py": "print(1)\n"})
    for spec, field, says in BAD:
        response = client.post("/api/jobs", json={**spec, "code": code} if spec.get("code") else spec)
        assert response.status_code == 422, (spec, response.text)
        detail = json.dumps(response.json())
        assert field in detail and says in detail, (spec, detail)


FAKE_NVML = Path(__file__).resolve().parent / "fakenvml"
HOLDS = """
import os, sys, time
import towerq

for step in range(int(sys.argv[1])):
    towerq.report(step=step, loss=1.0 / (step + 1))
    time.sleep(0.5)
print("held", os.environ["FAKE_GPU_MB"], "MiB to the end")
"""


def test_a_program_past_its_gpu_memory_share_is_stopped_and_its_neighbour_runs_on(
    stack: Stack, make_token: Callable[..., str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two command jobs share one GPU at fraction 0.4 (NVML is the fake of tests/fakenvml,
    which reports what each program's FAKE_GPU_MB says it holds, and FAKE_GPU_BUSY how busy it
    keeps the GPU): the one past its share is stopped with both numbers named, the one inside
    it succeeds. Each job's GPU use is what its worker sampled: its own part of how busy the
    GPU was (a third job beside them keeps it busy too) and the most its own processes held
    (its neighbour's memory is not its own). A job that holds its GPU idle is told so in its
    log once its idle time is up, though its neighbour keeps the GPU busy; a busy one is not."""
    token = make_token("alice")
    client = on_fake_nvml(stack, monkeypatch, token, sandbox="bwrap", gpu_memory_grace_s=1, gpu_use_sample_s=1,
                          gpu_idle_warn_s=3)  # fmt: skip
    gpus = client.get("/api/gpus").json()
    assert gpus[0]["name"] == "Fake NVIDIA H100 80GB HBM3" and not gpus[0]["simulated"], gpus
    code = upload_code(client, {"hold.py": HOLDS})
    shared = {"code": code, "gpus": [0], "gpu_memory_fraction": 0.4}
    greedy = client.post(
        "/api/jobs", json={**shared, "command": ["python", "hold.py", "60"], "env": {"FAKE_GPU_MB": "40000"}}
    )
    modest = client.post(
        "/api/jobs",
        json={**shared, "command": ["python", "hold.py", "12"], "env": {"FAKE_GPU_MB": "20000", "FAKE_GPU_BUSY": "30"}},
    )
    beside = {"FAKE_GPU_MB": "10000", "FAKE_GPU_BUSY": "50"}  # the GPU is 80% busy while both run
    neighbour = client.post(
        "/api/jobs", json={**shared, "gpu_memory_fraction": 0.2, "command": ["python", "hold.py", "120"], "env": beside}
    )
    assert {greedy.status_code, modest.status_code, neighbour.status_code} == {201}, (greedy.text, neighbour.text)
    stopped = finished(client, greedy.json()["id"], 120)
    assert stopped["state"] == "failed", stopped
    share = int(0.4 * (81559 - 480))
    assert stopped["error"] == (
        f"its processes held 40,000 MiB of GPU 0, over its share of {share:,} MiB (gpu_memory_fraction 0.4 of "
        "81,559 MiB, less 480 MiB the driver keeps)"
    ), stopped["error"]
    ran = finished(client, modest.json()["id"], 120)
    assert ran["state"] == "succeeded", ran
    use = ran["gpu_use"]
    assert use is not None and use["samples"] >= 2, ran
    assert (use["memory_peak_mb"], use["memory_total_mb"]) == (20000, 81559), use  # its own
    assert within_a_sample(use, 30), use  # its own part: not the GPU's 80
    assert stack.api_url is not None
    shown = towerq_cli("show", str(ran["id"]), cwd=tmp_path, api=stack.api_url, token=token)
    assert f"  gpu use    busy {use['busy_pct']:g}% of the time, at most 20,000 of 81,559 MiB held\n" in shown.stdout
    idle = client.post(
        "/api/jobs", json={**shared, "command": ["python", "hold.py", "20"], "env": {"FAKE_GPU_MB": "900"}}
    )
    assert idle.status_code == 201, idle.text
    # while it runs, past the idle warning: its reason says so, and since when (the jobs list's "why")
    running = wait_for(
        lambda: (
            (j := client.get(f"/api/jobs/{idle.json()['id']}").json())["state"] in ("running", *FINAL)
            and (j["reason"] or j["state"] != "running")
            and j
        ),
        60,
        "the idle job's reason",
        0.2,
    )
    assert running["state"] == "running" and running["reason"].startswith("its GPUs have been idle for "), running
    assert running["gpu_use"]["idle_since"] is not None, running["gpu_use"]
    waited = finished(client, idle.json()["id"], 120)
    assert waited["reason"] is None and waited["gpu_use"]["idle_since"] is None, waited  # it ended
    assert waited["state"] == "succeeded" and waited["gpu_use"]["busy_pct"] == 0, waited
    told = [m for m in log_messages(client, waited["id"]) if m.startswith("its GPUs have been idle for ")]
    said = r"its GPUs have been idle for [3-5]s \(busy under 5% at every sample\): .* holds them from the lab"
    assert len(told) == 1 and re.fullmatch(said, told[0]), told
    assert not [m for m in log_messages(client, ran["id"]) if "idle" in m]  # busy 30%: never told

    # the GPU's, as NVML says it now: its neighbour's 50 once the worker's next sample has seen
    # the others go (a heartbeat's sample from before they ended read 100 under load)
    def gpus_listed() -> list[str] | None:
        listed = towerq_cli("gpus", cwd=tmp_path, api=str(stack.api_url), token=token).stdout.splitlines()
        assert listed[0].split()[4] == "BUSY", listed
        return listed if listed[1].split()[9] == "50%" else None

    wait_for(gpus_listed, 30, "the GPU's own busy figure, its neighbour's alone", 1.0)
    assert client.post(f"/api/jobs/{neighbour.json()['id']}/cancel").status_code == 202
    beside_use = finished(client, neighbour.json()["id"], 60)["gpu_use"]
    assert within_a_sample(beside_use, 50) and beside_use["memory_peak_mb"] == 10000, beside_use


def within_a_sample(use: dict, busy: float) -> bool:
    """`busy` at every sample but at most two: at its end its program may be gone from the
    GPU a moment before its sandbox's first process exits (a sample then finds it idle; two,
    once, where the machine was loaded: 45.8% of 20 samples at 50%), and never above it (the
    GPU's whole figure, its neighbours' part too, is 80)."""
    samples = use["samples"]
    return busy * (samples - 2) / samples <= use["busy_pct"] <= busy


def test_a_job_holding_its_gpu_idle_past_the_labs_stop_time_is_stopped_and_its_busy_neighbour_runs_on(
    stack: Stack, make_token: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With TOWERQ_GPU_IDLE_STOP_S (3 s here), on the fake NVML: a command job that holds its
    share of GPU 0 and runs no kernel fails, saying for how long its GPU was idle; the job
    beside it on the same GPU, busy, is not stopped (its own part of the GPU's use counts)."""
    client = on_fake_nvml(stack, monkeypatch, make_token("alice"), gpu_use_sample_s=0.5, gpu_idle_stop_s=3)
    shared = {"code": upload_code(client, {"hold.py": HOLDS}), "gpus": [0], "gpu_memory_fraction": 0.4}
    idle = client.post(
        "/api/jobs", json={**shared, "command": ["python", "hold.py", "200"], "env": {"FAKE_GPU_MB": "900"}}
    )
    busy = client.post(
        "/api/jobs",
        json={**shared, "command": ["python", "hold.py", "24"], "env": {"FAKE_GPU_MB": "900", "FAKE_GPU_BUSY": "60"}},
    )
    assert idle.status_code == 201 and busy.status_code == 201, (idle.text, busy.text)
    stopped = finished(client, idle.json()["id"], 60)
    assert stopped["state"] == "failed", stopped
    said = r"stopped: its GPUs were idle for [3-5]s \(busy under 5% at every sample; the lab stops a job whose GPUs "
    assert re.fullmatch(said + r"stay idle 3s: TOWERQ_GPU_IDLE_STOP_S\)", stopped["error"]), stopped["error"]
    assert client.get(f"/api/jobs/{busy.json()['id']}").json()["state"] == "running"  # idle no more than 0.5 s
    assert finished(client, busy.json()["id"], 60)["state"] == "succeeded"


def on_fake_nvml(stack: Stack, monkeypatch: pytest.MonkeyPatch, token: str, **worker: object) -> httpx.Client:
    """The stack with one worker, lab-a, on the fake NVML's one GPU (81,559 MiB; its
    `worker` settings), once it has registered; a client with `token`."""
    monkeypatch.setenv("PYTHONPATH", f"{FAKE_NVML}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("FAKE_NVML_GPUS", "81559")
    stack.start_api()
    stack.start_scheduler()
    stack.spawn("worker-lab-a", "worker", "--name", "lab-a", simulated_gpus=None, trainer_pool=0, **worker)
    client = stack.client(token)
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    return client


def towerq_cli(*args: str, cwd: Path, api: str, token: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOWERQ_")}
    env.update({"TOWERQ_API_URL": api, "TOWERQ_TOKEN": token, "PYTHONPATH": str(REPO), "HOME": str(cwd)})
    command = [sys.executable, "-m", "service.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=240)


def test_towerq_run_sends_this_folder_once_and_follows_the_job(
    stack: Stack, settings: Settings, make_token: Callable[..., str], tmp_path: Path
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2, sandbox="bwrap", trainer_pool=0)
    token = make_token("alice")
    client = stack.client(token)
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text(TRAIN)
    (project / "data" / "huge.bin").write_bytes(b"\0" * 1000)
    (project / "weights.pt").write_bytes(b"\0" * 1000)
    (project / ".gitignore").write_text("data/\n")
    (project / ".towerqignore").write_text("*.pt\n")
    assert stack.api_url is not None

    first = towerq_cli("run", "--gpus", "1", "--", "python", "train.py", "--steps", "6", cwd=project,
                       api=stack.api_url, token=token)  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    assert "(sent)" in first.stdout and "data/" in first.stdout and "weights.pt" in first.stdout, first.stdout
    # the program's output as it comes (its log's lines, once each, in order), before how it ended
    printed = first.stdout.splitlines()
    said = [line.split(maxsplit=2)[2] for line in printed if re.match(r"\d\d:\d\d:\d\d (info|warning|error) ", line)]
    assert said[0].startswith("attempt 1 runs the command python train.py"), printed
    assert [m[:4] for m in said if m.startswith(("ENV ", "a line to stderr"))] == ["ENV ", "a li"], printed
    assert printed[-1].startswith("job ") and " succeeded" in printed[-1], printed
    assert sum(" succeeded" in line for line in printed) == 1, "its end said once"
    again = towerq_cli("run", "--detach", "--", "python", "train.py", "--steps", "6", cwd=project,
                       api=stack.api_url, token=token)  # fmt: skip
    assert again.returncode == 0 and "(already there)" in again.stdout, again.stdout + again.stderr

    # the same from Python: the folder's bundle, held already, and a job of its command
    with Client(stack.api_url, token) as python:
        assert python.send_code(project).sent is False
        job = python.run(["python", "train.py", "--steps", "4"], folder=project, gpus=1, env={"GREETING": "hi"})
        said = [row["message"] for row in job.log_lines()]  # its output as it prints it, until it ends
        assert [m for m in said if m.startswith(("ENV ", "a line to stderr"))][1] == "a line to stderr", said
        assert json.loads(next(m for m in said if m.startswith("ENV "))[4:])["GREETING"] == "hi", said
        assert job.refresh().state == "succeeded" and job.data["spec"]["command"][-1] == "4", job.data
        with pytest.raises(FolderError, match="nowhere: no such folder"):
            python.run(["python", "x.py"], folder=project / "nowhere")
        # an upload of hers by its name, as `towerq run --dataset cells` takes it
        packed = io.BytesIO()
        np.savez(packed, x=np.zeros((4, 2), np.float32), y=np.arange(4) % 2)
        python.upload_dataset("cells", "cells.npz", packed.getvalue())
        assert python.dataset_reference("cells") == "npz:users/alice/cells/data.npz"
        assert python.dataset_reference("cellz") is None
        held = python.run(["python", "train.py"], folder=project, dataset="cells", hold=True)
        assert held.data["spec"]["dataset"] == "npz:users/alice/cells/data.npz", held.data["spec"]
        # a clone: its spec again, not on hold unless asked, its fields changed
        assert "hold" not in python.cloned_spec(held.id)
        copy = python.clone(held.id, env={"SEED": "3"}, hold=True)
        assert copy.data["on_hold_by"] == "alice" and copy.data["spec"]["env"] == {"SEED": "3"}, copy.data
        assert [copy.data["spec"][k] for k in ("command", "code", "dataset")] == [
            held.data["spec"][k] for k in ("command", "code", "dataset")
        ]
        python.cancel(held.id)
        python.cancel(copy.id)

    jobs = client.get("/api/jobs").json()["items"]
    ran = next(j for j in jobs if j["state"] == "succeeded" and j["spec"]["command"][-1] == "6")
    files = {f["path"] for f in client.get(f"/api/code/{ran['spec']['code']}").json()["files"]}
    assert files == {".gitignore", ".towerqignore", "train.py"}, files
    assert ran["spec"]["command"] == ["python", "train.py", "--steps", "6"]


ELASTIC = """
import json, os, time
from pathlib import Path

import numpy as np
import towerq

STEPS = int(os.environ["STEPS"])
held, full = int(os.environ["TOWERQ_GPU_COUNT"]), int(os.environ["TOWERQ_BATCH_GPUS"])
print("SIZE " + json.dumps([held, full, os.environ["CUDA_VISIBLE_DEVICES"]]), flush=True)
checkpoint = Path(os.environ["TOWERQ_CHECKPOINT_DIR"]) / "state.npz"
step, w = 0, np.zeros(2)
if checkpoint.exists():
    saved = np.load(checkpoint)
    step, w = int(saved["step"]), saved["w"]
    print("resumed at step", step, flush=True)
per_gpu = 8
while step < STEPS:
    step += 1
    # The global batch is the full size's on any number of GPUs: each takes a larger slice.
    batch = per_gpu * full
    w = w + np.array([batch / 32.0, held / full]) * 0.01
    towerq.report(step=step, loss=1.0 / step, w0=float(w[0]), held=float(held))
    if step % 10 == 0:
        np.savez(str(checkpoint) + ".tmp.npz", step=step, w=w)
        os.replace(str(checkpoint) + ".tmp.npz", checkpoint)
    time.sleep(0.05)
"""


def test_an_elastic_command_job_grows_onto_idle_gpus_and_resumes_with_its_new_size(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    """A resumable program with `min_gpu_count` (issue 47): it starts on the 2 GPUs free of 4
    and is told so (`TOWERQ_GPU_COUNT` 2, `TOWERQ_BATCH_GPUS` 4); when the other job ends it
    is stopped and restarted on all 4 from its own checkpoint, told its new size, and its
    chart has every step once."""
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 4, trainer_pool=0)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    code = upload_code(client, {"elastic.py": ELASTIC})
    holder = client.post("/api/jobs", json={"command": ["sleep", "600"], "code": code, "gpus": [0, 1]})
    assert holder.status_code == 201, holder.text
    wait_state(client, holder.json()["id"], ("running",), 60)
    steps = 600
    spec = {"command": ["python", "elastic.py"], "code": code, "resumable": True, "gpu_count": 4,
            "min_gpu_count": 1, "env": {"STEPS": str(steps)}}  # fmt: skip
    created = client.post("/api/jobs", json=spec)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    job = wait_step(client, job_id, 30, 120)
    assert job["allocation"]["gpus"] == [2, 3], job["allocation"]

    backdate_allocations(settings.database_url, job_id, 0.2)  # past the 10 minutes between resizes
    client.post(f"/api/jobs/{holder.json()['id']}/cancel")
    job = wait_for(
        lambda: (j := job_of(client, job_id))["attempts"] == 2 and j["state"] == "running" and j,
        120,
        "the job to grow to 4 GPUs",
        0.3,
    )
    assert job["allocation"]["gpus"] == [0, 1, 2, 3], job["allocation"]
    done = finished(client, job_id, 240)
    assert (done["state"], done["attempts"], done["crashes"]) == ("succeeded", 2, 0), done["error"]

    events = [e["message"] for e in done["events"] if e["state"] in ("queued", "dispatched")]
    assert events[1:] == [
        "GPUs 2,3 on lab-a (2 of 4 GPUs, elastic)",
        "growing to 4 of 4 GPUs (idle ones): it restarts on GPUs 0,1,2,3 of lab-a from its checkpoint",
        "GPUs 0,1,2,3 on lab-a",
    ], events
    logs = [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs", params={"tail": 5000}).json()]
    sizes = [json.loads(m[5:]) for m in logs if m.startswith("SIZE ")]
    assert sizes == [[2, 4, "2,3"], [4, 4, "0,1,2,3"]], sizes
    resumed = [int(m.rsplit(" ", 1)[1]) for m in logs if m.startswith("resumed at step")]
    assert len(resumed) == 1 and resumed[0] >= 30 and resumed[0] % 10 == 0, resumed
    points = assert_metrics_continuous(client, job_id, 1, steps)
    assert {p["custom"]["held"] for p in points if p["step"] <= resumed[0]} == {2.0}
    assert {p["custom"]["held"] for p in points if p["step"] > resumed[0]} == {4.0}
    # The same global batch at both sizes: every step added the same to w0.
    assert points[-1]["custom"]["w0"] == pytest.approx(0.01 * steps * 8 * 4 / 32)
    assert [h["gpus"] for h in done["held"]] == [2, 4] and done["held"][1]["from_step"] == resumed[0]
