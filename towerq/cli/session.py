"""The client commands' common ground: their errors, the API as the CLI sees it
(`towerq.Client` with the options' URL and token), a job spec from a file, progress lines."""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from towerq.bundle import human_bytes
from towerq.cli.plain import rewrite_line
from towerq.client import AuthError, Client
from towerq.contract.spec import Priority, set_dotted


class ClientError(Exception):
    """Something a client command could not do; the message is for people (exit code 1)."""


class UsageError(ClientError):
    """The command line or its input is wrong (exit code 2)."""


def parse_command_line(top: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`top.parse_args(argv)`, but an option the command does not take is refused by the
    command's own parser (its usage, not the top one's), naming its nearest option:
    `towerq run --memory-fraction 0.5` -> "did you mean --gpu-memory-fraction?"."""
    args, extra = top.parse_known_args(argv)
    if not extra:
        return args
    command = chosen_command(top, args)
    options = [o for action in command._actions for o in action.option_strings if o.startswith("--")]
    near = [
        m
        for word in extra
        if word.startswith("--")
        for m in difflib.get_close_matches(word.split("=")[0], options, 1, 0.75)
    ]
    hint = f" (did you mean {' or '.join(dict.fromkeys(near))}?)" if near else ""
    command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


def chosen_command(top: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the command `args` were parsed for (`towerq token create`'s, say)."""
    parser = top
    while True:
        chosen = [
            action.choices[getattr(args, action.dest)]
            for action in parser._actions
            if isinstance(action, argparse._SubParsersAction) and getattr(args, action.dest, None) in action.choices
        ]
        if not chosen:
            return parser
        parser = chosen[0]


def connection_options(parser: argparse.ArgumentParser) -> None:
    """`--api` and `--token`, which every client command takes."""
    parser.add_argument("--api", default=None, help="API URL (default TOWERQ_API_URL)")
    parser.add_argument("--token", default=None, help="API token (default TOWERQ_TOKEN or `towerq login`)")


def output_option(parser: argparse.ArgumentParser) -> None:
    """`-o table|json`, which every command that reads something takes."""
    parser.add_argument(
        "-o", "--output", dest="output_format", choices=("table", "json"), default="table",
        help="json: the API's answer, for scripts",
    )  # fmt: skip


def user_options(parser: argparse.ArgumentParser) -> None:
    """`--user NAME` or `--mine` (`--me`, as `squeue --me`): whose jobs a listing shows."""
    whose = parser.add_mutually_exclusive_group()
    whose.add_argument("--user", default=None, help="only this user's jobs")
    whose.add_argument("--mine", "--me", action="store_true", help="only yours")


def chosen_user(args: argparse.Namespace, client: Client) -> str | None:
    """The user `user_options` chose (None: everyone's)."""
    return str(client.me()["user"]) if args.mine else args.user


class Api:
    """The CLI's view of `towerq.Client` (the Python client): URL and token from the
    options, the environment or `towerq login`'s config file."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.client = Client(url=args.api, token=args.token, retries=2)
        if not self.client.config.token:
            raise AuthError(401, "no token: pass --token, set TOWERQ_TOKEN, or run `towerq login URL`")
        self.stdout_is_data = getattr(args, "output_format", None) == "json"

    def say(self, text: object) -> None:
        """A line about what the command does (a bundle sent): on stderr where stdout is data
        (the API's JSON for a script, `-o json | jq`; a shell's output), else on stdout."""
        print(text, file=sys.stderr if self.stdout_is_data else sys.stdout, flush=True)

    def download(self, path: str, target: Path) -> httpx.Headers:
        """Stream `path` into `target`, with a progress line on a terminal."""
        progress: Progress | None = None

        def show(received: int, total: int | None) -> None:
            nonlocal progress
            progress = progress or Progress(target.name, total)
            progress.advance(received - progress.received)

        headers = self.client.stream_to(path, target, show)
        (progress or Progress(target.name, 0)).done()
        return headers


class Progress:
    """`name  12.3 MB / 40.0 MB  31%  8.1 MB/s` redrawn in place on a terminal; one line at
    the end otherwise."""

    def __init__(self, name: str, total: int | None) -> None:
        self.name, self.total, self.received = name, total, 0
        self.started = self.drawn = time.monotonic()
        self.live = sys.stderr.isatty()

    def advance(self, count: int) -> None:
        self.received += count
        if self.live and time.monotonic() - self.drawn >= 0.1:
            self.drawn = time.monotonic()
            rewrite_line(self._line(), sys.stderr)

    def done(self) -> None:
        if self.live:
            rewrite_line(self._line(), sys.stderr)
            print(file=sys.stderr, flush=True)
        else:
            print(self._line(), file=sys.stderr, flush=True)

    def _line(self) -> str:
        rate = self.received / max(time.monotonic() - self.started, 1e-6)
        size = human_bytes(self.received) + (f" / {human_bytes(self.total)}" if self.total else "")
        share = f"  {100 * self.received / self.total:3.0f}%" if self.total else ""
        return f"{self.name}  {size}{share}  {human_bytes(rate)}/s" if self.live else f"{self.name}  {size}"


PRIORITIES = tuple(p.value for p in sorted(Priority, key=lambda p: p.rank))
"""The priorities a command's `--priority` offers, lowest first (the contract's `Priority`)."""

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
UNIT_TERMS = re.compile(r"(?:\d+(?:\.\d+)?\s*[smhdw]\s*)+")
CLOCK = re.compile(r"(?:(\d+)-)?(\d+):([0-5]\d):([0-5]\d)")
DURATION_FORMS = "seconds (5400), units (90m, 1h30m, 2d) or a clock (1:30:00, Slurm's 2-12:00:00)"


def seconds_in(text: str) -> float | None:
    """The seconds `text` says (`5400`, `90m`, `1h30m`, `1h 30m`, `1.5h`, `1:30:00`, `2-12:00:00`: days,
    then hours:minutes:seconds as Slurm writes them), None where it says none."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    if UNIT_TERMS.fullmatch(text):
        return sum(float(number) * UNITS[unit] for number, unit in re.findall(r"([\d.]+)\s*([smhdw])", text))
    if clock := CLOCK.fullmatch(text):
        days, hours, minutes, seconds = (int(part or 0) for part in clock.groups())
        return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
    return None


