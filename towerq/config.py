"""Where the client finds the API and its token: arguments, the environment, the file
`towerq login` writes."""

from __future__ import annotations

import json
import os
import tomllib
import uuid
from dataclasses import dataclass
from pathlib import Path

from towerq.contract.api import DEFAULT_URL


def config_folder() -> Path:
    """`$XDG_CONFIG_HOME/towerq` (an absolute `XDG_CONFIG_HOME`, as the XDG base directory
    specification says), else `~/.config/towerq`."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".config") / "towerq"


def config_file() -> Path:
    """The file `towerq login` writes: `config.toml` in `config_folder()`."""
    return config_folder() / "config.toml"


@dataclass(frozen=True)
class Config:
    """Where the API is and the token to use: arguments first, then `TOWERQ_API_URL` /
    `TOWERQ_TOKEN`, then `config.toml` in `$XDG_CONFIG_HOME/towerq` or `~/.config/towerq`
    (written by `towerq login`), then a
    local `towerq up`'s `var/admin-token`."""

    url: str
    token: str | None

    @classmethod
    def load(cls, url: str | None = None, token: str | None = None, path: Path | None = None) -> Config:
        saved = read_config(path or config_file())
        url = url or os.environ.get("TOWERQ_API_URL") or saved.get("url") or DEFAULT_URL
        token = (
            token
            or os.environ.get("TOWERQ_TOKEN")
            or saved.get("token")
            or _read(config_folder() / "token")  # written by older versions
            or _read(Path(os.environ.get("TOWERQ_VAR_DIR", "var")) / "admin-token")
        )
        return cls(url=url.rstrip("/"), token=token)


def read_config(path: Path) -> dict[str, str]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    section = data.get("default", data)
    return {key: str(value) for key, value in section.items() if key in ("url", "token")}


def write_config(url: str, token: str, path: Path | None = None) -> Path:
    """Save the URL and token for later commands, readable by their owner alone."""
    path = path or config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"[default]\nurl = {json.dumps(url)}\ntoken = {json.dumps(token)}\n")
    os.replace(temporary, path)
    return path


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None
