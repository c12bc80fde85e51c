"""A job over several hosts: what going over the network costs, and how fast a lost rank
is noticed and the job is back at work.

Four measurements, each printed with the command's own control beside it:

1. **Throughput** (trainer processes, no service): LeNet-5 on 28×28×3 synthetic data,
   `--batch` examples per tower, SGD, 4 towers in all: one trainer of 4 towers (one host)
   against two trainers of 2 towers joined by TensorFlow's collective ops over loopback
   (two hosts, RING). Both are the real trainer (`python -m worker.trainer`), with the same
   input pipeline, steps per call (`log_every`), global batch and threads per tower;
   examples/s is the trainer's own figure for the global batch, the median of its calls
   after the first two. The repetitions are interleaved, so drift hits both alike. On
   this machine both share the same cores, so the ratio is the overhead of the collective
   (serialising, gRPC over loopback, the extra process), not scaling.
2. **Submit to first metric** through the whole service (API, scheduler, two workers of
   2 simulated GPUs, no warm trainers): a 4-GPU job over both hosts against a 2-GPU job on
   one host, each alone, cold; the difference is the rendezvous and the cluster's set-up.
3. **A lost rank**, through the service, for each of killed (SIGKILL), frozen (SIGSTOP)
   and stalled (alive, its step never ends): from the moment rank 1 is lost, the time
   until the job is back in the queue (noticed: the other rank said `peer_lost`, or the
   lost rank's worker saw its trainer end) and until the next attempt, on both hosts,
   logged its first train metric after resuming from rank 0's checkpoint (recovered),
   with the product's default `TOWERQ_COLLECTIVE_TIMEOUT_S`. Bar: noticed within 30 s.
   Also rank 1 frozen as soon as its trainer starts, before the ranks meet (its worker
   notices: the first collective would wait minutes for a slow start-up).
4. **The tunnel** (where the workers sandbox trainers): the LeNet job of 1. over both hosts
   through the service, its ranks connected through the worker's tunnel (the default)
   against the same job with `network: true` (the ranks on the host's network), each run
   to the end in turn, the same sandbox otherwise.

Usage: `python bench/multihost.py [--repeats 3] [--steps 300] [--batch 32] [--skip-service]
[--losses killed,frozen,stalled,frozen-while-starting]` (`--losses`: which losses of 3. to measure, all by default).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported (by the trainer tests' helpers)

from sqlalchemy import update  # noqa: E402

from bench.common import settings_in  # noqa: E402
from service.cli.redis_server import EmbeddedRedis, embedded_url  # noqa: E402
from service.core.db import Database, upgrade_database  # noqa: E402
from service.core.models import User  # noqa: E402
from service.core.settings import Settings  # noqa: E402
from service.lab.auth import create_token  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.stack import Stack, wait_for  # noqa: E402
from tests.test_multihost import rank_trainer  # noqa: E402
from tests.worker.trainer.test_process import events, run, write_spec  # noqa: E402
from tests.worker.trainer.test_ranks import STALL_FILE, STALLING_MODEL, finish_all, gang_specs, start_ranks  # noqa: E402
from worker.launch import artifacts_dir  # noqa: E402

DATA: dict[str, Any] = {"model": "lenet5", "dataset": "synthetic"}
OPTIONS = {"shape": [28, 28, 3], "train_examples": 2048, "test_examples": 64}
BAR_NOTICED_S = 30.0
FINAL = ("succeeded", "failed", "cancelled")
# -- 1. throughput -------------------------------------------------------------------------


def examples_per_s(lines: list[dict[str, Any]]) -> float:
    """The trainer's examples/s of the global batch: the median of its calls after the first two."""
    rates = [m["examples_per_sec"] for m in events(lines, "metric")][2:]
    if not rates:
        raise RuntimeError(f"no metric after the warm-up: {lines[-3:]}")
    return statistics.median(rates)


def throughput(workdir: Path, steps: int, batch: int) -> tuple[float, float]:
    """(one trainer of 4 towers, two trainers of 2 towers) in examples/s, run one after the other."""
    workdir.mkdir(parents=True)
    hyper: dict[str, Any] = {"steps": steps, "batch_size": batch, "log_every": 20, "checkpoint_every": 0}
    hyper.update(eval_every=0, optimizer="sgd", learning_rate=0.01, seed=1)
    one_host = write_spec(workdir, "one-host", towers=4, hyperparameters=hyper, dataset_options=OPTIONS, **DATA)
    code, lines = run(one_host)
    if code != 0:
        raise RuntimeError(f"the one-host trainer failed: {lines[-3:]}")
    single = examples_per_s(lines)
    ranks = gang_specs(
        workdir, size=2, towers=2, hyperparameters=hyper, dataset_options=OPTIONS, model="lenet5", dataset="synthetic"
    )
    results = finish_all(start_ranks(ranks), timeout=900)
    if any(code != 0 for code, _ in results):
        raise RuntimeError(f"a rank failed: {[lines[-2:] for _, lines in results]}")
    return single, examples_per_s(results[0][1])


