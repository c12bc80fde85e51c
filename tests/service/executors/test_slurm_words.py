"""What the Slurm executor says to Slurm and reads back, without a cluster: the sbatch
command, squeue's lines, gres, and Slurm's states and reasons in towerq's words. The
whole path runs against a real Slurm in tests/test_slurm.py."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from service.core.settings import Settings
from service.executors import Attempt, executor_for
from service.executors.slurm import SlurmExecutor, batch_environment, time_limit_minutes
from service.executors.slurm_cpus import NodeRow, partitions_used, share_per_gpu, slurm_sets_cpus_per_gpu
from service.executors.slurm_words import (
    SEP,
    SlurmJob,
    ended,
    expected_start,
    parse_gpus,
    parse_nodes,
    parse_squeue,
    pending_reason,
)


@pytest.fixture
def slurm(make_settings: Callable[..., Settings], sqlite_url: str, tmp_path: Path) -> SlurmExecutor:
    settings = make_settings(
        sqlite_url,
        executor="slurm",
        slurm_partition="gpu,gpu-long",
        slurm_account="vision",
        slurm_job_prefix="lab",
        slurm_python="/opt/towerq env/bin/python",
        slurm_log_dir=tmp_path / "slurm",
    )
    executor = executor_for(settings, None)  # type: ignore[arg-type]  # Slurm needs no Redis
    assert isinstance(executor, SlurmExecutor) and not executor.places_jobs
    return executor


def test_an_attempt_becomes_one_sbatch_asking_its_gpus_as_gres(slurm: SlurmExecutor, tmp_path: Path) -> None:
    command = slurm.sbatch_command(Attempt(12, 3, "", gpu_count=2, time_limit_s=3600))
    assert command[:2] == ["sbatch", "--parsable"]
    assert "--job-name=lab-12-3" in command and "--gres=gpu:2" in command
    assert "--no-requeue" in command and "--export=ALL" in command  # towerq owns retries
    assert "--partition=gpu,gpu-long" in command and "--account=vision" in command
    assert "--time=62" in command  # towerq's hour, the 30 s grace and a minute: Slurm's is the backstop
    assert f"--output={tmp_path / 'slurm'}/lab-12-3-%j.out" in command
    assert command[-1] == "--wrap=exec '/opt/towerq env/bin/python' -m worker.slurm 12 3"
    assert not any(c.startswith(("--nodelist", "--time=")) for c in slurm.sbatch_command(Attempt(1, 1, "")))
    assert "--nodelist=node7" in slurm.sbatch_command(Attempt(1, 1, "node7", 1))
    assert "--gres=gpu:1" in slurm.sbatch_command(Attempt(1, 1, "", 0))  # a fractional job: one whole GPU


def test_a_batch_script_gets_the_api_and_its_attempt_token_and_no_credential() -> None:
    scheduler = {
        "PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm/slurm.conf", "TOWERQ_ARTIFACTS_DIR": "/shared/artifacts",
        "TOWERQ_SANDBOX": "auto", "TOWERQ_EXECUTOR": "slurm",
        "TOWERQ_DATABASE_URL": "postgresql://towerq:hunter2@db/towerq", "TOWERQ_REDIS_URL": "rediss://:pw@redis:6380/0",
        "TOWERQ_TOKEN": "tq_admin", "TOWERQ_WEBHOOK_URL": "https://hooks.slack.com/services/T/B/X",
        "TOWERQ_WEBHOOK_SECRET": "s", "PGPASSWORD": "hunter2", "DATABASE_URL": "postgresql://x",
        "AWS_SECRET_ACCESS_KEY": "k",
        "TOWERQ_ATTEMPT_TOKEN": "tqa_an-older-one", "TOWERQ_API_URL": "http://127.0.0.1:8000",
    }  # fmt: skip
    env = batch_environment(scheduler, "tqa_this-one", "http://towerq.lab:8000")
    assert env == {
        "PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm/slurm.conf", "TOWERQ_ARTIFACTS_DIR": "/shared/artifacts",
        "TOWERQ_SANDBOX": "auto", "TOWERQ_EXECUTOR": "slurm",
        "TOWERQ_API_URL": "http://towerq.lab:8000", "TOWERQ_ATTEMPT_TOKEN": "tqa_this-one",
    }  # fmt: skip


def test_time_limits_round_up_to_whole_minutes() -> None:
    assert time_limit_minutes(None, 30) is None
    assert time_limit_minutes(1, 0) == 2
    assert time_limit_minutes(600, 30) == 12


SINFO = "\n".join(
    SEP.join(fields)
    for fields in [
        ("a1", "gpu*", "gpu:a100:4(S:0-1)", "idle", "64"),  # 16 CPUs per GPU
        ("a2", "gpu*", "gpu:a100:8(S:0-1)", "mix", "64"),  # 8
        ("v1", "gpu-long", "gpu:v100:4", "alloc", "24"),  # 6
        ("c1", "cpu", "(null)", "idle", "128"),  # no GPU: never counted
        ("a1", "gpu-long", "gpu:a100:4(S:0-1)", "idle", "64"),  # a node in two partitions
        ("garbled line",),
    ]
)
PARTITIONS = """\
PartitionName=gpu AllowGroups=ALL Default=YES Nodes=a[1-2] State=UP JobDefaults=DefCpuPerGPU=3 DefMemPerNode=UNLIMITED
PartitionName=gpu-long AllowGroups=ALL Default=NO Nodes=a1,v1 State=UP JobDefaults=(null) DefMemPerNode=UNLIMITED
"""
CONFIG = "GpuFreqDef              = high,memory=high\nJobDefaults             = {}\nMpiDefault              = none\n"


def test_an_attempt_asks_the_nodes_share_of_cpus_per_gpu_so_towers_do_not_share_a_core() -> None:
    rows = parse_nodes(SINFO)
    assert len(rows) == 5 and rows[0] == NodeRow("a1", "gpu", True, 4, 64, "idle")
    assert partitions_used(rows, "") == {"gpu"}  # the cluster's default
    assert partitions_used(rows, "gpu-long,cpu") == {"gpu-long", "cpu"}
    assert partitions_used([r for r in rows if not r.default], "") == {"gpu-long", "cpu"}  # none is the default
    assert share_per_gpu(rows, {"gpu"}) == 8  # the smallest: a job with 8 GPUs fits a2's 64 CPUs
    assert share_per_gpu(rows, {"gpu"}, "a1") == 16  # the node it names
    assert share_per_gpu(rows, {"gpu", "gpu-long", "cpu"}) == 6
    assert share_per_gpu(rows, {"cpu"}) is None  # no GPU node: Slurm's default
    assert share_per_gpu([NodeRow("tiny", "gpu", True, 8, 4, "idle")], {"gpu"}) == 1  # at least one


def test_slurms_own_default_per_gpu_stands_where_every_partition_used_has_one() -> None:
    assert slurm_sets_cpus_per_gpu(PARTITIONS, CONFIG.format("(null)"), {"gpu"})
    assert not slurm_sets_cpus_per_gpu(PARTITIONS, CONFIG.format("(null)"), {"gpu", "gpu-long"})  # one has none
    assert not slurm_sets_cpus_per_gpu(PARTITIONS, CONFIG.format("(null)"), {"gpu-long"})
    assert slurm_sets_cpus_per_gpu(PARTITIONS, CONFIG.format("DefCpuPerGPU=2,DefMemPerGPU=8000"), {"gpu-long"})
    assert not slurm_sets_cpus_per_gpu(PARTITIONS, CONFIG.format("DefMemPerGPU=8000"), {"gpu-long"})
    assert not slurm_sets_cpus_per_gpu("", CONFIG.format("(null)"), set())


def test_the_cpus_an_admin_sets_per_gpu_go_to_sbatch(
    make_settings: Callable[..., Settings], sqlite_url: str, slurm: SlurmExecutor
) -> None:
    assert "--cpus-per-task=12" in slurm.sbatch_command(Attempt(1, 1, "", 3), 12)
    assert not any(c.startswith("--cpus") for c in slurm.sbatch_command(Attempt(1, 1, "", 3), None))
    for per_gpu, gpus, cpus in ((5, 2, 10), (5, 0, 5), (0, 2, None)):  # 0 GPUs: a fraction of one
        settings = make_settings(sqlite_url, executor="slurm", slurm_cpus_per_gpu=per_gpu)
        executor = executor_for(settings, None)  # type: ignore[arg-type]
        assert isinstance(executor, SlurmExecutor)
        assert executor.cpus_per_task(Attempt(1, 1, "", gpus)) == cpus  # asks Slurm nothing


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [("gpu:4", 4), ("gpu:a100:2(S:0-1),gpu:v100:2(S:1)", 4), ("(null)", 0), ("gpu:tesla:8,nic:2", 8), ("", 0)],
)
def test_gres_gpus_are_counted_whatever_their_type(gres: str, gpus: int) -> None:
    assert parse_gpus(gres) == gpus


def test_squeue_lines_give_towerqs_jobs_only() -> None:
    now = int(datetime.now(UTC).timestamp())
    lines = [
        SEP.join(("41", "RUNNING", str(now - 60), "node1", "(null)", "None", "lab-7-1")),
        SEP.join(("42", "PENDING", str(now + 600), "", "node2", "Resources", "lab-8-1")),
        SEP.join(("43", "PENDING", "N/A", "", "(null)", "Priority", "lab-9-2")),
        SEP.join(("44", "RUNNING", str(now), "node1", "", "None", "someone-elses")),
        SEP.join(("45", "PENDING", "0", "", "", "Resources", "lab-9-2")),  # a resubmission
        "not a line squeue writes",
    ]
    jobs = parse_squeue("\n".join(lines), "lab")
    assert sorted(jobs) == ["lab-7-1", "lab-8-1", "lab-9-2"]
    assert jobs["lab-7-1"][0].node == "node1" and jobs["lab-7-1"][0].state == "RUNNING"
    assert jobs["lab-8-1"][0].node == "node2"  # where Slurm plans to start a pending job
    assert jobs["lab-8-1"][0].start == datetime.fromtimestamp(now + 600, UTC)
    assert [j.id for j in jobs["lab-9-2"]] == [43, 45] and jobs["lab-9-2"][0].start is None


def job(state: str, reason: str = "None", start: datetime | None = None, node: str = "node1") -> SlurmJob:
    return SlurmJob(17, "lab-1-1", state, reason, start, node)


def test_a_pending_job_says_slurms_reason_and_expected_start() -> None:
    soon = datetime.now(UTC) + timedelta(minutes=20)
    assert pending_reason(job("PENDING", "Resources")) == (
        "Slurm job 17 is pending (Resources: the GPUs it asks for are in use)"
    )
    assert pending_reason(job("PENDING", "QOSGrpNodeLimit")) == "Slurm job 17 is pending (QOSGrpNodeLimit)"
    assert pending_reason(job("PENDING", "None")) == "Slurm job 17 is pending: about to start"
    assert pending_reason(job("RUNNING")) is None
    assert expected_start(job("PENDING", start=soon)) == soon
    assert expected_start(job("PENDING", start=soon + timedelta(days=400))) is None  # Slurm's "no idea"
    assert expected_start(job("RUNNING", start=soon)) is None


@pytest.mark.parametrize(
    ("state", "outcome", "words"),
    [
        ("CANCELLED", "cancelled", "cancelled in Slurm (Slurm job 17 on node1 was cancelled"),
        ("TIMEOUT", "failed", "Slurm ended it at its time limit (Slurm job 17 on node1: TIMEOUT)"),
        ("NODE_FAIL", "requeue", "its node failed (Slurm job 17 on node1: NODE_FAIL); it resumes from its checkpoint"),
        ("BOOT_FAIL", "requeue", "its node failed"),
        ("PREEMPTED", "preempted", "Slurm preempted it"),
        ("OUT_OF_MEMORY", "failed", "more host memory than it was given"),
        ("COMPLETED", "failed", "ended without reporting an end"),
        ("FAILED", "failed", "Slurm job 17 on node1 ended FAILED: NonZeroExitCode"),
    ],
)
def test_an_end_slurm_decided_is_said_in_towerqs_words(tmp_path: Path, state: str, outcome: str, words: str) -> None:
    said = ended(job(state, "NonZeroExitCode"), tmp_path)
    assert said.outcome == outcome and words in said.message
