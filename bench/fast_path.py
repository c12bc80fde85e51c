"""The fast path: from submit to first step, the relay, the API at lab scale; each figure
printed beside its bar (issue 12).

1. **Dispatch and start.** A whole stack (API, scheduler, one worker with one simulated GPU,
   SQLite, its own Redis), default settings: lenet5 on digits, one job at a time, in two
   rounds: each job submitted after the host sat idle for 3 s, and each submitted the moment
   the previous one ended. Measured per job: submit → `running` (the state event's time,
   from the client's clock before the POST), and submit → first metric row in the database
   (polled every 5 ms). Beside them, in the same run, the bare `python -c "import
   tensorflow"` time (median of 3), the bar for submit → first metric row. A third round
   submits, after 3 s idle and once a warm trainer is ready, a small net from the job's own
   code bundle (`model: "net:build"`), which the sandbox shows at `/code`. The same rounds run once more with
   `TOWERQ_TRAINER_POOL=0` (no warm trainers) as the control.
2. **Relay overhead.** The same trainer (mlp on digits, `log_every` 1, so one metric row per
   step), its examples/s by its own clock from step 100 to the end: relayed by the worker
   into the database and pub/sub (a job on the stack, warm pool off so that no refill runs
   beside it) against its output into a file nobody reads (the trainer run by hand, same
   spec, same environment). Interleaved repeats, medians.
3. **API at lab scale** (`--scale`): 10,000 jobs and 5,000,000 metric rows (one job of
   100,000 steps, the rest spread over the others) in SQLite; `GET /api/jobs` first page
   with several filters, and `GET /api/jobs/{id}/metrics?points=1000` for the long job:
   p99 over 200 requests each, through a real API process.

Usage: `python bench/fast_path.py [--jobs 12] [--skip-scale] [--rows 5000000]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import settings_in  # noqa: E402
from service.cli.redis_server import EmbeddedRedis  # noqa: E402
from service.core.db import Database, upgrade_database  # noqa: E402
from service.core.models import Job, JobEvent, Metric  # noqa: E402
from service.core.settings import Settings  # noqa: E402
from service.lab.auth import create_token  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.stack import Stack, wait_for  # noqa: E402
from worker import sandbox  # noqa: E402

FINAL = ("succeeded", "failed", "cancelled")
STARTUP_JOB = {
    "model": "lenet5",
    "dataset": "digits",
    "gpu_count": 1,
    "hyperparameters": {"steps": 10, "batch_size": 32, "log_every": 1, "eval_every": 0, "checkpoint_every": 0},
}


BUNDLE_NET = """
import keras