# -- 2 and 3. through the service ----------------------------------------------------------


class Lab:
    """API, scheduler and two workers of 2 simulated GPUs in a temporary folder, with their own Redis."""

    def __init__(self, workdir: Path) -> None:
        # with a password, as `towerq up`'s: a job with `network: true` is refused without one
        self.redis = EmbeddedRedis(embedded_url(f"redis://127.0.0.1:{free_port()}/0"), workdir / "redis")
        self.redis.start()
        url = f"sqlite:///{workdir / 'towerq.db'}"
        upgrade_database(url)
        low = 20000 + 100 * secrets.randbelow(120)  # its ranks' ports: not those of a lab or test beside it
        self.settings: Settings = settings_in(
            workdir,
            url,
            self.redis.url,
            scheduler_interval_s=0.5,
            heartbeat_interval_s=1.0,
            rank_ports=f"{low}-{low + 99}",
        )
        self.settings.models_path.mkdir(parents=True, exist_ok=True)
        (self.settings.models_path / "stall_rank_1.py").write_text(STALLING_MODEL)
        db = Database(url)
        with db.write() as session:
            token = create_token(session, "alice")[1]
            session.execute(update(User).where(User.name == "alice").values(may_use_network=True))  # the admin's grant
        db.dispose()
        self.stack = Stack(self.settings, workdir)
        self.stack.start_api()
        self.stack.start_scheduler()
        for name in ("lab-a", "lab-b"):
            self.stack.start_worker(name, 2, worker_address="127.0.0.1", trainer_pool=0)
        self.client = self.stack.client(token)
        workers = wait_for(lambda: len(w := self.client.get("/api/workers").json()) == 2 and w, 60, "both workers")
        self.sandboxed = all(w["sandboxed"] for w in workers)

    def close(self) -> None:
        self.client.close()
        self.stack.stop_all()
        self.redis.stop()

    def job(self, job_id: int) -> dict[str, Any]:
        answer: dict[str, Any] = self.client.get(f"/api/jobs/{job_id}").json()
        return answer

    def train_points(self, job_id: int) -> list[dict[str, Any]]:
        return [p for p in self.client.get(f"/api/jobs/{job_id}/metrics").json() if p["split"] == "train"]

    def submit(self, body: dict[str, Any]) -> int:
        response = self.client.post("/api/jobs", json=body)
        if response.status_code != 201:
            raise RuntimeError(f"submit refused: {response.status_code} {response.text}")
        job_id: int = response.json()["id"]
        return job_id

    def end(self, job_id: int) -> None:
        self.client.post(f"/api/jobs/{job_id}/cancel")
        wait_for(lambda: self.job(job_id)["state"] in FINAL, 120, f"job {job_id}", 0.5)
        wait_for(lambda: all(not g["holders"] for g in self.client.get("/api/gpus").json()), 60, "the GPUs free")


