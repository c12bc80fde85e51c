"""The trainer's protocol is decoded in one place (`towerq.contract.events.decode`): the
trust boundary between user code, which prints on the same stdout, and the job's rows.
Every line here is what a model or a command job's program could print."""

from __future__ import annotations

import io
import json
import math

import pytest

from towerq.contract import events
from towerq.reporting import report
from worker.trainer.protocol import Reporter


@pytest.mark.parametrize(
    "line",
    ["", "plain text", "{not json", "[1, 2]", '{"no": "event"}', '"{\\"event\\": 1}"', "{" + "x" * 100],
)
def test_a_line_that_is_not_an_event_is_text(line: str) -> None:
    assert events.decode(line) is None


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ({"event": "metric", "step": 2**80, "loss": 1.0}, "step"),
        ({"event": "metric", "step": -1}, "step"),
        ({"event": "metric", "step": True}, "step"),
        ({"event": "metric", "step": 1.5}, "step"),
        ({"event": "metric"}, "step"),
        ({"event": "eval", "step": "3"}, "step"),
        ({"event": "started", "towers": "many"}, "towers"),
        ({"event": "started", "devices": ["x" * 200]}, "devices"),
        ({"event": "shell", "command": "rm -rf /"}, "unknown event 'shell'"),
    ],
)
def test_an_event_that_does_not_fit_is_refused_with_why(line: dict[str, object], why: str) -> None:
    decoded = events.decode(json.dumps(line))
    assert isinstance(decoded, events.Refused) and why in decoded.why, decoded


def test_what_fits_is_bounded() -> None:
    text = json.dumps(
        {
            "event": "metric",
            "step": 7,
            "loss": "0.5",
            "accuracy": True,
            "learning_rate": 1e400,
            "metrics": {f"m{i}" + "x" * 100: i for i in range(40)},
            "job_id": 999,
            "attempt": 3,
        }
    )
    decoded = events.decode(text.replace("1e+400", "Infinity"))
    assert isinstance(decoded, events.Metric)
    assert (decoded.step, decoded.loss, decoded.accuracy, decoded.learning_rate) == (7, None, None, None)
    assert decoded.metrics is not None and len(decoded.metrics) == events.MAX_CUSTOM_METRICS
    assert all(len(name) <= events.CUSTOM_NAME_CHARS for name in decoded.metrics)
    assert not hasattr(decoded, "job_id"), "a line names no other job"
    log = events.decode(json.dumps({"event": "log", "level": "x" * 100, "message": "y" * 50_000, "time": math.pi}))
    assert isinstance(log, events.Log) and log.level == "info" and len(log.message) == events.MESSAGE_CHARS
    error = events.decode(json.dumps({"event": "error", "kind": "k" * 500, "message": None}))
    assert isinstance(error, events.Error) and len(error.kind) == 64 and error.message == ""
    assert isinstance(events.decode('{"event": "metric", "step": 1, "loss": NaN}'), events.Metric)


def test_the_trainer_and_towerq_report_print_what_decode_reads(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    reporter = Reporter(out)
    reporter.emit("metric", step=3, loss=0.25, accuracy=0.5, learning_rate=0.01, examples_per_sec=100.0,
                  step_time_s=0.1, metrics={"top2": 0.9})  # fmt: skip
    reporter.emit("eval", step=3, loss=0.3, accuracy=0.4, examples=100)
    reporter.log("a note", "warning")
    report(step=4, loss=0.2, accuracy=0.6, f1=0.7, total_steps=1000)
    report(step=4, split="eval", loss=0.21)
    lines = out.getvalue().splitlines() + capsys.readouterr().out.splitlines()
    decoded = [events.decode(line) for line in lines]
    assert [type(d).__name__ for d in decoded] == ["Metric", "Eval", "Log", "Metric", "Eval"], decoded
    assert decoded[0].metrics == {"top2": 0.9} and decoded[3].metrics == {"f1": 0.7}  # type: ignore[union-attr]
    assert decoded[3].total_steps == 1000  # type: ignore[union-attr]
    for bad in ({"total_steps": 0}, {"total_steps": True}, {"total_steps": 10.0}, {"total_steps": 5, "split": "eval"}):
        with pytest.raises(ValueError, match="towerq.report: total_steps"):
            report(step=4, loss=0.2, **bad)  # type: ignore[arg-type]