def build(params):
    return keras.Sequential([
        keras.Input(params["input_shape"]),
        keras.layers.Conv2D(6, 5, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(84, activation="relu"),
        keras.layers.Dense(params["num_classes"]),
    ])
"""


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def bare_import_s(repeats: int = 3) -> float:
    times = []
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import tensorflow"], check=True, env=env)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@dataclass
class Lab:
    """A stack in a temporary folder: API, scheduler, one worker with one simulated GPU."""

    worker_env: dict[str, object] = field(default_factory=dict)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="towerq-fast-")))

    def __post_init__(self) -> None:
        self.redis = EmbeddedRedis(f"redis://127.0.0.1:{free_port()}/0", self.workdir / "redis")
        self.url = f"sqlite:///{self.workdir / 'towerq.db'}"
        self.settings = settings_in(self.workdir, self.url, "redis://unused")
        self.stack: Stack | None = None

    def start(self, prepare: Callable[[str], Any] | None = None, worker: bool = True) -> Any:
        """Start the stack (`worker=False`: the API alone) on a database that `prepare(url)`
        may fill first; returns what `prepare` returned."""
        self.redis.start()
        upgrade_database(self.url)
        prepared = prepare(self.url) if prepare is not None else None
        self.settings = settings_in(self.workdir, self.url, self.redis.url)
        self.db = Database(self.url)
        with self.db.write() as session:
            token = create_token(session, "bench")[1]
        self.stack = Stack(self.settings, self.workdir)
        self.stack.start_api()
        self.client = self.stack.client(token)
        uploaded = self.client.post("/api/code", files={"file": ("net.py", BUNDLE_NET.encode())})
        uploaded.raise_for_status()
        self.bundle = str(uploaded.json()["id"])
        if worker:
            self.stack.start_scheduler()
            self.stack.start_worker("fast", 1, **self.worker_env)
            wait_for(self._worker_ready, 180, "the worker to register and warm its trainers", 0.5)
        return prepared

    def _worker_ready(self) -> bool:
        pool = int(str(self.worker_env.get("trainer_pool", 1)))
        return any(
            w["state"] == "up" and w["info"].get("warm_trainers", 0) >= pool
            for w in self.client.get("/api/workers").json()
        )

    def stop(self) -> None:
        if self.stack is not None:
            if hasattr(self, "client"):
                self.client.close()
            self.stack.stop_all()
        self.redis.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def submit(self, spec: dict[str, Any]) -> tuple[int, float]:
        submitted = time.time()
        response = self.client.post("/api/jobs", json=spec)
        response.raise_for_status()
        return response.json()["id"], submitted

    def poll(self, job_id: int, submitted: float, timeout: float = 120, every: float = 0.005) -> tuple[float, float]:
        """(submit → running, submit → first metric row) of `job_id`, once it has ended."""
        first_metric: float | None = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.db.read() as session:
                if first_metric is None and session.scalar(
                    select(Metric.id).where(Metric.job_id == job_id, Metric.split == "train").limit(1)
                ):
                    first_metric = time.time() - submitted
                state = session.scalar(select(Job.state).where(Job.id == job_id))
                if state in FINAL:
                    running = session.scalar(
                        select(func.min(JobEvent.time)).where(JobEvent.job_id == job_id, JobEvent.state == "running")
                    )
                    if state != "succeeded" or running is None or first_metric is None:
                        raise RuntimeError(f"job {job_id} ended {state}: {self.stack and self.stack.dump_logs()}")
                    return running.timestamp() - submitted, first_metric
            time.sleep(every)
        raise RuntimeError(f"job {job_id} did not end in {timeout}s")

    def rounds(self, jobs: int) -> dict[str, list[tuple[float, float]]]:
        """Each job after 3 s idle, then each job the moment the previous one ended."""
        results: dict[str, list[tuple[float, float]]] = {"idle": [], "back-to-back": [], "own code": []}
        for _ in range(jobs):
            time.sleep(3.0)
            results["idle"].append(self.poll(*self.submit(STARTUP_JOB)))
        for _ in range(jobs):
            results["back-to-back"].append(self.poll(*self.submit(STARTUP_JOB)))
        own = {**STARTUP_JOB, "model": "net:build", "code": self.bundle}
        for _ in range(jobs):  # after 3 s idle, and once the pool has warmed the next trainer
            time.sleep(3.0)
            wait_for(self._worker_ready, 60, "the next warm trainer", 0.1)
            results["own code"].append(self.poll(*self.submit(own)))
        return results


def startup(jobs: int) -> bool:
    sandboxed = sandbox.resolve(Settings().sandbox)
    print(
        "== dispatch and start: lenet5 on digits, one simulated GPU, default settings"
        f" (trainers {'in the bubblewrap sandbox' if sandboxed else 'unsandboxed'}) ==",
        flush=True,
    )
    measured: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for label, env in (("warm pool (default)", {}), ("control: TOWERQ_TRAINER_POOL=0", {"trainer_pool": 0})):
        lab = Lab(worker_env=env)
        try:
            lab.start()
            measured[label] = lab.rounds(jobs)
        finally:
            lab.stop()
    imported = bare_import_s()
    print(f"bare `import tensorflow`: {imported:.2f} s (median of 3, this run)")
    ok = True
    for label, rounds in measured.items():
        print(f"-- {label}")
        for mode, rows in rounds.items():
            running = [r for r, _ in rows]
            first = [m for _, m in rows]
            p50, p99 = statistics.median(running) * 1000, percentile(running, 99) * 1000
            first_ratio = statistics.median(first) / imported
            print(
                f"  {mode:12s} submit→running p50 {p50:5.0f} ms (bar ≤ 100) p99 {p99:5.0f} ms (bar ≤ 300); "
                f"submit→first metric median {statistics.median(first):.2f} s = {first_ratio:.2f}× import "
                f"(bar ≤ 1.0), max {max(first):.2f} s"
            )
            if label.startswith("warm") and mode != "own code":
                met = p50 <= 100 and p99 <= 300 and first_ratio <= 1.0
                print(f"    {verdict(met)}")
                ok = ok and met
    warm, cold = ([m for _, m in rounds["own code"]] for rounds in measured.values())
    print(
        f"own code, submit→first metric: warm pool {statistics.median(warm):.2f} s against "
        f"{statistics.median(cold):.2f} s cold = {statistics.median(warm) / statistics.median(cold):.2f}×"
    )
    return ok


RELAY_JOB = {
    "model": "mlp",
    "dataset": "digits",
    "gpu_count": 1,
    "hyperparameters": {"steps": 1500, "batch_size": 64, "log_every": 1, "eval_every": 0, "checkpoint_every": 0},
}
WARM_UP_STEPS = 100


def steady_rate(points: list[tuple[int, float]]) -> float:
    """Examples/s from the end of the warm-up to the last step, by the trainer's own clock
    (the time on each metric line)."""
    batch = RELAY_JOB["hyperparameters"]["batch_size"]  # type: ignore[index]
    start = next((step, at) for step, at in sorted(points) if step >= WARM_UP_STEPS)
    end = max(points)
    return (end[0] - start[0]) * batch / (end[1] - start[1])


def relayed(lab: Lab) -> tuple[float, Path]:
    """The relay job run on the stack: its steady examples/s and its spec file."""
    job_id, submitted = lab.submit(RELAY_JOB)
    lab.poll(job_id, submitted, timeout=600, every=1.0)
    with lab.db.read() as session:
        rows = session.execute(
            select(Metric.step, Metric.time).where(Metric.job_id == job_id, Metric.split == "train")
        ).all()
        folder = Path(session.scalar(select(Job.artifacts_dir).where(Job.id == job_id)) or "")
    if len(rows) != RELAY_JOB["hyperparameters"]["steps"]:  # type: ignore[index]
        raise RuntimeError(f"job {job_id} stored {len(rows)} metric rows")
    return steady_rate([(r.step, r.time.timestamp()) for r in rows]), folder / "spec-attempt-1.json"


def unrelayed(lab: Lab, spec_file: Path, run: int) -> float:
    """The same trainer, same spec and environment, its output into a file nobody reads."""
    from worker.launch import trainer_environment

    spec = json.loads(spec_file.read_text())
    folder = lab.workdir / f"by-hand-{run}"
    folder.mkdir()
    spec["runtime"].update(artifacts_dir=str(folder), parent_pid=None, job_id=10**6 + run)
    (folder / "spec.json").write_text(json.dumps(spec))
    out = folder / "out.jsonl"
    with out.open("wb") as sink:
        subprocess.run(
            [sys.executable, "-m", "worker.trainer", str(folder / "spec.json")],
            stdout=sink,
            stderr=subprocess.DEVNULL,
            env=trainer_environment([0]),
            cwd=folder,
            check=True,
        )
    events = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
    return steady_rate([(e["step"], e["time"]) for e in events if e.get("event") == "metric"])


def relay(repeats: int) -> bool:
    steps = RELAY_JOB["hyperparameters"]["steps"]  # type: ignore[index]
    print(f"== relay overhead: mlp on digits, {steps} steps, a metric row every step ==", flush=True)
    # No warm trainer: the pool's refill (loading TensorFlow for the next job) would run
    # beside the relayed job only, and this measures the relay alone.
    lab = Lab(worker_env={"trainer_pool": 0})
    rates: dict[str, list[float]] = {"relayed": [], "thrown away": []}
    try:
        lab.start()
        rate, spec_file = relayed(lab)  # a first run to have its spec file; not counted
        for run in range(repeats):  # alternating which side goes first, against drift
            if run % 2:
                rates["thrown away"].append(unrelayed(lab, spec_file, run))
            rates["relayed"].append(relayed(lab)[0])
            if not run % 2:
                rates["thrown away"].append(unrelayed(lab, spec_file, run))
    finally:
        lab.stop()
    ratio = statistics.median(rates["relayed"]) / statistics.median(rates["thrown away"])
    for side, values in rates.items():
        each = ", ".join(f"{v:.0f}" for v in values)
        print(f"  {side:12s} examples/s median {statistics.median(values):8.0f}  ({each})")
    print(f"  relayed / thrown away = {ratio:.3f} (bar ≥ 0.98): {verdict(ratio >= 0.98)}")
    return ratio >= 0.98


SCALE_JOBS = 10_000
LONG_JOB_STEPS = 100_000
USERS = [f"user{i:02d}" for i in range(20)]


def seed(url: str, rows: int) -> int:
    """10,000 jobs of 20 users in every state, and `rows` metric rows: one job of 100,000
    steps, the rest spread over the others. Returns the long job's id."""
    from sqlalchemy import insert

    from service.core import rollups
    from service.core.models import User

    db = Database(url)
    started = time.perf_counter()
    states = ["succeeded"] * 14 + ["failed", "cancelled", "running", "queued", "queued", "dispatched"]
    spec = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 500}}
    with db.write() as session:
        session.execute(insert(User), [{"name": name} for name in USERS])
        user_ids = {name: user_id for name, user_id in session.execute(select(User.name, User.id))}
        session.execute(
            insert(Job),
            [
                {
                    "name": f"run-{i}-{['lenet', 'mlp', 'resnet'][i % 3]}",
                    "user_id": user_ids[USERS[i % len(USERS)]],
                    "state": states[i % len(states)],
                    "spec": spec,
                    "gpu_count": 1 + i % 4,
                    "total_steps": 500,
                }
                for i in range(SCALE_JOBS)
            ],
        )
        long_job = session.scalar(select(func.max(Job.id)))
    assert long_job is not None
    now = datetime.now(UTC)
    per_job = max(1, (rows - LONG_JOB_STEPS) // (SCALE_JOBS - 1))

    def points():  # type: ignore[no-untyped-def]
        for step in range(1, LONG_JOB_STEPS + 1):
            yield {"job_id": long_job, "attempt": 1, "step": step, "split": "train", "loss": 2.0 - step / 1e5,
                   "accuracy": 0.5, "learning_rate": 0.001, "examples_per_sec": 1000.0, "time": now}  # fmt: skip
        for job_id in range(long_job - SCALE_JOBS + 1, long_job):
            for step in range(1, per_job + 1):
                yield {"job_id": job_id, "attempt": 1, "step": step, "split": "train", "loss": 1.0,
                       "accuracy": 0.5, "learning_rate": 0.001, "examples_per_sec": 1000.0, "time": now}  # fmt: skip

    batch: list[dict[str, Any]] = []
    written = 0
    for point in points():
        batch.append(point)
        if len(batch) == 50_000:
            with db.write() as session:
                session.execute(insert(Metric), batch)
                rollups.fold(session, batch)  # as the relay does when it writes rows
            written += len(batch)
            batch = []
    with db.write() as session:
        session.execute(insert(Metric), batch)
        rollups.fold(session, batch)
    written += len(batch)
    db.engine.dispose()
    print(f"  seeded {SCALE_JOBS:,} jobs and {written:,} metric rows in {time.perf_counter() - started:.0f} s")
    return long_job


def timed(client: Any, path: str, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        response = client.get(path)
        times.append(time.perf_counter() - started)
        response.raise_for_status()
    return times


def scale(rows: int, repeats: int = 200) -> bool:
    print(f"== API at lab scale: {SCALE_JOBS:,} jobs, {rows:,} metric rows, SQLite ==", flush=True)
    lab = Lab()
    try:
        long_job = lab.start(lambda url: seed(url, rows), worker=False)
        client = lab.client
        pages = {
            "GET /api/jobs": "/api/jobs",
            "GET /api/jobs?state=running": "/api/jobs?state=running",
            "GET /api/jobs?state=queued,failed": "/api/jobs?state=queued,failed",
            "GET /api/jobs?user=user07": "/api/jobs?user=user07",
            "GET /api/jobs?q=resnet": "/api/jobs?q=resnet",
            "GET /api/jobs?user=user07&state=succeeded&q=lenet": "/api/jobs?user=user07&state=succeeded&q=lenet",
        }
        ok = True
        for label, path in pages.items():
            timed(client, path, 5)  # warm
            p99 = percentile(timed(client, path, repeats), 99) * 1000
            print(f"  {label:52s} p99 {p99:6.1f} ms (bar ≤ 50): {verdict(p99 <= 50)}")
            ok = ok and p99 <= 50
        path = f"/api/jobs/{long_job}/metrics?points=1000"
        sampled = client.get(path).json()
        timed(client, path, 3)
        p99 = percentile(timed(client, path, repeats // 4), 99) * 1000
        print(
            f"  GET /api/jobs/{{id}}/metrics?points=1000 of {LONG_JOB_STEPS:,} steps -> {len(sampled)} rows: "
            f"p99 {p99:6.1f} ms (bar ≤ 100): {verdict(p99 <= 100)}"
        )
        full = f"/api/jobs/{long_job}/metrics?split=train&limit=20000"
        full_p50 = statistics.median(timed(client, full, 10)) * 1000
        print(f"  control: the first 20,000 rows of it at full resolution, p50 {full_p50:6.1f} ms")
        return ok and p99 <= 100
    finally:
        lab.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--jobs", type=int, default=12, help="jobs per round (idle, back-to-back)")
    parser.add_argument("--repeats", type=int, default=3, help="relay runs per side")
    parser.add_argument("--rows", type=int, default=5_000_000, help="metric rows in the scale test")
    parser.add_argument("--only", choices=("startup", "relay", "scale"), default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    checks: dict[str, Callable[[], bool]] = {
        "startup": lambda: startup(args.jobs),
        "relay": lambda: relay(args.repeats),
        "scale": lambda: scale(args.rows),
    }
    results = {name: check() for name, check in checks.items() if args.only in (None, name)}
    print(json.dumps({name: verdict(ok) for name, ok in results.items()}))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
