"""The lab deployment (docker-compose.yml, Dockerfile, the wheel), tested without a container
engine: the files parsed as Docker reads them, the services' own commands run as processes
with the compose environment against a password-protected PostgreSQL and a TLS Redis with a
password, and a non-editable wheel installed into a fresh virtual environment."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest

from service.cli.command import parser as towerq_parser
from service.cli.redis_server import RedisUnavailableError, answers, redis_binary
from service.core.lifetime import dies_with_this_process
from service.core.settings import Settings
from tests.compose import (
    COMPOSE,
    InterpolationError,
    dockerfile_stages,
    load_compose,
    read_env_file,
    variables,
)
from tests.conftest import free_port
from tests.stack import REPO, ends_with_its_killed_starter, wait_for
from tests.test_up import FINAL, Up, processes_in_session

TOWERQ_SERVICES = ("migrate", "bootstrap", "api", "scheduler", "worker")
ONE_SHOTS = ("migrate", "bootstrap")
SPEC = {"model": "mlp", "dataset": "digits", "gpu_count": 1, "hyperparameters": {"steps": 40}}


def example_compose(**env: str) -> dict:
    values, _ = read_env_file()
    return load_compose({**values, **env})


def seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(duration[:-1]) * units[duration[-1]]


def parses_as_towerq(command: list[str]) -> None:
    """`command` is exec form and a valid `towerq` command line."""
    assert isinstance(command, list) and command[0] == "towerq", command
    towerq_parser().parse_args(command[1:])


# -- the compose file ----------------------------------------------------------------------


def test_compose_services_start_in_order_after_the_migrations() -> None:
    services = example_compose()["services"]
    assert set(services) == {"postgres", "redis", *TOWERQ_SERVICES}
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["bootstrap"]["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    for name in ("api", "scheduler", "worker"):
        assert services[name]["depends_on"] == {
            "migrate": {"condition": "service_completed_successfully"},
            "redis": {"condition": "service_healthy"},
        }, name
    for name in ONE_SHOTS:
        assert services[name]["restart"] == "no"
    for name in ("postgres", "redis", "api", "scheduler", "worker"):
        assert services[name]["restart"] == "unless-stopped", name


def test_compose_runs_towerq_commands_in_exec_form_under_an_init() -> None:
    services = example_compose()["services"]
    expected = {
        "migrate": ["towerq", "db", "upgrade"],
        "bootstrap": ["towerq", "admin", "bootstrap"],
        "api": ["towerq", "api", "--host", "0.0.0.0"],
        "scheduler": ["towerq", "scheduler"],
        "worker": ["towerq", "worker"],
    }
    for name, command in expected.items():
        service = services[name]
        assert service["command"] == command
        parses_as_towerq(service["command"])
        assert service["init"] is True, name  # SIGTERM reaches towerq, not a shell
        assert service["build"]["target"] == ("worker" if name == "worker" else "api")
    assert services["api"]["healthcheck"]["test"] == ["CMD", "towerq", "health", "api"]
    assert services["worker"]["healthcheck"]["test"] == ["CMD", "towerq", "health", "worker"]
    for name in ("api", "worker"):
        parses_as_towerq(services[name]["healthcheck"]["test"][1:])
    assert services["postgres"]["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    assert "redis-cli ping" in services["redis"]["healthcheck"]["test"][1]


def test_the_worker_shares_the_host_pids_needs_real_gpus_and_outlives_the_checkpoint_grace() -> None:
    services = example_compose()["services"]
    worker = services["worker"]
    assert worker["pid"] == "host"
    assert worker["environment"]["TOWERQ_REQUIRE_GPUS"] == "true"
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    grace = Settings(cancel_grace_s=float(worker["environment"]["TOWERQ_CANCEL_GRACE_S"])).cancel_grace_s
    assert seconds(worker["stop_grace_period"]) > grace + 10  # compose's default 10 s would not do
    for name in ("api", "scheduler"):
        assert seconds(services[name]["stop_grace_period"]) >= 10


def test_every_towerq_variable_the_compose_file_sets_is_a_valid_setting() -> None:
    services = example_compose()["services"]
    fields = {f"TOWERQ_{name.upper()}" for name in Settings.model_fields}
    for name in TOWERQ_SERVICES:
        environment = services[name]["environment"]
        towerq = {key: value for key, value in environment.items() if key.startswith("TOWERQ_")}
        assert set(towerq) <= fields, f"{name}: {set(towerq) - fields} are not settings"
        settings = Settings(**{key.removeprefix("TOWERQ_").lower(): value for key, value in towerq.items()})
        assert settings.database_url == "postgresql+psycopg://towerq:change-me-postgres@postgres:5432/towerq"
        assert settings.redis_url == "redis://:change-me-redis@redis:6379/0"


def test_secrets_come_from_the_env_file_and_the_compose_file_refuses_to_start_without_them() -> None:
    text = COMPOSE.read_text()
    values, mentioned = read_env_file()
    assert "change-me" not in text and "POSTGRES_PASSWORD: towerq" not in text
    assert variables(text) <= set(values) | mentioned, "a variable of the compose file is not in .env.example"
    for secret in ("POSTGRES_PASSWORD", "REDIS_PASSWORD"):
        without = {key: value for key, value in values.items() if key != secret}
        with pytest.raises(InterpolationError, match=f"{secret}: set {secret} in .env"):
            load_compose(without)
    # Postgres and Redis are published for other GPU hosts, on loopback unless .env says otherwise.
    services = example_compose()["services"]
    assert services["postgres"]["ports"] == ["127.0.0.1:5432:5432"]
    assert services["redis"]["ports"] == ["127.0.0.1:6379:6379"]
    joined = example_compose(DB_BIND="10.0.0.5", REDIS_BIND="10.0.0.5")["services"]
    assert joined["postgres"]["ports"] == ["10.0.0.5:5432:5432"]
    # A GPU host names the main box; a TLS Redis replaces the whole URL.
    remote = example_compose(DB_HOST="box.lab", REDIS_HOST="box.lab", TOWERQ_REDIS_URL="rediss://:pw@box.lab:6380/0")
    environment = remote["services"]["worker"]["environment"]
    assert environment["TOWERQ_DATABASE_URL"] == "postgresql+psycopg://towerq:change-me-postgres@box.lab:5432/towerq"
    assert environment["TOWERQ_REDIS_URL"] == "rediss://:pw@box.lab:6380/0"
    assert ".env" in (REPO / ".gitignore").read_text().splitlines()


def test_state_lives_in_named_volumes_that_compose_down_keeps() -> None:
    compose = example_compose()
    assert set(compose["volumes"]) == {"pgdata", "towerq-data"}
    services = compose["services"]
    assert services["postgres"]["volumes"] == ["pgdata:/var/lib/postgresql/data"]
    for name in TOWERQ_SERVICES:
        assert services[name]["volumes"] == ["towerq-data:/data"], name


# -- the Dockerfile ------------------------------------------------------------------------


def test_the_dockerfile_builds_a_slim_api_image_and_a_cuda_worker_image() -> None:
    stages = dockerfile_stages()
    assert list(stages) == ["base", "build", "api", "worker"]
    assert stages["base"].base.startswith("python:3.11")
    for name in ("build", "api", "worker"):
        assert stages[name].base == "base"
    # The code is copied only where the wheel is built; the images install dependencies
    # from pyproject.toml first, then the wheel.
    copied = " ".join(stages["base"].of("COPY"))
    assert "service" not in copied and "worker" not in copied
    assert "constraints.txt" in copied
    # the worker image: the trainer's side and a notebook session's server (docs/notebooks.md)
    requirements = {
        "api": "python scripts/requirements.py server >",
        "worker": "python scripts/requirements.py gpu notebook >",
    }
    for name, install in requirements.items():
        instructions = stages[name].instructions
        kinds = [kind for kind, _ in instructions]
        at = next(i for i, (kind, arg) in enumerate(instructions) if kind == "RUN" and "requirements.py" in arg)
        assert instructions[at][1].startswith(install), name
        assert "pip install -c constraints.txt -r" in instructions[at][1], name  # the tested versions
        assert at < kinds.index("COPY"), f"{name}: dependencies after the code"
        assert stages[name].of("COPY") == ["--from=build /wheels /wheels"]
        assert stages[name].of("USER") == ["towerq"]
        assert kinds.index("USER") < kinds.index("CMD")
        parses_as_towerq(stages[name].exec_form("CMD"))
        parses_as_towerq(stages[name].exec_form("HEALTHCHECK"))
    assert "bubblewrap" in stages["worker"].of("RUN")[0]  # the trainers' sandbox
    assert "useradd --uid" in stages["base"].of("RUN")[0]


def test_the_api_image_requirements_carry_no_tensorflow() -> None:
    script = [sys.executable, str(REPO / "scripts" / "requirements.py")]
    api = subprocess.run([*script, "server"], capture_output=True, text=True, check=True).stdout.split()
    worker = subprocess.run([*script, "gpu"], capture_output=True, text=True, check=True).stdout.split()
    assert not [line for line in api if "tensorflow" in line or "keras" in line]
    assert any(line.startswith("tensorflow[and-cuda]") for line in worker)
    assert set(api) < set(worker)
    wrong = subprocess.run([*script, "cuda"], capture_output=True, text=True)
    assert wrong.returncode != 0 and "no extra cuda" in wrong.stderr


def test_the_build_context_holds_code_and_no_local_state() -> None:
    lines = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line[0] == "#"]
    assert lines[0] == "*"  # everything out, then only what the images need back in
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {
        "pyproject.toml",
        "constraints.txt",
        "README.md",
        "scripts/requirements.py",
        "service",
        "towerq",
        "worker",
        "migrations",
        "web",
    }


# -- the services' own commands, as processes --------------------------------------------


@dataclass
class ScramPostgres:
    """A PostgreSQL cluster of this test's own that checks passwords (scram-sha-256), unlike
    the trust-auth test server."""

    port: int
    password: str
    process: subprocess.Popen[bytes]
    root: Path


def _postgres_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4]))
    if not found:
        pytest.fail("no initdb under /usr/lib/postgresql: run scripts/setup-system --test")
    return Path(found[-1]).parent


def _as(owner: list[str], *command: str) -> None:
    done = subprocess.run([*owner, *command], capture_output=True, text=True)
    assert done.returncode == 0, f"{command[0]} failed: {done.stdout}{done.stderr}"


@contextlib.contextmanager
def running_scram_postgres() -> Iterator[ScramPostgres]:
    """The server runs as this process's child, not as `pg_ctl`'s daemon: it gets SIGINT (a
    fast shutdown) when this process dies, so a pytest worker killed outright, which runs
    no teardown, leaves no server behind."""
    # Not under pytest's folder: PostgreSQL runs as its own user, who cannot enter root's.
    root = Path(tempfile.mkdtemp(prefix="towerq-scram-postgres-"))
    as_owner: list[str] = []
    owner: dict[str, object] = {}
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        shutil.chown(root, "postgres")
        as_owner = ["runuser", "-u", "postgres", "--"]
        owner = {"user": "postgres", "group": "postgres", "extra_groups": []}
    password = "pg-Secret-42"
    pwfile = root / "pw"
    pwfile.write_text(password + "\n")
    pwfile.chmod(0o644)
    bin_dir = _postgres_bin()
    data = root / "data"
    port = free_port()
    initdb = [str(bin_dir / "initdb"), "-D", str(data), "-U", "towerq", "--auth=scram-sha-256", f"--pwfile={pwfile}"]
    _as(as_owner, *initdb, "-E", "UTF8", "--no-sync")
    server = [str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(root)]
    server += ["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"]
    with open(root / "log", "ab") as log:
        process = subprocess.Popen(
            server, stdout=log, stderr=subprocess.STDOUT, preexec_fn=dies_with_this_process(signal.SIGINT), **owner
        )
    url = f"postgresql://towerq:{password}@127.0.0.1:{port}/postgres"
    try:
        admin = wait_for(lambda: _connect(url, process, root / "log"), 30, "the scram PostgreSQL server")
        with admin:
            admin.execute("CREATE DATABASE towerq")
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(url.replace(password, "wrong"))
        yield ScramPostgres(port, password, process, root)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(root, ignore_errors=True)


def _connect(url: str, process: subprocess.Popen[bytes], log: Path) -> psycopg.Connection | None:
    """A connection once the server answers; None while it starts."""
    assert process.poll() is None, f"PostgreSQL exited: {log.read_text()}"
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=2)
    except psycopg.OperationalError:
        return None


def test_a_killed_test_process_leaves_no_scram_postgres_behind() -> None:
    """The server was `pg_ctl`'s daemon: a pytest worker killed outright, which runs no
    teardown, left it running for good."""
    script = (
        "import time\nfrom tests.test_deployment import running_scram_postgres\n"
        "with running_scram_postgres() as server:\n"
        "    print(server.process.pid, server.root, flush=True)\n    time.sleep(600)\n"
    )
    _, root = ends_with_its_killed_starter(script, what="the scram PostgreSQL server")
    shutil.rmtree(root, ignore_errors=True)  # its teardown did not run


@pytest.fixture(scope="module")
def scram_postgres() -> Iterator[ScramPostgres]:
    with running_scram_postgres() as server:
        yield server


@dataclass
class TlsRedis:
    url: str
    password: str
    process: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    """Redis over TLS only (a self-signed certificate), with a password."""
    root = tmp_path_factory.mktemp("tls-redis")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(root / "key.pem"), "-out", str(root / "cert.pem")],
        check=True,
        capture_output=True,
    )
    password = "redisSecret7"
    config = root / "redis.conf"
    config.write_text(f'requirepass "{password}"\n')
    port = free_port()
    process = subprocess.Popen(
        [redis_binary(), str(config), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1"]
        + ["--tls-cert-file", str(root / "cert.pem"), "--tls-key-file", str(root / "key.pem")]
        + ["--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        preexec_fn=dies_with_this_process(signal.SIGTERM),  # a killed pytest worker runs no teardown
    )
    url = f"rediss://:{password}@127.0.0.1:{port}/0?ssl_ca_certs={root / 'cert.pem'}"
    try:
        yield TlsRedis(url, password, process)
    finally:
        process.terminate()
        process.wait(10)


class ComposeProcesses:
    """The towerq services of docker-compose.yml as processes of this machine: each with its
    own command and the compose environment, plus what the image's ENV sets, pointed at the
    test's folder."""

    def __init__(self, compose: dict, workdir: Path, api_port: int) -> None:
        self.services = compose["services"]
        self.workdir = workdir
        image_env: dict[str, str] = {}
        for line in dockerfile_stages()["base"].of("ENV"):
            for pair in line.split():
                key, _, value = pair.partition("=")
                image_env[key] = value.replace("/data", str(workdir / "data"))
        base = {key: value for key, value in os.environ.items() if not key.startswith("TOWERQ_")}
        self.base_env = {**base, **image_env, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
        self.api_port = api_port
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def environment(self, service: str, **overrides: str) -> dict[str, str]:
        env = {**self.base_env, **self.services[service]["environment"], **overrides}
        env["TOWERQ_API_PORT"] = str(self.api_port)  # the container's 8000, on a free port here
        return env

    def argv(self, command: list[str]) -> list[str]:
        return [str(Path(sys.executable).parent / command[0]), *command[1:]]

    def run(self, service: str, command: list[str] | None = None, **overrides: str) -> subprocess.CompletedProcess:
        argv = self.argv(command or self.services[service]["command"])
        env = self.environment(service, **overrides)
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=self.workdir)

    def start(self, service: str, **overrides: str) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{service}.log").open("wb")
        process = subprocess.Popen(
            self.argv(self.services[service]["command"]),
            env=self.environment(service, **overrides),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
        )
        self.running[service] = process
        return process

    def log(self, service: str) -> str:
        return (self.workdir / f"{service}.log").read_text(errors="replace")

    def stop(self, service: str) -> tuple[int, float]:
        """SIGTERM, as `docker compose stop` sends it; the exit code and how long it took."""
        process = self.running.pop(service)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(seconds(self.services[service]["stop_grace_period"]))
        return code, time.monotonic() - started

    def kill_all(self) -> None:
        for process in self.running.values():
            process.kill()
            process.wait()


