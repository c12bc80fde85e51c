"""The messages towerq publishes on Redis pub/sub, typed: one model per kind, one encoder,
one decoder, used by every side (the lifecycle and the worker's relay publish; the worker's
agent, the API's live streams, the Python client and the CLI read; the dashboard reads the
same JSON off the SSE stream, docs/rest-api.md).

Every message is a JSON object whose `type` names its kind:

- `state`: a job changed state (`towerq:job:<id>` and the list-level `towerq:jobs`);
- `metric`, `eval`: a train or evaluation point (`towerq:job:<id>`);
- `log`: a line of the job's log (`towerq:job:<id>`);
- `cancel`, `preempt`: a stop request (`towerq:job:<id>` and the control channel of the
  job's host). A control message only wakes the worker: what to do, and why, it reads from
  the job's row, never from the message (a message anyone could publish must not decide).

A decoder meets messages of older or newer towerq processes during an upgrade: fields it
does not know are kept (`extra="allow"`), a kind it does not know is `UnknownMessage`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, TypeAdapter, ValidationError

Time = Annotated[datetime, PlainSerializer(lambda t: t.isoformat(), return_type=str)]
"""An ISO 8601 time with its zone, as `datetime.isoformat` writes it."""


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class StateMessage(_Message):
    """A job changed state: on the job's channel and on `GET /api/stream`."""

    type: Literal["state"] = "state"
    job_id: int = Field(description="the job")
    state: str = Field(
        description="its new state (`queued`, `dispatched`, `running`, `succeeded`, `failed`, `cancelled`)"
    )
    attempt: int = Field(description="the attempt it belongs to (1, then 2 after a requeue, ...)")
    message: str | None = Field(None, description="why, in words (the reason of the change)")
    time: Time = Field(description="when, ISO 8601 with its zone")


class MetricMessage(_Message):
    """A train point (`metric`) or an evaluation (`eval`); `custom` holds the model's own metrics."""

    type: Literal["metric", "eval"] = "metric"
    job_id: int = Field(description="the job")
    attempt: int = Field(description="the attempt it belongs to (1, then 2 after a requeue, ...)")
    step: int = Field(description="the global step")
    split: Literal["train", "eval"] = Field("train", description="`train` for `metric`, `eval` for `eval`")
    loss: float | None = Field(None, description="the loss (train: of this step; eval: over the eval set)")
    accuracy: float | None = Field(None, description="the accuracy, 0 to 1, where the task has one")
    learning_rate: float | None = Field(None, description="the learning rate of this step")
    examples_per_sec: float | None = Field(None, description="throughput over all towers")
    step_time_s: float | None = Field(None, description="seconds of one step (train only)")
    custom: dict[str, float | None] | None = Field(None, description="the model's own metrics by name")
    time: Time = Field(description="when, ISO 8601 with its zone")


class LogMessage(_Message):
    """A line of the job's log (not sent to members who may not read the job's log)."""

    type: Literal["log"] = "log"
    job_id: int = Field(description="the job")
    attempt: int = Field(description="the attempt it belongs to (1, then 2 after a requeue, ...)")
    level: str = Field(description="`debug`, `info`, `warning` or `error`")
    message: str = Field(description="the line (at most 10,000 characters)")
    time: Time = Field(description="when, ISO 8601 with its zone")


class CancelMessage(_Message):
    """A cancel was asked for: the job's worker stops it (the row says so, not this)."""

    type: Literal["cancel"] = "cancel"
    job_id: int = Field(description="the job")
    attempt: int = Field(description="the attempt it belongs to (1, then 2 after a requeue, ...)")
    host: str | None = Field(None, description="the host whose worker runs the job")
    by: str = Field(description="who asked")


class PreemptMessage(_Message):
    """The scheduler asked the job to make room: checkpoint, stop, back to the queue."""

    type: Literal["preempt"] = "preempt"
    job_id: int = Field(description="the job")
    attempt: int = Field(description="the attempt it belongs to (1, then 2 after a requeue, ...)")
    host: str | None = Field(None, description="the host whose worker runs the job")
    reason: str = Field(description="why it must make room")


StopMessage = CancelMessage | PreemptMessage
"""A stop request: the executor delivers it to where the attempt runs."""
AnyMessage = StateMessage | MetricMessage | LogMessage | StopMessage
Message = Annotated[AnyMessage, Field(discriminator="type")]

_MESSAGE: TypeAdapter[Message] = TypeAdapter(Message)


class UnknownMessage(BaseModel):
    """A message of a kind this process does not know (a newer towerq), or not valid."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str = "message"
    job_id: int | None = None


class MessageError(ValueError):
    """What came is not a towerq message (not JSON, or not an object with a job id)."""


def encode(message: AnyMessage) -> str:
    """The message's wire form: JSON, `type` and `job_id` first, every field present (null
    when unset), so a reader in any language finds the same keys in every message of a kind."""
    return json.dumps(message.model_dump(mode="json"))


def decode(data: str | bytes) -> Message | UnknownMessage:
    """A message read off a channel. A known kind that does not validate, or an unknown kind,
    comes back as `UnknownMessage`; what is not a JSON object with a job id raises
    MessageError (a control channel's reader refuses it)."""
    try:
        raw = json.loads(data)
    except ValueError as err:
        raise MessageError(f"not JSON: {str(data)[:200]!r}") from err
    if not isinstance(raw, dict) or not isinstance(raw.get("job_id"), int) or isinstance(raw["job_id"], bool):
        raise MessageError(f"not a towerq message: {str(data)[:200]!r}")
    try:
        return _MESSAGE.validate_python(raw)
    except ValidationError:
        return UnknownMessage.model_validate({**raw, "type": str(raw.get("type") or "message")})


def kind_of(data: str | bytes) -> str:
    """The kind of an encoded message (`message` for anything that is not one), as the
    live streams name their SSE events."""
    try:
        raw: Any = json.loads(data)
    except ValueError:
        return "message"
    kind = raw.get("type") if isinstance(raw, dict) else None
    return kind if isinstance(kind, str) and kind.isidentifier() else "message"