def parse_time(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def first_metric_s(lab: Lab, gpus: int) -> float:
    """Seconds from submit to the job's first train metric, cold, alone in the lab."""
    hyper = {"steps": 100_000, "batch_size": 16, "log_every": 1, "checkpoint_every": 0}
    submitted = time.time()
    job_id = lab.submit({"model": "mlp", "dataset": "digits", "gpu_count": gpus, "hyperparameters": hyper})
    points = wait_for(lambda: lab.train_points(job_id), 180, f"job {job_id}'s first metric", 0.2)
    lab.end(job_id)
    return parse_time(points[0]["time"]) - submitted


def sandboxed_throughput(lab: Lab, steps: int, batch: int) -> tuple[float, float]:
    """(through the tunnel, on the host's network) in examples/s: the same 4-GPU job over
    both hosts, sandboxed, with its ranks' connections passed in by the worker (the default)
    and with `network: true` (the ranks use the host's network: no tunnel)."""
    hyper: dict[str, Any] = {"steps": steps, "batch_size": batch, "log_every": 20, "checkpoint_every": 0}
    hyper.update(eval_every=0, optimizer="sgd", learning_rate=0.01, seed=1)
    rates = []
    for network in (False, True):
        body = {**DATA, "dataset_options": OPTIONS, "gpu_count": 4, "hyperparameters": hyper, "network": network}
        job_id = lab.submit(body)
        job = wait_for(lambda i=job_id: (j := lab.job(i))["state"] in FINAL and j, 900, f"job {job_id}", 0.5)
        if job["state"] != "succeeded":
            raise RuntimeError(f"job {job_id} (network {network}) failed: {job['error']}")
        rates.append(statistics.median(p["examples_per_sec"] for p in lab.train_points(job_id)[2:]))
    return rates[0], rates[1]


def lose_a_rank(lab: Lab, how: str) -> dict[str, float]:
    """Lose rank 1 of a running 2-host job; seconds until the job is back in the queue and
    until its next attempt's first train metric, and the checkpoint it resumed from."""
    model = "stall_rank_1:build" if how == "stalled" else "mlp"
    hyper = {"steps": 100_000, "batch_size": 16, "log_every": 10, "checkpoint_every": 50}
    job_id = lab.submit({"model": model, "dataset": "digits", "gpu_count": 4, "hyperparameters": hyper})
    wait_for(lambda: max((p["step"] for p in lab.train_points(job_id)), default=0) >= 80, 300, "steps past 80", 0.2)
    victim = wait_for(lambda: rank_trainer(lab.stack, 1, 1), 30, "rank 1's trainer")
    reached = max(p["step"] for p in lab.train_points(job_id))
    lost_at = time.time()
    if how == "killed":
        victim.kill()
    elif how == "frozen":
        victim.send_signal(signal.SIGSTOP)
    else:
        (artifacts_dir(lab.settings, job_id) / STALL_FILE).touch()
    wait_for(lambda: lab.job(job_id)["attempts"] >= 2, 120, "the job to go back", 0.1)
    back = next(e for e in lab.job(job_id)["events"] if e["attempt"] == 2 and e["state"] == "queued")
    if how == "stalled":  # attempt 2 must not stall too
        (artifacts_dir(lab.settings, job_id) / STALL_FILE).unlink()
    again = wait_for(
        lambda: [p for p in lab.train_points(job_id) if p["attempt"] == 2], 180, "attempt 2's first metric", 0.2
    )
    logged = lab.client.get(f"/api/jobs/{job_id}/logs", params={"tail": 2000}).json()
    lines = [line["message"] for line in logged]
    resumed = [int(m.rsplit(" ", 1)[1]) for m in lines if "resumed from the checkpoint of step" in m]
    lab.end(job_id)
    figures = {
        "noticed_s": parse_time(back["time"]) - lost_at,
        "recovered_s": parse_time(again[0]["time"]) - lost_at,
        "resumed_from": resumed[0] if resumed else -1,
        "stored": reached,
    }
    if figures["noticed_s"] > BAR_NOTICED_S:  # where the time went: the attempt's last lines, timed from the loss
        print(f"{how}: noticed after {figures['noticed_s']:.1f} s; attempt 1's last lines (s after the loss):")
        for line in [line for line in logged if line.get("attempt") == 1][-20:]:
            print(f"  {parse_time(line['time']) - lost_at:+7.1f}  {line['message'][:200]}")
        clock = time.strftime("%H:%M:%S", time.localtime(lost_at))
        print(f"  the workers' and the scheduler's lines on job {job_id} (clock time; lost at {clock}):")
        for line in [line for line in lab.stack.dump_logs().splitlines() if f"job {job_id}" in line][-12:]:
            print(f"    {line[:200]}")
    return figures


def freeze_at_start(lab: Lab) -> dict[str, float]:
    """Freeze rank 1 of a 2-host job as soon as its trainer starts (before the ranks meet,
    where the first collective waits minutes for every rank's start-up): seconds until the
    job is back in the queue and until the next attempt's first train metric."""
    hyper = {"steps": 100_000, "batch_size": 16, "log_every": 10, "checkpoint_every": 50}
    job_id = lab.submit({"model": "mlp", "dataset": "digits", "gpu_count": 4, "hyperparameters": hyper})
    victim = wait_for(lambda: rank_trainer(lab.stack, 1, 1), 120, "rank 1's trainer", 0.05)
    victim.send_signal(signal.SIGSTOP)
    lost_at = time.time()
    wait_for(lambda: lab.job(job_id)["attempts"] >= 2, 400, "the job to go back", 0.1)
    back = next(e for e in lab.job(job_id)["events"] if e["attempt"] == 2 and e["state"] == "queued")
    again = wait_for(
        lambda: [p for p in lab.train_points(job_id) if p["attempt"] == 2], 180, "attempt 2's first metric", 0.2
    )
    lab.end(job_id)
    return {
        "noticed_s": parse_time(back["time"]) - lost_at,
        "recovered_s": parse_time(again[0]["time"]) - lost_at,
        "resumed_from": 0,
        "stored": 0,
    }


LOSSES = ("killed", "frozen", "stalled", "frozen while starting")


def service_part(
    workdir: Path, repeats: int, steps: int, batch: int, losses_asked: list[str]
) -> tuple[dict[str, list[float]], dict[str, dict[str, float]], list[tuple[float, float]]]:
    lab = Lab(workdir)
    try:
        tunnel = [sandboxed_throughput(lab, steps, batch) for _ in range(repeats)] if lab.sandboxed else []
        firsts: dict[str, list[float]] = {"4 GPUs over 2 hosts": [], "2 GPUs on 1 host": []}
        for _ in range(repeats):
            firsts["4 GPUs over 2 hosts"].append(first_metric_s(lab, 4))
            firsts["2 GPUs on 1 host"].append(first_metric_s(lab, 2))
        losses = {
            how: freeze_at_start(lab) if how == "frozen while starting" else lose_a_rank(lab, how)
            for how in losses_asked
        }
    finally:
        lab.close()
    return firsts, losses, tunnel


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--skip-service", action="store_true", help="only the throughput part")
    parser.add_argument("--losses", default=",".join(LOSSES).replace(" ", "-"), help="the losses to measure")
    args = parser.parse_args()
    losses_asked = [name.strip().replace("-", " ") for name in args.losses.split(",") if name.strip()]
    known = ", ".join(LOSSES).replace(" ", "-")
    if unknown := [name for name in losses_asked if name not in LOSSES]:
        parser.error(f"--losses: unknown {', '.join(unknown)} (known: {known})")
    if not losses_asked:
        parser.error(f"--losses: none given (known: {known})")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the stack stops too (`finally`)
    workdir = Path(tempfile.mkdtemp(prefix="towerq-multihost-"))
    one, two = [], []
    for i in range(args.repeats):
        single, gang = throughput(workdir / f"run-{i}", args.steps, args.batch)
        one.append(single)
        two.append(gang)
    cores = len(os.sched_getaffinity(0))
    print(
        f"LeNet-5, 28x28x3 synthetic, {args.batch} per tower, 4 towers, SGD, {args.steps} steps, "
        f"logical CPU devices on {cores} cores; median of {args.repeats} interleaved runs"
    )
    show: Callable[[list[float]], str] = lambda values: ", ".join(f"{v:.0f}" for v in values)  # noqa: E731
    print(f"  1 host x 4 towers:            {statistics.median(one):8.0f} examples/s  ({show(one)})")
    print(f"  2 hosts x 2 towers (RING):    {statistics.median(two):8.0f} examples/s  ({show(two)})")
    print(f"  2 hosts x 2 / 1 host x 4:     {statistics.median(two) / statistics.median(one):8.3f}")
    if args.skip_service:
        return 0
    firsts, losses, tunnel = service_part(workdir / "service", args.repeats, args.steps, args.batch, losses_asked)
    if tunnel:
        through, direct = (statistics.median(side) for side in zip(*tunnel, strict=True))
        print("the same 4-GPU job over 2 hosts through the service, sandboxed (median of runs):")
        runs = [show([t for t, _ in tunnel]), show([d for _, d in tunnel])]
        print(f"  ranks through the worker's tunnel (default): {through:8.0f} examples/s  ({runs[0]})")
        print(f"  ranks on the host's network (network: true): {direct:8.0f} examples/s  ({runs[1]})")
        print(f"  tunnel / host network:                       {through / direct:8.3f}")
    else:
        print("no sandbox on this machine (bwrap): the tunnel is not measured")
    print("submit to first train metric, cold, through the service (median of runs):")
    for name, values in firsts.items():
        print(f"  {name:<22} {statistics.median(values):6.2f} s  ({', '.join(f'{v:.2f}' for v in values)})")
    over, one_host = (statistics.median(v) for v in firsts.values())
    print(f"  over 2 hosts - on 1 host: {over - one_host:+.2f} s")
    print("rank 1 of a 4-GPU job lost (TOWERQ_COLLECTIVE_TIMEOUT_S default):")
    for how, figures in losses.items():
        print(
            f"  {how:<22} noticed (job back in the queue) {figures['noticed_s']:5.1f} s; "
            f"first metric of the next attempt {figures['recovered_s']:5.1f} s; "
            f"resumed from step {figures['resumed_from']:.0f} (stored when lost: {figures['stored']:.0f})"
        )
    met = all(f["noticed_s"] <= BAR_NOTICED_S for f in losses.values())
    print(f"  {'met' if met else 'NOT met'}: every loss noticed within {BAR_NOTICED_S:.0f} s")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
