"""A real single-node Slurm cluster for the tests: Debian's `munged`, `slurmctld` and
`slurmd`, with fake GPUs as gres over device nodes this module creates.

Everything lives in one folder (config, state, logs, its own munge socket and key), on
ports picked free, so that it neither needs nor touches a system Slurm. The daemons run in
the foreground as children of the test process, with PR_SET_PDEATHSIG, and are killed
(with the job steps they started) when the cluster stops.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("sbatch", "squeue", "scancel", "sinfo", "scontrol")
FAKE_GPU_MAJOR = 195  # the NVIDIA character devices' major number; nothing here opens them
PORT_TRIES = 3
NODE = "towerq-node-1"  # a name no resolver here knows (the tests check that it does not)


def missing() -> str | None:
    """Why a cluster cannot start here, or None."""
    absent = [name for name in (*DAEMONS, *COMMANDS) if shutil.which(name) is None]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing): scripts/setup-system --test installs it"
    if os.geteuid() != 0:
        return "the Slurm test cluster runs its daemons as root (fake GPU device nodes, slurmd)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    os.setsid()


class SlurmCluster:
    """One controller and one node (`node`), with `gpus` fake GPUs and `cpus` CPUs. With
    `confined`, Slurm binds each job to the CPUs it was given (`task/affinity`): then `cpus`
    must be the machine's own."""

    def __init__(
        self, root: Path, gpus: int = 4, cpus: int = 4, env: dict[str, str] | None = None, confined: bool = False
    ) -> None:
        self.root = root
        self.gpus = gpus
        self.cpus = cpus
        self.confined = confined
        self.host = socket.gethostname()
        self.node = NODE
        """The node's Slurm name, which resolves nowhere: Slurm reaches it at its `NodeAddr`,
        and so must towerq (a notebook session's door)."""
        self.env = {**os.environ, **(env or {})}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.conf = root / "slurm.conf"
        self.env["SLURM_CONF"] = str(self.conf)

    # -- set up ---------------------------------------------------------------------------

    def write_config(self) -> None:
        root = self.root
        for folder in ("state", "spool", "log", "munge", "dev"):
            (root / folder).mkdir(parents=True, exist_ok=True)
        os.chmod(root / "munge", 0o700)
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for index in range(self.gpus):
            device = root / "dev" / f"fakegpu{index}"
            if not device.exists():
                os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(FAKE_GPU_MAJOR, index))
        ctl_port, node_port = _free_port(), _free_port()
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=towerqtest",
                    f"SlurmctldHost={self.host}(127.0.0.1)",
                    f"SlurmctldPort={ctl_port}",
                    f"SlurmdPort={node_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={root}/munge/munge.socket",
                    f"StateSaveLocation={root}/state",
                    f"SlurmdSpoolDir={root}/spool",
                    "SlurmdParameters=config_overrides",
                    f"SlurmctldPidFile={root}/slurmctld.pid",
                    f"SlurmdPidFile={root}/slurmd.pid",
                    f"SlurmctldLogFile={root}/log/slurmctld.log",
                    f"SlurmdLogFile={root}/log/slurmd.log",
                    "SlurmctldDebug=info",
                    "SlurmdDebug=info",
                    "ProctrackType=proctrack/linuxproc",
                    f"TaskPlugin=task/{'affinity' if self.confined else 'none'}",
                    "SwitchType=switch/none",
                    "MpiDefault=none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "SchedulerType=sched/backfill",
                    "SchedulerParameters=bf_interval=1,sched_interval=1",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "GresTypes=gpu",
                    "ReturnToService=2",
                    "SlurmdTimeout=6",
                    "SlurmctldTimeout=10",
                    "MessageTimeout=5",
                    "KillWait=10",
                    "MinJobAge=600",
                    "InactiveLimit=0",
                    "Waittime=0",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 NodeHostname={self.host} "
                    f"CPUs={self.cpus} Gres=gpu:{self.gpus} State=UNKNOWN",
                    f"PartitionName=gpu Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        last = self.gpus - 1
        files = f"fakegpu[0-{last}]" if last else "fakegpu0"
        (root / "gres.conf").write_text(f"Name=gpu File={root}/dev/{files}\n")
        (root / "cgroup.conf").write_text("CgroupPlugin=autodetect\n")

    def start(self) -> None:
        """The daemons, on ports that were free a moment before: where another process took
        one meanwhile (a suite on two cores starts many servers), on others, up to
        `PORT_TRIES` times (a clean run's one error: slurmd's "Address already in use")."""
        for tried in range(1, PORT_TRIES + 1):
            try:
                self._start_once()
                return
            except RuntimeError as err:
                if "Address already in use" not in str(err) or tried == PORT_TRIES:
                    raise
                self.stop()

    def _start_once(self) -> None:
        self.write_config()
        root = self.root
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={root}/munge/munge.socket",
                f"--key-file={root}/munge/munge.key",
                f"--pid-file={root}/munge/munged.pid",
                f"--log-file={root}/log/munged.log",
                f"--seed-file={root}/munge/munged.seed",
            ],
        )
        self._wait_for(lambda: (root / "munge" / "munge.socket").exists(), "munged's socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait_for(lambda: self.run("sinfo", "-h", check=False).returncode == 0, "slurmctld to answer")
        self.start_slurmd()
        self._wait_for(self.node_idle, "the node to be idle")

    def start_slurmd(self) -> None:
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])

    def kill_slurmd(self) -> None:
        """SIGKILL the node's daemon (its job steps live on, as on a real node)."""
        process = self.processes.pop("slurmd")
        process.kill()
        process.wait()

    def node_idle(self) -> bool:
        result = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
        return result.returncode == 0 and result.stdout.strip() in ("idle", "mixed", "allocated")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 (the child holds it)
        self.processes[name] = subprocess.Popen(
            argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
        log.close()

    def _wait_for(self, ready, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited ({process.returncode}) while waiting for {what}: {self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what}: {self.logs()}")

    def logs(self) -> str:
        texts = []
        for path in sorted((self.root / "log").glob("*")):
            texts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(texts)

    # -- use ------------------------------------------------------------------------------

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30, check=check)

    def jobs(self) -> list[dict[str, str]]:
        """Every job Slurm still knows: id, name, state, reason, node."""
        out = self.run("squeue", "-h", "--states=all", "-o", "%i|%j|%T|%r|%N").stdout
        keys = ("id", "name", "state", "reason", "node")
        return [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines() if line]

    def cpus_of(self, slurm_id: str) -> int:
        """The CPUs Slurm gave a job (`scontrol show job`'s NumCPUs)."""
        return int(self.shown(slurm_id, "NumCPUs"))

    def shown(self, slurm_id: str, field: str) -> str:
        """A field of `scontrol show job`: `shown(id, "TimeLimit")` is `02:02:00`."""
        out = self.run("scontrol", "show", "job", "--oneliner", slurm_id).stdout
        return next(word for word in out.split() if word.startswith(f"{field}=")).partition("=")[2]

    # -- tear down ------------------------------------------------------------------------

    def stop(self) -> None:
        for job in self.jobs() if "slurmctld" in self.processes else []:
            if job["state"] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                self.run("scancel", job["id"], check=False)
        for name in ("slurmd", "slurmctld", "munged"):
            process = self.processes.pop(name, None)
            if process is not None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        for pid in self.own_processes():  # job steps outlive slurmd (by design); here they go too
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def own_processes(self) -> list[int]:
        """Processes started under this cluster (slurmstepd and the jobs' own): those whose
        environment names its config."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found
