"""Token files (`var/admin-token`, the CLI's saved token): owner-only from the first byte."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_secret(path: Path, secret: str) -> None:
    """Write a token file readable by its owner alone from its first byte: a temporary file
    created 0600 beside it, then renamed over it (never a moment with looser rights, never
    a half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            data = (secret.strip() + "\n").encode()
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