def offset_in(text: str) -> float | None:
    """The seconds an age or an offset says in units (`7d`, `2h`, `1h30m`), None for anything
    else: never a number alone, a date (`20261123`) or a time of day (`12:00:00`)."""
    return seconds_in(text) if UNIT_TERMS.fullmatch(text.strip().lower()) else None


TIME_OF_DAY = re.compile(r"([01]?\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?")
MOMENT_FORMS = "a time of day (22:00), +2h / +1d, now, or an ISO time (2026-12-01T09:00)"


def moment(text: str, option: str, after: datetime | None = None) -> datetime:
    """`now`, `+2h` or `2h` (`1h30m`, `1d`: from `after`, else now), a time of day (`22:00`,
    `22:00:30`: its next one after that, local, as `sbatch --begin=22:00`), or an ISO time
    (local when it names no zone)."""
    base = after or datetime.now(UTC)
    text = text.strip()
    if text == "now":
        return base
    if (offset := offset_in(text.removeprefix("+"))) is not None:
        return base + timedelta(seconds=offset)
    if found := TIME_OF_DAY.fullmatch(text):
        local = base.astimezone()
        hour, minute, second = (int(part or 0) for part in found.groups())
        at = local.replace(hour=hour, minute=minute, second=second, microsecond=0)
        return at if at > local else at + timedelta(days=1)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{option} {text!r}: give {MOMENT_FORMS}") from None
    return parsed if parsed.tzinfo else parsed.astimezone()


def duration(text: str) -> int:
    """An option's duration in whole seconds (argparse's `type`): `--time-limit 2h`."""
    seconds = seconds_in(text)
    if seconds is None or round(seconds) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is no duration: give {DURATION_FORMS}")
    return round(seconds)


def print_json(value: Any) -> int:
    print(json.dumps(value, indent=2))
    return 0


def set_field(spec: dict[str, Any], assignment: str) -> None:
    """Apply `a.b=value` to `spec`; the value is JSON when it parses, else a string."""
    path, sep, raw = assignment.partition("=")
    if not sep or not path:
        raise UsageError(f"--set expects FIELD=VALUE, got {assignment!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    try:
        set_dotted(spec, path, value)
    except ValueError as err:
        raise UsageError(f"--set {assignment!r}: {err}") from None


def yaml_problem(err: Exception, source: str) -> str:
    """PyYAML's error on one line, with where (`spec.yaml:2:1: expected ...`), not its
    picture of the line."""
    mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(err).split())
    where = "stdin" if source == "-" else source
    context = getattr(err, "context", None)
    return f"{where}:{mark.line + 1}:{mark.column + 1}: {problem}" + (f" ({context})" if context else "")


def read_spec(source: str) -> dict[str, Any]:
    """A spec from a YAML or JSON file (or `-`: standard input); JSON is YAML too."""
    import yaml

    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
        spec = yaml.safe_load(text)
    except OSError as err:
        raise UsageError(f"cannot read the spec: {err}") from err
    except yaml.YAMLError as err:
        raise UsageError(f"the spec is neither YAML nor JSON: {yaml_problem(err, source)}") from err
    if not isinstance(spec, dict):
        raise UsageError("the spec must be a mapping of fields (model, dataset, ...)")
    return spec