@pytest.mark.slow
@pytest.mark.postgres
def test_the_compose_services_run_a_job_against_password_protected_postgres_and_tls_redis(
    tmp_path: Path, scram_postgres: ScramPostgres, tls_redis: TlsRedis
) -> None:
    values, _ = read_env_file()
    env_file = {
        **values,
        "POSTGRES_PASSWORD": scram_postgres.password,
        "REDIS_PASSWORD": tls_redis.password,
        "DB_HOST": "127.0.0.1",
        "DB_PORT": str(scram_postgres.port),
        "TOWERQ_REDIS_URL": tls_redis.url,
        "TOWERQ_HOST_NAME": "compose-gpu",
        "TOWERQ_PUBLIC_URL": "https://lab.example/towerq",
        "TOWERQ_ROOT_PATH": "/towerq",
    }
    port = free_port()
    services = ComposeProcesses(load_compose(env_file), tmp_path, port)

    # Before the migrations, a service refuses to start, saying why.
    early = services.run("scheduler")
    assert early.returncode == 1 and "run `towerq db upgrade` first" in early.stderr, early.stderr
    # A wrong password is a one-line error that does not print the password.
    wrong = services.run(
        "migrate",
        TOWERQ_DATABASE_URL=services.services["migrate"]["environment"]["TOWERQ_DATABASE_URL"].replace(
            scram_postgres.password, "not-it"
        ),
    )
    assert wrong.returncode == 1 and "password authentication failed" in wrong.stderr, wrong.stderr
    assert "Traceback" not in wrong.stderr and "not-it" not in wrong.stderr and "towerq:***@" in wrong.stderr

    migrated = services.run("migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert scram_postgres.password not in migrated.stdout and "towerq:***@127.0.0.1" in migrated.stdout

    first = services.run("bootstrap")
    assert first.returncode == 0, first.stderr
    login = next(line for line in first.stdout.splitlines() if "log in:" in line)
    token = login.split("#token=")[1].strip()
    assert login.split()[-1] == f"https://lab.example/towerq/#token={token}"
    again = services.run("bootstrap")
    assert again.returncode == 0 and "nothing to do" in again.stdout and token not in again.stdout

    # As compose runs it, the worker needs a real GPU: on this machine that is an error.
    no_gpu = services.run("worker")
    assert no_gpu.returncode == 1, no_gpu.stderr
    assert "TOWERQ_REQUIRE_GPUS is set but" in no_gpu.stderr and "Traceback" not in no_gpu.stderr

    api = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"})
    try:
        services.start("api")
        services.start("scheduler")
        services.start("worker", TOWERQ_REQUIRE_GPUS="false", TOWERQ_SIMULATED_GPUS="1")
        health = services.services["api"]["healthcheck"]["test"][1:]
        wait_for(lambda: services.run("api", health).returncode == 0, 60, "the API healthcheck", 0.5)
        assert "status=ok database=ok redis=ok" in services.run("api", health).stdout

        assert '<script type="module" src="app.js">' in api.get("/").text
        submitted = api.post("/api/jobs", json=SPEC)
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]
        job = wait_for(lambda: (j := api.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 180, "the job", 1)
        assert job["state"] == "succeeded", job["error"]
        assert job["allocation"]["host"] == "compose-gpu"
        # Behind the HTTPS proxy (X-Forwarded-Proto from a trusted address), the login cookie
        # is Secure and scoped to the proxy's path.
        cookie = api.post("/api/session", headers={"X-Forwarded-Proto": "https"}).headers["set-cookie"]
        assert "Secure" in cookie and "Path=/towerq/" in cookie and "HttpOnly" in cookie
        assert "Secure" not in api.post("/api/session").headers["set-cookie"]

        worker_health = services.services["worker"]["healthcheck"]["test"][1:]
        checked = services.run("worker", worker_health)
        assert checked.returncode == 0 and "worker compose-gpu: last heartbeat" in checked.stdout, checked.stdout

        for name in ("worker", "scheduler", "api"):
            code, took = services.stop(name)
            assert code == 0, f"{name} exited {code}:\n{services.log(name)[-3000:]}"
        # A stopped worker's host is no longer healthy once its heartbeat is old.
        stale = services.run("worker", worker_health, TOWERQ_HEARTBEAT_TIMEOUT_S="0.01")
        assert stale.returncode == 1 and "over 0.01s" in stale.stdout
    finally:
        api.close()
        services.kill_all()
    for name in ("api", "scheduler", "worker"):
        assert tls_redis.password not in services.log(name), name


def test_the_compose_redis_entrypoint_keeps_its_password_off_the_command_line(tmp_path: Path) -> None:
    """The redis service's own entrypoint and healthcheck, run with this machine's redis-server."""
    redis = example_compose()["services"]["redis"]
    sh, flag, script = redis["entrypoint"]
    port = free_port()
    script = script.replace("/tmp/redis.conf", str(tmp_path / "redis.conf")) + f" --port {port} --dir {tmp_path}"
    env = {
        **os.environ,
        "REDIS_PASSWORD": "redis-Pass-9",
        "PATH": f"{Path(redis_binary()).parent}:{os.environ['PATH']}",
    }
    process = subprocess.Popen([sh, flag, script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        url = f"redis://:redis-Pass-9@127.0.0.1:{port}/0"
        wait_for(lambda: answers(url), 10, "the compose redis")
        with pytest.raises(RedisUnavailableError, match="refuses towerq's password"):
            answers(f"redis://:wrong@127.0.0.1:{port}/0")
        assert "redis-Pass-9" not in Path(f"/proc/{process.pid}/cmdline").read_text()  # exec'd: redis is the pid
        healthcheck = redis["healthcheck"]["test"][1].replace("redis-cli", f"redis-cli -p {port}")
        if shutil.which("redis-cli"):
            assert subprocess.run(["sh", "-c", healthcheck], env=env).returncode == 0
            bad = {**env, "REDIS_PASSWORD": "wrong"}
            assert subprocess.run(["sh", "-c", healthcheck], env=bad, capture_output=True).returncode != 0
        assert oct((tmp_path / "redis.conf").stat().st_mode & 0o777) == "0o600"
    finally:
        process.terminate()
        process.wait(10)


# -- the wheel -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_non_editable_wheel_serves_the_dashboard_migrates_and_runs_a_job(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("towerq-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        capture_output=True,
    )
    # The dependencies (TensorFlow included) come from this suite's environment: a plain path
    # line, so its editable towerq is not activated (that needs its .pth files processed).
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    workdir = tmp_path / "lab"
    workdir.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith("TOWERQ_") and key != "PYTHONPATH"}
    where = subprocess.run(
        [
            python,
            "-c",
            "import service, migrations; from service.api.app import dashboard_dir; "
            "print(service.__file__); print(migrations.__file__); print(dashboard_dir())",
        ],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert all(path.startswith(str(site)) for path in where), where
    assert (Path(where[2]) / "index.html").is_file() and (Path(where[2]) / "vendor/uplot/uPlot.esm.js").is_file()

    towerq = str(venv / "bin" / "towerq")
    var = workdir / "var"
    env.update(TOWERQ_DATABASE_URL=f"sqlite:///{var / 'towerq.db'}", TOWERQ_VAR_DIR=str(var))
    upgraded = subprocess.run([towerq, "db", "upgrade"], env=env, cwd=workdir, capture_output=True, text=True)
    assert upgraded.returncode == 0 and "is up to date" in upgraded.stdout, upgraded.stderr
    bootstrap = [towerq, "admin", "bootstrap", "--token-file", str(var / "admin-token")]
    made = subprocess.run(bootstrap, env=env, cwd=workdir, capture_output=True, text=True)
    assert made.returncode == 0 and "log in:" in made.stdout, made.stderr
    token = (var / "admin-token").read_text().strip()

    port = free_port()
    up = Up(workdir, port, free_port(), command=[towerq, "up", "--port", str(port)], pythonpath=False, base_env=env)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"})
    try:
        up.wait_for_line(rf"log in:\s+http://\S+/#token={token}", 120)  # the bootstrap's saved token
        page = client.get("/")
        assert page.status_code == 200 and '<script type="module" src="app.js">' in page.text
        assert client.get("/pages/job.js").status_code == 200
        submitted = client.post("/api/jobs", json=SPEC)
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]
        job = wait_for(
            lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 180, "the job", 1
        )
        assert job["state"] == "succeeded", job["error"]
        assert up.ctrl_c() == 0
        assert processes_in_session(up.process.pid) == []
    finally:
        client.close()
        up.kill()


def test_the_dashboard_uses_relative_addresses_so_it_works_under_a_proxy_path() -> None:
    """Behind a proxy serving towerq at https://lab.example/towerq/, an absolute `/api/...`
    or `/app.js` would leave the prefix: every address in the dashboard is relative."""
    web = REPO / "web"
    for path in [web / "index.html", *web.glob("*.js"), *web.glob("pages/*.js")]:
        text = path.read_text()
        for absolute in ('"/api', "`/api", 'from "/', 'import("/', 'href="/', 'src="/'):
            assert absolute not in text, f"{path.relative_to(REPO)}: {absolute}"
