"""A folder's packing (`towerq.bundle`, what `towerq run`, `towerq submit --code` and
`Client.send_code` send): what .gitignore and .towerqignore leave out, links said, the id
the API gives the same files, and a folder over the bundle limit refused before it is sent."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from towerq import bundle
from towerq.cli import notebook, run
from towerq.cli.main import client_parser
from towerq.cli.session import UsageError, parse_command_line, read_spec


def project(root: Path, files: dict[str, bytes]) -> Path:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    return root


def test_ignore_files_leave_out_what_they_name_and_negations_bring_back(tmp_path: Path) -> None:
    folder = project(
        tmp_path,
        {
            ".gitignore": b"*.log\nbuild/\n/top.txt\n!keep.log\n",
            "src/.towerqignore": b"fixtures/\n",
            "train.py": b"print(1)",
            "run.log": b"x",
            "keep.log": b"x",
            "top.txt": b"x",
            "src/top.txt": b"anchored patterns match at their own folder only",
            "build/out.bin": b"x",
            "src/fixtures/a.npz": b"x",
            "src/model.py": b"y",
            ".venv/pyvenv.cfg": b"",
            ".git/HEAD": b"",
        },
    )
    (folder / "elsewhere.py").symlink_to("/etc/passwd")
    packed = bundle.pack(folder)
    paths = {entry["path"] for entry in packed.entries}
    assert paths == {".gitignore", "src/.towerqignore", "train.py", "keep.log", "src/top.txt", "src/model.py"}
    assert set(packed.left_out) == {"run.log", "top.txt", "build/", "src/fixtures/", "elsewhere.py (a link)"}


def test_the_same_files_get_the_same_id_however_packed(tmp_path: Path) -> None:
    first = bundle.pack(project(tmp_path / "a", {"train.py": b"print(1)", "lib/x.py": b"x"}))
    second = bundle.pack(project(tmp_path / "b", {"lib/x.py": b"x", "train.py": b"print(1)"}))
    assert first.id == second.id and first.data != b""
    assert bundle.pack(project(tmp_path / "c", {"train.py": b"print(2)", "lib/x.py": b"x"})).id != first.id


def test_a_folder_over_the_limit_is_refused_naming_its_biggest_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bundle, "BUNDLE_LIMIT_BYTES", 1000)
    folder = project(tmp_path, {"train.py": b"x" * 10, "weights.bin": b"\0" * 5000, "data.npz": b"\0" * 800})
    with pytest.raises(bundle.FolderError) as refused:
        bundle.packed_folder(folder)  # refused before the API is asked
    said = str(refused.value)
    assert "weights.bin (0.0 MB)" in said and said.index("weights.bin") < said.index("data.npz"), said
    assert ".towerqignore" in said


def test_run_spec_takes_the_command_after_the_dashes_and_the_options() -> None:
    args = argparse.Namespace(
        program=["--", "python", "train.py", "--lr", "0.1"], env=["SEED=3"], gpus=2, gpu_ids=None, host=None,
        fraction=None, name=None, priority=None, time_limit=60, dataset=None, resumable=True, group=None, per_gpu=True,
        network=True, min_gpus=1, signal="USR1@90", after="12, sweep:3", after_any=True,
    )  # fmt: skip
    spec = run.run_spec(args, "c" * 64)
    assert spec == {
        "command": ["python", "train.py", "--lr", "0.1"],
        "code": "c" * 64,
        "env": {"SEED": "3"},
        "gpu_count": 2,
        "time_limit_s": 60,
        "resumable": True,
        "min_gpu_count": 1,
        "network": True,
        "processes": "per_gpu",
        "signal": "USR1@90",
        "after": [12, "sweep:3"],
        "after_condition": "afterany",
    }
    args.after = None
    with pytest.raises(UsageError, match="--after-any needs --after"):
        run.run_spec(args, "c" * 64)
    args.env = ["NOEQUALS"]
    with pytest.raises(UsageError, match="NAME=VALUE"):
        run.run_spec(args, "c" * 64)


def test_notebook_spec_takes_its_code_bundle_and_env_and_a_bad_env_is_refused_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    args = parse_command_line(
        client_parser(), ["notebook", "--gpus", "2", "--code", "lib", "--env", "PYTHONPATH=/code/src"]
    )
    assert notebook.notebook_spec(args, "c" * 64) == {
        "kind": "notebook", "gpu_count": 2, "code": "c" * 64, "env": {"PYTHONPATH": "/code/src"}
    }  # fmt: skip
    assert notebook.notebook_spec(parse_command_line(client_parser(), ["notebook"])) == {"kind": "notebook"}
    bad = parse_command_line(client_parser(), ["notebook", "--env", "NOEQUALS", "--code", str(tmp_path / "missing")])
    with pytest.raises(UsageError, match="--env 'NOEQUALS': write NAME=VALUE"):
        notebook.run_notebook(bad)


def test_the_memory_fraction_is_asked_by_its_short_name_or_the_specs() -> None:
    parser = argparse.ArgumentParser()
    run.add_placement_options(parser)
    for option in ("--fraction", "--gpu-memory-fraction"):
        assert run.placement_fields(parser.parse_args([option, "0.5"]))["gpu_memory_fraction"] == 0.5


def test_an_option_a_command_does_not_take_is_refused_by_that_command_naming_the_nearest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Not the top parser's "usage: towerq [-h] COMMAND" for `towerq run --memory-fraction`."""
    from service.cli.command import parser

    for argv, said in (
        (["run", "--memory-fraction", "0.5", "--", "python", "x.py"], "(did you mean --gpu-memory-fraction?)"),
        (["jobs", "--bogus"], "unrecognized arguments: --bogus\n"),
        (["token", "list", "--tokn", "x"], "(did you mean --token?)"),
    ):
        with pytest.raises(SystemExit) as exited:
            parse_command_line(parser(), argv)
        err = capsys.readouterr().err
        command = " ".join(word for word in argv[:2] if not word.startswith("-"))
        assert exited.value.code == 2 and f"usage: towerq {command}" in err and said in err, err
    args = parse_command_line(parser(), ["run", "--gpus", "2", "--", "python", "x.py", "--weird"])
    assert args.program[-1] == "--weird", "what follows -- is the program's"


