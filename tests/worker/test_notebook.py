"""A notebook session's folders: where they are, and the member's folder's quota
(worker.notebook.HomeQuota)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.core.settings import Settings
from worker.notebook import OVER_QUOTA_SLACK_BYTES, HomeQuota, home_folder, session_folder


def test_a_sessions_folders_are_absolute_where_the_lab_names_relative_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`towerq up` names var/ and var/artifacts relative to where it runs; bwrap binds from
    another working folder, so every session there failed ("Can't find source path")."""
    monkeypatch.chdir(tmp_path)
    settings = Settings(var_dir=Path("var"), artifacts_dir=Path("var/artifacts"))
    assert home_folder(settings, 1) == tmp_path / "var" / "artifacts" / "homes" / "user-1"
    assert session_folder(settings, 2, 1) == tmp_path / "var" / "sessions" / "job-2-1"


def test_a_folder_under_its_quota_may_grow_up_to_it_and_no_further() -> None:
    quota = HomeQuota(1_000_000)
    assert quota.judge(200_000) == (None, None)
    assert quota.judge(1_000_000) == (None, None)
    warning, stop = quota.judge(1_000_001)
    assert warning is None and stop is not None
    assert stop.startswith("your notebook folder grew to 1.0 MB, over its 1.0 MB") and "allows" not in stop


def test_a_folder_over_its_quota_at_the_start_may_shrink_and_keep_jupyters_own_state_but_not_grow() -> None:
    """The CI failure this came from: a session opened over quota was stopped as its kernel and
    JupyterLab wrote their few kB into $HOME, before the member could delete anything."""
    quota = HomeQuota(1_000_000)
    warning, stop = quota.judge(3_000_000)
    assert stop is None and warning == "your notebook folder holds 3.0 MB, over its 1.0 MB: delete some"
    assert quota.judge(3_000_000 + 64_000) == (None, None)  # history, signatures, a new folder
    _, stop = quota.judge(3_000_000 + OVER_QUOTA_SLACK_BYTES + 1)
    assert stop is not None and "over its 1.0 MB and past the 4.0 MB this session allows" in stop


def test_what_a_member_over_quota_deleted_may_not_be_added_again_past_the_quota() -> None:
    quota = HomeQuota(1_000_000)
    quota.judge(3_000_000)
    assert quota.judge(2_000_000) == (None, None)  # deleted 1 MB
    _, stop = quota.judge(3_000_001 + OVER_QUOTA_SLACK_BYTES // 2)
    assert stop is not None and "past the 3.0 MB this session allows" in stop
    fresh = HomeQuota(1_000_000)
    fresh.judge(3_000_000)
    assert fresh.judge(100_000) == (None, None)  # deleted nearly all: the quota (and the slack) hold again
    assert fresh.judge(1_000_000) == (None, None)
    assert fresh.judge(1_100_001)[1] is not None


def test_no_quota_is_no_limit() -> None:
    quota = HomeQuota(0)
    assert quota.judge(10**12) == (None, None)
    assert quota.judge(10**13) == (None, None)
