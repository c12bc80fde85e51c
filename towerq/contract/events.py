"""The trainer's protocol on stdout, typed: the events a trainer (and a command job's program,
through `towerq.report()`) prints, one JSON object per line, and `decode`, the one place a
line becomes an event.

The line comes on a stdout that user code prints to as well, so it is input like any other:
a line that is not a JSON object with `event` is text (`decode` returns None); a line that
names an event but does not fit it is `Refused`, with why (the runner logs it, stores
nothing of it). What fits is bounded: numbers finite or missing, steps from 0 to 2**62,
texts cut to their columns, at most 16 custom metrics. `time` is the writer's word; the
relay keeps it only when plausible (`worker.relay.parse_time`).

Events (`event`): `started`, `metric`, `eval`, `log`, `checkpoint`, `stopped`, `done`,
`error` (docs in worker/trainer/protocol.py, which writes them).
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

MAX_STEP = 2**62
MAX_CUSTOM_METRICS = 16
CUSTOM_NAME_CHARS = 48
LOG_LEVELS = ("debug", "info", "warning", "error")
ERROR_KINDS_CHARS = 64
MESSAGE_CHARS = 10_000


def _number_or_none(value: Any) -> float | None:
    """A finite number, else missing: a metric that is not a number is no reason to lose the point."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _total_or_none(value: Any) -> int | None:
    """A program's word on how many steps it runs: an int from 1 below 2**62, else missing
    (the point is kept without it)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < MAX_STEP:
        return None
    return value


def _custom(value: Any) -> dict[str, float | None] | None:
    """A line's own metrics: at most 16, names cut to 48 characters, values numbers or missing."""
    if not isinstance(value, dict) or not value:
        return None
    kept = list(value.items())[:MAX_CUSTOM_METRICS]
    return {str(name)[:CUSTOM_NAME_CHARS]: _number_or_none(number) for name, number in kept}


def _level(value: Any) -> str:
    return value if value in LOG_LEVELS else "info"


def _text(limit: int) -> BeforeValidator:
    return BeforeValidator(lambda value: ("" if value is None else str(value))[:limit])


Number = Annotated[float | None, BeforeValidator(_number_or_none)]
Step = Annotated[int, Field(ge=0, lt=MAX_STEP, strict=True)]
Custom = Annotated[dict[str, float | None] | None, BeforeValidator(_custom)]
TotalSteps = Annotated[int | None, BeforeValidator(_total_or_none)]


class Event(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    time: Annotated[float | None, BeforeValidator(_number_or_none)] = None


class Metric(Event):
    """A training point: averages over the towers (a program: what it says)."""

    event: Literal["metric"]
    step: Step
    loss: Number = None
    accuracy: Number = None
    learning_rate: Number = None
    examples_per_sec: Number = None
    step_time_s: Number = None
    metrics: Custom = None
    total_steps: TotalSteps = None
    """A command job's program: how many steps it runs in all (`towerq.report(total_steps=)`),
    which gives its job a bar and an ETA; a model job's comes from its spec."""
    attempt: Annotated[int, Field(ge=1, le=10_000)] | None = None
    """Only in a metrics log (the attempt that wrote the line), never on stdout."""


class Eval(Event):
    """An evaluation on held-out data."""

    event: Literal["eval"]
    step: Step
    loss: Number = None
    accuracy: Number = None
    examples: Annotated[int, Field(ge=0)] | None = None
    metrics: Custom = None
    attempt: Annotated[int, Field(ge=1, le=10_000)] | None = None


class Log(Event):
    event: Literal["log"]
    level: Annotated[str, BeforeValidator(_level)] = "info"
    message: Annotated[str, _text(MESSAGE_CHARS)] = ""


class Checkpoint(Event):
    event: Literal["checkpoint"]
    step: Step | None = None
    path: Annotated[str, _text(1024)] = ""


class Stopped(Event):
    """SIGTERM received; a checkpoint was written first."""

    event: Literal["stopped"]
    step: Step | None = None


class Done(Event):
    event: Literal["done"]
    step: Step | None = None
    seconds: Number = None


class Error(Event):
    event: Literal["error"]
    kind: Annotated[str, _text(ERROR_KINDS_CHARS)] = "error"
    message: Annotated[str, _text(MESSAGE_CHARS)] = ""


class Started(Event):
    """What a trainer's `started` line may write into its job's row."""

    event: Literal["started"]
    towers: int | None = Field(default=None, ge=1, le=1024)
    devices: list[Annotated[str, Field(max_length=128)]] | None = Field(default=None, max_length=1024)
    cuda_visible_devices: str | None = Field(default=None, max_length=256)
    memory_limit_enforced: bool | None = None
    batch_norm: (
        dict[
            Annotated[str, Field(max_length=32)],
            Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=10_000)],
        ]
        | None
    ) = Field(default=None, max_length=8)
    resumed_from_step: int | None = Field(default=None, ge=0, le=MAX_STEP)

    def job_fields(self) -> dict[str, Any]:
        """What the job's row takes of it."""
        return self.model_dump(exclude={"event", "time", "resumed_from_step"})


TrainerEvent = Annotated[
    Metric | Eval | Log | Checkpoint | Stopped | Done | Error | Started, Field(discriminator="event")
]
EVENTS: TypeAdapter[TrainerEvent] = TypeAdapter(TrainerEvent)
KNOWN = ("metric", "eval", "log", "checkpoint", "stopped", "done", "error", "started")


class Refused(BaseModel):
    """A line that names an event but does not fit it: said in the job's log, never stored."""

    event: str
    why: str


def decode(text: str | bytes) -> TrainerEvent | Refused | None:
    """The event on one line of a trainer's (or a program's) stdout or metrics log; None for
    any other line, which is text (user code prints too); `Refused` for an event that does
    not fit."""
    if not text or (text[:1] != "{" and text[:1] != b"{"):
        return None
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(raw, dict) or "event" not in raw:
        return None
    kind = str(raw["event"])[:32]
    if kind not in KNOWN:
        return Refused(event=kind, why=f"unknown event {kind!r}")
    try:
        return EVENTS.validate_python(raw)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or kind}: {e['msg']}" for e in err.errors())
        return Refused(event=kind, why=problems[:500])


def encode(event: Metric | Eval | Log) -> str:
    """One protocol line (no newline): what `towerq.report()` and the trainer print."""
    return json.dumps(event.model_dump(exclude_none=True), allow_nan=False)
