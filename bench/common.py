"""What the benchmarks share: a towerq stack's settings in a temporary folder of its own."""

from __future__ import annotations

from pathlib import Path

from service.core.settings import Settings


def settings_in(workdir: Path, database_url: str, redis_url: str, **overrides: object) -> Settings:
    """Settings for a stack whose folders all live under `workdir`."""
    folders = {name: workdir / name for name in ("var", "data", "artifacts", "models", "code")}
    return Settings(
        database_url=database_url,
        redis_url=redis_url,
        var_dir=folders["var"],
        data_dir=folders["data"],
        artifacts_dir=folders["artifacts"],
        models_path=folders["models"],
        code_dir=folders["code"],
        **overrides,  # type: ignore[arg-type]
    )