def test_durations_are_written_as_people_write_them(capsys: pytest.CaptureFixture[str]) -> None:
    """`--time-limit 2h` and Slurm's `2-12:00:00`, not only seconds (a number alone still is)."""
    parser = argparse.ArgumentParser()
    run.add_placement_options(parser)
    for text, seconds in (
        ("5400", 5400), ("90m", 5400), ("1h30m", 5400), ("1.5h", 5400), ("1:30:00", 5400), ("2d", 172800),
        ("2-12:00:00", 216000), ("1w", 604800), (" 45S ", 45), ("1h 30m", 5400),
    ):  # fmt: skip
        assert parser.parse_args(["--time-limit", text]).time_limit == seconds, text
    for text in ("5x", "1:30", "1:75:00", "h", "0", "0.2s", "-5", ""):
        with pytest.raises(SystemExit):
            parser.parse_args(["--time-limit", text])
        assert f"{text!r} is no duration" in capsys.readouterr().err, text


def test_ages_are_units_and_never_read_a_date_or_a_time_of_day_as_one() -> None:
    from datetime import UTC, datetime

    from towerq.cli.reports import when_from

    ago = datetime.now(UTC) - datetime.fromisoformat(when_from("1h30m", "--since"))
    assert 5395 < ago.total_seconds() < 5405
    assert when_from("20261123", "--since").startswith("2026-11-23T00:00:00")
    with pytest.raises(UsageError, match="an age"):
        when_from("12:00:00", "--since")


def test_a_begin_is_a_time_of_day_an_offset_or_an_iso_time() -> None:
    """`--begin` (and a reservation's `--start`/`--end`) as `sbatch --begin` takes it: a time
    of day is its next one, local (later today, else tomorrow)."""
    from datetime import UTC, datetime, timedelta

    from towerq.cli.session import moment

    base = datetime(2026, 12, 6, 20, 30, tzinfo=UTC).astimezone()  # 20:30 local, whatever the zone
    assert moment("22:00", "--begin", base) == base.replace(hour=22, minute=0)
    assert moment("08:15:30", "--begin", base) == base.replace(hour=8, minute=15, second=30) + timedelta(days=1)
    assert moment("20:30", "--begin", base) == base + timedelta(days=1)  # now is not its next one
    assert moment("+2h", "--begin", base) == moment("2h", "--begin", base) == base + timedelta(hours=2)
    assert moment("now", "--begin", base) == base
    assert moment("2026-12-07T09:00+00:00", "--begin") == datetime(2026, 12, 7, 9, tzinfo=UTC)
    for bad in ("25:00", "22:60", "tomorrow", "9"):
        with pytest.raises(UsageError, match="give a time of day \\(22:00\\), \\+2h / \\+1d, now, or an ISO time"):
            moment(bad, "--begin", base)


def test_a_spec_file_that_does_not_parse_is_said_on_one_line_with_where(tmp_path: Path) -> None:
    for text, said in (
        ("model: mlp\n  dataset: digits\n", "spec.yaml:2:10: mapping values are not allowed here"),
        ('{"model": "mlp",, "steps": 1}', "spec.yaml:1:17: expected the node content, but found ','"),
    ):
        (tmp_path / "spec.yaml").write_text(text)
        with pytest.raises(UsageError) as refused:
            read_spec(str(tmp_path / "spec.yaml"))
        message = str(refused.value)
        assert "\n" not in message and message.startswith("the spec is neither YAML nor JSON: "), message
        assert said in message.replace(str(tmp_path) + "/", ""), message
