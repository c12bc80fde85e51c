"""Token files are owner-only from their first byte, and replaced whole."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from service.core.tokenfile import write_secret


def test_a_token_file_is_0600_before_the_secret_is_written_even_with_an_open_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modes: list[int] = []
    real_write = os.write

    def spy(fd: int, data: bytes) -> int:
        modes.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", spy)
    old = os.umask(0)
    try:
        write_secret(tmp_path / "var" / "admin-token", "tq_secret")
    finally:
        os.umask(old)
    assert modes and set(modes) == {0o600}
    path = tmp_path / "var" / "admin-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == "tq_secret\n"


def test_a_token_file_is_replaced_whole_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("old\n")
    path.chmod(0o644)
    write_secret(path, "tq_new")
    assert path.read_text() == "tq_new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["token"]
