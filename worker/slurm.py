"""One attempt of one job on a Slurm compute node: `python -m worker.slurm JOB ATTEMPT`,
the batch script of the Slurm job towerq's Slurm executor submitted
(`service.executors.slurm`).

It runs the attempt exactly as a GPU host's worker does (`worker.runner.JobRunner` for a
model job's trainer, `worker.program.ProgramRunner` for a command job's program,
`worker.notebook.NotebookRunner` for a notebook session: the spec, the sandbox where
bubblewrap exists, the attempt's cgroup where one can be made, metrics, logs, the folder's
size, the recorded end), on the GPUs Slurm gave the job: the `CUDA_VISIBLE_DEVICES` Slurm
set is passed on unchanged. No warm trainer: each Slurm job starts its own. A session's door
listens on the node, by its Slurm name, where the API's proxy reaches it.

It holds no database or Redis credential: everything it asks of towerq and tells it goes
over HTTP to the API (`TOWERQ_API_URL`) with its attempt's own token
(`TOWERQ_ATTEMPT_TOKEN`, taken out of its environment at once), the attempt protocol of
`towerq.contract.attempts`: it claims the attempt (what to run), reports, reads a stop
asked in towerq (a cancel), and ends the attempt. A stop from Slurm (SIGTERM: `scancel`, a
time limit, the node being taken away) asks the trainer to checkpoint and ends without
recording anything: the scheduler records the end from what Slurm says of the job. An
attempt that is no longer current (towerq moved on while Slurm held it) exits at once.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import FrameType

from service.core.settings import Settings
from service.core.slurm_nodes import ASK_TIMEOUT_S, address_command, parse_address
from towerq.attempts import HttpChannel
from towerq.contract.attempts import AttemptChannel, AttemptEnd, Refused, StaleAttempt
from worker import sandbox
from worker.inventory import Inventory, NvmlInventory, SimulatedInventory, open_nvml
from worker.kinds import runner_for
from worker.launch import Launch, sandboxed_here
from worker.notebook import NotebookRunner
from worker.outcome import Stop

log = logging.getLogger("towerq.slurm")


def slurm_gpus(environ: dict[str, str]) -> list[int]:
    """The GPUs Slurm gave this job, from its `CUDA_VISIBLE_DEVICES` (indices only: a
    cluster that sets UUIDs there is not supported yet, said plainly)."""
    value = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not value:
        raise ValueError("Slurm set no CUDA_VISIBLE_DEVICES: does the partition have GPUs as gres (gres.conf)?")
    try:
        return [int(part) for part in value.split(",")]
    except ValueError:
        raise ValueError(f"CUDA_VISIBLE_DEVICES={value!r} is not a list of GPU indices") from None


def node_inventory(node: str, indices: list[int], simulated_gpus: int | None) -> Inventory:
    """The node's real GPUs where a driver answers, else simulated ones numbered as Slurm's."""
    if simulated_gpus is None:
        nvml, _ = open_nvml()
        if nvml is not None:
            return NvmlInventory(nvml)
    return SimulatedInventory(node, max(indices) + 1)


TOKEN_VARIABLE = "TOWERQ_ATTEMPT_TOKEN"
"""Where the executor puts the attempt's token in the batch script's environment."""


def claim(channel: AttemptChannel, node: str, indices: list[int], inventory: Inventory) -> Launch:
    """The launch of this attempt, now that Slurm started it on `node`: the job's row names
    the node; a stale attempt raises StaleAttempt."""
    gpus = {g.index: g for g in inventory.gpus()}
    said = channel.claim(node)
    return Launch(
        job_id=channel.job_id,
        attempt=channel.attempt,
        host=node,
        indices=indices,
        fraction=said.fraction,
        spec=said.spec,
        spec_version=said.spec_version,
        time_limit_s=said.time_limit_s,
        memory_total_mb=[gpus[i].memory_total_mb if i in gpus else 0 for i in indices],
        simulated=inventory.simulated,
        inputs=[(job_id, Path(folder)) for job_id, folder in said.inputs],
        notes=said.notes,
    )


def refuse(channel: AttemptChannel, why: str) -> None:
    """The attempt cannot run on this node: the job fails, saying why (a node set up
    wrongly fails every attempt the same way, so trying again elsewhere is not done)."""
    end_early(channel, AttemptEnd("failed", why))


def end_early(channel: AttemptChannel, end: AttemptEnd) -> None:
    """The attempt ends before it ran, as `end` says (where the API cannot be told, the
    scheduler records the end from what Slurm says of the job)."""
    log.error("job %s attempt %s: %s", channel.job_id, channel.attempt, end.message)
    try:
        channel.end(end)
    except StaleAttempt:
        pass
    except Exception:  # the API out of reach past the channel's patience: said in Slurm's log
        log.exception("job %s attempt %s: its end could not be told to the API", channel.job_id, channel.attempt)


def node_address(node: str) -> str:
    """Where Slurm says `node` is reached (its `NodeAddr`), for a session's door to listen
    there; its name where Slurm says nothing (or cannot be asked: the name is what it
    listened on before it asked)."""
    try:
        done = subprocess.run(address_command(node), capture_output=True, text=True, timeout=ASK_TIMEOUT_S)
        if done.returncode != 0:
            raise OSError(done.stderr.strip()[:300])
    except (OSError, subprocess.TimeoutExpired) as err:
        log.warning("sinfo could not say where %s is reached, so its door listens at its name: %s", node, err)
        return node
    return parse_address(done.stdout, node) or node


def run(job_id: int, attempt: int) -> int:
    settings = Settings()
    token = os.environ.pop(TOKEN_VARIABLE, "")
    if not token:
        log.error(
            "job %s attempt %s: no %s in the environment (was it submitted by towerq?)", job_id, attempt, TOKEN_VARIABLE
        )
        return 2
    channel = HttpChannel(settings.api_url, token, job_id, attempt)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        try:
            indices = slurm_gpus(dict(os.environ))
            sandboxed = sandboxed_here(settings)
        except (ValueError, sandbox.SandboxError) as err:
            refuse(channel, f"node {node} cannot run it: {err}")
            return 1
        inventory = node_inventory(node, indices, settings.simulated_gpus)
        try:
            launch = claim(channel, node, indices, inventory)
        except StaleAttempt as err:
            log.info("nothing to run: %s", err)
            return 0
        except Refused as err:
            said = f"node {node} could not claim it: {err}"
            if err.passing:  # Slurm could not be asked meanwhile: another attempt may
                end_early(channel, AttemptEnd("queued", said, crashed=True))
            else:
                refuse(channel, said)
            return 1
        runner = runner_for(None, inventory, launch, lambda _: None, sandboxed, channel=channel, settings=settings)
        if isinstance(runner, NotebookRunner):
            runner.door_host = node  # the API takes the node the attempt claimed, no other
            runner.door_listen = node_address(node)  # and reaches it where Slurm says
        slurm_id = os.environ.get("SLURM_JOB_ID", "?")
        runner.sink.log("info", f"Slurm job {slurm_id} runs it on {node}, GPUs {','.join(map(str, indices))}")

        def stopped_by_slurm(signum: int, _frame: FrameType | None) -> None:
            runner.request_stop(Stop.EXECUTOR, f"Slurm stopped the attempt ({signal.Signals(signum).name})")

        signal.signal(signal.SIGTERM, stopped_by_slurm)
        signal.signal(signal.SIGINT, stopped_by_slurm)
        runner.start()
        while runner.thread.is_alive():
            runner.join(0.5)  # short waits: the signal handler runs between them
        return 0
    finally:
        channel.close()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if len(argv) != 3 or not argv[1].isdigit() or not argv[2].isdigit():
        print("usage: python -m worker.slurm JOB_ID ATTEMPT", file=sys.stderr)
        return 2
    return run(int(argv[1]), int(argv[2]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
