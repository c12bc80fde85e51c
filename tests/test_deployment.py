"""The lab deployment (docker-compose.yml, Dockerfile, the wheel), tested without a container
engine: the files parsed as Docker reads them, and a non-editable wheel installed into a
fresh virtual environment (the services' own commands, run as processes with the compose
environment: tests/test_compose_services.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import httpx
import pytest

from service.cli.command import parser as towerq_parser
from service.core.settings import Settings
from tests.compose import (
    COMPOSE,
    ONE_SHOTS,
    SPEC,
    TOWERQ_SERVICES,
    InterpolationError,
    dockerfile_stages,
    example_compose,
    load_compose,
    read_env_file,
    seconds,
    variables,
)
from tests.conftest import free_port
from tests.stack import REPO, wait_for
from tests.test_up import FINAL, Up, processes_in_session


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
