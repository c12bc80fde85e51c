"""The compose file's services run as processes, without a container engine: each one's own
command with the environment compose would give it, against a password-protected PostgreSQL
and a TLS Redis with a password (tests/test_deployment.py reads the files themselves)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest

from service.cli.redis_server import RedisUnavailableError, answers, redis_binary
from service.core.lifetime import dies_with_this_process
from tests.compose import (
    SPEC,
    dockerfile_stages,
    example_compose,
    load_compose,
    read_env_file,
    seconds,
)
from tests.conftest import free_port
from tests.stack import ends_with_its_killed_starter, wait_for
from tests.test_up import FINAL


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
        "import time\nfrom tests.test_compose_services import running_scram_postgres\n"
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
