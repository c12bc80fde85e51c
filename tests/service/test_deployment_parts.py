"""The pieces a deployment leans on: the first admin made once however many start at once,
secrets kept out of what towerq prints, an embedded Redis with a password, a GPU host that
refuses to fall back to the CPU, and services that refuse an unmigrated database."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from sqlalchemy import func, select

from service.cli.redis_server import EmbeddedRedis, RedisUnavailableError, answers
from service.core.db import Database, SchemaError, require_schema
from service.core.models import ApiToken
from service.core.settings import Settings, redacted
from service.lab.auth import bootstrap_admin, create_token
from tests.conftest import free_port
from worker.inventory import NoGpusError, detect, open_nvml


def test_the_first_admin_is_made_once_even_by_bootstraps_racing(db: Database) -> None:
    secrets: list[str | None] = []
    barrier = threading.Barrier(4)

    def bootstrap() -> None:
        barrier.wait()
        with db.write() as session:
            secrets.append(bootstrap_admin(session))

    threads = [threading.Thread(target=bootstrap) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len([s for s in secrets if s is not None]) == 1, secrets
    with db.read() as session:
        assert session.scalar(select(func.count(ApiToken.id))) == 1
    with db.write() as session:  # and ever after, a no-op
        assert bootstrap_admin(session) is None


def test_a_plain_user_token_does_not_stop_the_bootstrap(db: Database) -> None:
    with db.write() as session:
        create_token(session, "alice")
    with db.write() as session:
        assert bootstrap_admin(session, "root") is not None


def test_passwords_are_redacted_from_urls_towerq_prints() -> None:
    assert (
        redacted("postgresql+psycopg://towerq:s3cret@db:5432/towerq")
        == "postgresql+psycopg://towerq:***@db:5432/towerq"
    )
    assert redacted("redis://:pw@redis:6379/0") == "redis://:***@redis:6379/0"
    assert (
        redacted("rediss://u:pw@[::1]:6380/0?ssl_ca_certs=/ca.pem")
        == "rediss://u:***@[::1]:6380/0?ssl_ca_certs=/ca.pem"
    )
    assert redacted("sqlite:///./var/towerq.db") == "sqlite:///./var/towerq.db"
    assert redacted("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_an_embedded_redis_takes_the_password_of_its_url(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://:pa%22ss@127.0.0.1:{port}/0"  # a quote in it, URL-encoded
    redis = EmbeddedRedis(url, tmp_path)
    redis.start()
    try:
        assert answers(url)
        with pytest.raises(RedisUnavailableError, match="wants a password: put it in TOWERQ_REDIS_URL"):
            answers(f"redis://127.0.0.1:{port}/0")
        with pytest.raises(RedisUnavailableError, match=r"redis://:\*\*\*@.* refuses towerq's password"):
            answers(f"redis://:wrong@127.0.0.1:{port}/0")
        assert redis.process is not None
        assert 'pa"ss' not in Path(f"/proc/{redis.process.pid}/cmdline").read_text()
        assert (tmp_path / "redis.conf").stat().st_mode & 0o777 == 0o600
    finally:
        redis.stop()


def test_towerq_starts_no_redis_it_cannot_be_sure_of(tmp_path: Path) -> None:
    with pytest.raises(RedisUnavailableError, match=r"rediss://:\*\*\*@127.0.0.1.* plain redis://"):
        EmbeddedRedis("rediss://:pw@127.0.0.1:6390/0", tmp_path)
    with pytest.raises(RedisUnavailableError, match="a remote Redis cannot be started here"):
        EmbeddedRedis("redis://redis.lab:6379/0", tmp_path)


def test_a_gpu_host_without_a_driver_is_an_error_not_simulated_gpus() -> None:
    nvml, why = open_nvml()
    if nvml is None:  # this machine and CI: no NVIDIA driver
        with pytest.raises(NoGpusError, match=re.escape(f"TOWERQ_REQUIRE_GPUS is set but {why}")):
            detect("gpu-1", None, require_gpus=True)
        assert detect("gpu-1", None).simulated  # without the setting: simulated, as before
    else:
        nvml.nvmlShutdown()
        inventory = detect("gpu-1", None, require_gpus=True)
        assert not inventory.simulated
        inventory.close()
    with pytest.raises(NoGpusError, match="both set"):
        detect("gpu-1", 2, require_gpus=True)


def test_services_refuse_a_database_that_is_not_migrated(tmp_path: Path, sqlite_url: str) -> None:
    require_schema(sqlite_url)  # migrated: fine
    with pytest.raises(SchemaError, match="no towerq schema yet: run `towerq db upgrade` first"):
        require_schema(f"sqlite:///{tmp_path / 'empty.db'}")


def test_the_root_path_setting_is_a_path_prefix() -> None:
    assert Settings(root_path="/towerq").root_path == "/towerq"
    assert Settings(root_path="").root_path == ""
    for bad in ("towerq", "/towerq/", "/a b"):
        with pytest.raises(ValueError, match="root_path"):
            Settings(root_path=bad)
