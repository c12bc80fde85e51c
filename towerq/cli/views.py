"""How jobs and sweeps read in a terminal: the rows of `towerq jobs` and `towerq sweeps`, and
the pages of `towerq show` and `towerq sweep show` (`-o json` gives the API's answer)."""

from __future__ import annotations

import shlex
from datetime import datetime, timedelta
from typing import Any

from towerq.contract.signals import limit_signal
from towerq.contract.times import limit_text, span_text

REASON_WIDTH = 70
STEP_WIDTH = 11


def count(n: float) -> str:
    """12, 9,999, 13.4k, 100M: at most five characters from 10,000 up."""
    if n < 10_000:
        return f"{n:,.0f}"
    unit, size = next((unit, size) for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)) if n >= size)
    value = n / size
    return f"{value:.0f}{unit}" if value >= 100 else f"{value:.3g}{unit}"


def steps(job: dict[str, Any]) -> str:
    """`step/total` that fits the STEP column: `400/1,000`, `13.4k/100M`; `400` where no
    total is known (a command job whose program has not said it); `-` for no step at all
    (a program that reports none, a notebook session)."""
    total = job.get("total_steps")
    if not total and not job["step"]:
        return "-"
    return f"{count(job['step'] or 0)}/{count(total)}" if total else count(job["step"] or 0)


def expected_start_text(job: dict[str, Any]) -> str:
    """`~14:05 on lab-a` (local time; with the date when not today), from the scheduler's replay."""
    clock = local_clock(job["expected_start_at"])
    host = job.get("expected_host")
    return f"~{clock} on {host}" if host else f"~{clock}"


def reservation_text(kept: dict[str, Any]) -> str:
    """`reserved for nlp until 18:00` (in its window), `reserved for nlp from 06:31 to 10:31`."""
    start, end = (local_clock(kept[key]) for key in ("start_at", "end_at"))
    window = f"until {end}" if kept["now"] else f"from {start} to {end}"
    return f"reserved for {kept['group']} {window} (reservation {kept['id']})"


def local_clock(at: str) -> str:
    """`14:05` in local time; with the date when it is not today."""
    when = datetime.fromisoformat(at).astimezone()
    today = when.date() == datetime.now().astimezone().date()
    return when.strftime("%H:%M") if today else when.strftime("%b %d %H:%M")


def duration_text(seconds: float | None) -> str:
    """`1h05m`, `4m30s`; `-` for none: a table's or a figure's form, to the second under an
    hour and two digits after the first (prose says a span as `span_text` does: `10m`)."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def wall_rate(latest: dict[str, Any], pace_s: float | None) -> float | None:
    """Examples a second over wall time: a step's examples (the trainer's rate while training
    times its step time) over the job's pace, its evaluations, checkpoints and pauses
    included. None until both are known."""
    speed, step_time = latest.get("examples_per_sec"), latest.get("step_time_s")
    return speed * step_time / pace_s if speed and step_time and pace_s else None


def speed_text(latest: dict[str, Any], pace_s: float | None) -> str | None:
    """The wall-clock rate, with the trainer's own (training alone, 3-4x more) beside it."""
    speed, wall = latest.get("examples_per_sec"), wall_rate(latest, pace_s)
    if not speed:
        return None
    if wall is None:
        return f"{speed:,.0f} examples/s while training"
    return f"{wall:,.0f} examples/s ({speed:,.0f} while training)"


def expected_end_text(at: str) -> str:
    """`~14:05 (in 12m 30s)`: when a running job's last step is expected, at its pace so far."""
    left = max(0, int((datetime.fromisoformat(at).astimezone() - datetime.now().astimezone()).total_seconds()))
    hours, rest = divmod(left, 3600)
    span = f"{hours}h {rest // 60:02d}m" if hours else f"{rest // 60}m {rest % 60:02d}s"
    return f"~{local_clock(at)} (in {span})"


def time_limit_text(job: dict[str, Any], limit_s: int) -> str:
    """`1h30m`, `48h`, `5s`, as the job's reason and log say it; for a running job, when it
    stops it: `1h30m (stops it ~15:35)` (each attempt has the whole limit, from its start)."""
    held = job.get("held") or []
    if job["state"] != "running" or not held or held[-1].get("until"):
        return limit_text(limit_s)
    stops = datetime.fromisoformat(held[-1]["since"]) + timedelta(seconds=limit_s)
    return f"{limit_text(limit_s)} (stops it ~{local_clock(stops.isoformat())})"


def run_time_text(held: list[dict[str, Any]]) -> str | None:
    """How long its attempts held GPUs, every one together (`12m05s`; `1h02m over 3
    attempts`); None before the first."""
    if not held:
        return None
    now = datetime.now().astimezone()
    spans = [
        ((datetime.fromisoformat(h["until"]) if h.get("until") else now) - datetime.fromisoformat(h["since"]))
        for h in held
    ]
    total = duration_text(sum(span.total_seconds() for span in spans))
    return total if len(held) == 1 else f"{total} over {len(held)} attempts"


def one_line(text: str | None, width: int = REASON_WIDTH) -> str:
    """The first line of `text`, cut to `width` with an ellipsis."""
    lines = (text or "").strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def where(job: dict[str, Any]) -> str:
    allocation = job.get("allocation")
    if allocation:
        ranks = allocation.get("ranks") or [allocation]  # a job over several hosts: every host, by rank
        return " + ".join(f"{r['host']}:{','.join(map(str, r['gpus']))}" for r in ranks)
    return f"{job['gpu_count']}×"


def elastic_size(job: dict[str, Any]) -> str | None:
    """An elastic job's size in words: "2 of 4 GPUs (elastic)" while it holds GPUs, "1 to 4
    GPUs (elastic)" while it waits; None for any other job."""
    least = job.get("min_gpu_count")
    if least is None:
        return None
    allocation = job.get("allocation")
    if allocation:
        return f"{len(allocation['gpus'])} of {job['gpu_count']} GPUs (elastic)"
    return f"{least} to {job['gpu_count']} GPUs (elastic)"


def jobs_table(page: dict[str, Any]) -> list[str]:
    """The rows of `towerq jobs`: why a job waits, failed or was cancelled, in one line."""
    lines = [f"{'ID':>5}  {'STATE':<10} {'USER':<12} {'GPUS':<14} {'STEP':>{STEP_WIDTH}}  NAME — WHY"]
    for job in page["items"]:
        why = one_line(job.get("reason"))
        if job["state"] in ("queued", "dispatched") and job.get("expected_start_at"):
            starts = f"starts {expected_start_text(job)}"
            why = f"{why}; {starts}" if why else starts
        held = elastic_size(job) if job.get("allocation") else None  # a waiting one's sizes: its page says them
        said = "; ".join(part for part in (held, why) if part)
        tail = f"  — {said}" if said else ""
        lines.append(
            f"{job['id']:>5}  {job['state']:<10} {job['user'][:12]:<12} {where(job)[:14]:<14} "
            f"{steps(job):>{STEP_WIDTH}}  {job['name']}{tail}"
        )
    lines.append(f"({len(page['items'])} of {page['total']})")
    return lines


def _percent(value: float | None) -> str | None:
    return None if value is None else f"{100 * value:.2f}%"


def _number(value: float | None) -> str | None:
    return None if value is None else f"{value:.4g}"


def _clock(iso: str | None) -> str:
    if not iso:
        return "-"
    return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def job_page(job: dict[str, Any], api_url: str = "", warned: dict[str, Any] | None = None) -> list[str]:
    """`towerq show ID`: the job as a person reads it (`api_url`: where a session opens;
    `warned`: the newest warning of its log while it waits, `waiting_warning`)."""
    reason = job.get("pending_reason") if warned is not None else job.get("reason")  # the warning says the rest
    rows: list[tuple[str, str | None]] = [("state", job["state"] + (f": {reason}" if reason else ""))]
    if warned is not None:
        rows.append(("warned", f"{local_clock(warned['time'])} {warned['message']}"))
    if job["state"] == "queued":
        position = job.get("queue_position")
        rows.append(("queue", f"#{position}" if position else "-"))
    if job["state"] in ("queued", "dispatched") and job.get("expected_start_at"):
        rows.append(("starts", expected_start_text(job)))
    rows.append(("user", job["user"]))
    rows.append(("priority", job["priority"]))
    share = "" if job["gpu_memory_fraction"] >= 1 else f", {job['gpu_memory_fraction']:g} of each GPU's memory"
    allocation = job.get("allocation")
    simulated = " (simulated)" if allocation and allocation.get("simulated") else ""
    size = elastic_size(job)
    if allocation:
        gpus = f"{where(job)}{simulated}" + (f": {size}" if size else "")
    else:
        gpus = size or f"{job['gpu_count']} wanted"
    rows.append(("gpus", gpus + share))
    rows.append(("gpu use", gpu_use_text(job.get("gpu_use"))))
    total = job.get("total_steps")
    step = job.get("step") or 0
    spec = job.get("spec") or {}
    if total or step or not (spec.get("command") or spec.get("kind") == "notebook"):  # a program may report none
        rows.append(("progress", f"step {step:,}/{total:,} ({100 * step / total:.0f}%)" if total else f"step {step:,}"))
    if job.get("expected_end_at"):
        rows.append(("ends", expected_end_text(job["expected_end_at"])))
    latest = job.get("latest") or {}
    for label, loss, accuracy, own in (
        ("train", "loss", "accuracy", "custom_metrics"),
        ("eval", "eval_loss", "eval_accuracy", "eval_custom_metrics"),
    ):
        parts = [f"loss {v}" for v in [_number(latest.get(loss))] if v] + [
            f"accuracy {v}" for v in [_percent(latest.get(accuracy))] if v
        ]
        # the metrics it reports by name (a model's metrics(), towerq.report(f1=...)), by name
        mine = latest.get(own) or {}
        parts += [f"{name} {_number(mine[name])}" for name in sorted(mine) if isinstance(mine[name], int | float)]
        rows.append((label, "  ".join(parts) or None))
    rows.append(("speed", speed_text(latest, job.get("pace_s") if job["state"] == "running" else None)))
    if spec.get("time_limit_s"):
        rows.append(("time limit", time_limit_text(job, spec["time_limit_s"])))
    if spec.get("begin_at"):
        rows.append(("not before", local_clock(spec["begin_at"])))
    if spec.get("signal"):
        name, before = limit_signal(spec["signal"])
        rows.append(("warning", f"SIG{name} {limit_text(before)} before its time limit ({spec['signal']})"))
    rows.append(("attempts", f"{job['attempts']} (crashes {job['crashes']} of {job['max_attempts']} allowed)"))
    if job.get("sweep_id"):
        rows.append(("sweep", str(job["sweep_id"])))
    rows.append(("submitted", _clock(job.get("created_at"))))
    if job.get("started_at"):
        rows.append(("started", _clock(job["started_at"])))
    if job.get("finished_at"):
        rows.append(("finished", _clock(job["finished_at"])))
    rows.append(("run time", run_time_text(job.get("held") or [])))
    rows.append(("updated", _clock(job.get("updated_at"))))
    rows += spec_rows(job, spec, api_url)
    lines = [f"job {job['id']}  {job['name']}"]
    lines += [f"  {label:<10} {value}" for label, value in rows if value]
    events = job.get("events") or []
    if events:
        lines.append("  history")
        for event in events[-10:]:
            message = f"  {one_line(event['message'])}" if event.get("message") else ""
            lines.append(f"    {_clock(event['time'])}  {event['state']:<10}{message}".rstrip())
        if len(events) > 10:
            lines.append(f"    ({len(events) - 10} earlier; -o json for all)")
    if job.get("notifications"):
        lines.append("  webhooks")
        lines += [f"    {line}" for line in webhook_lines(job)]
    return lines


def waiting_warning(job: dict[str, Any], lines: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest warning (or error) among a queued job's log `lines` since its last start
    (those of the attempt it waits to start: `its requirements could not be installed on
    lab-a while it waits ...`), which its reason does not say; None for none, or a job
    not queued."""
    if job["state"] != "queued":
        return None
    said = [line for line in lines if line["attempt"] == job["attempts"] and line["level"] in ("warning", "error")]
    return said[-1] if said else None


def webhook_lines(job: dict[str, Any]) -> list[str]:
    """The job's webhook deliveries, a line each (`towerq show`, `towerq webhooks`), and how
    a failed one is sent again."""
    lines = []
    for n in job.get("notifications") or []:
        if n["state"] == "delivered":
            state = f"delivered {_clock(n.get('delivered_at'))}"
        elif n["state"] == "failed":
            state = f"failed after {n['attempts']} attempt{'s' if n['attempts'] != 1 else ''}"
        else:
            state = f"pending, {n['attempts']} tried" if n["attempts"] else "pending"
        error = f": {one_line(n['last_error'], 60)}" if n.get("last_error") and n["state"] != "delivered" else ""
        to = n.get("url") or "the lab's webhook"
        lines.append(f"#{n['id']:<5} {n['event']:<15} {state}{error}  to {to}")
    if any(n["state"] == "failed" for n in job.get("notifications") or []):
        mended = f"(a failed one is sent again once its receiver is mended: towerq webhooks {job['id']} --resend N)"
        lines.append(mended)
    return lines


def gpu_use_text(use: dict[str, Any] | None) -> str | None:
    """`busy 31% of the time, at most 20,000 of 81,559 MiB held` (as its workers sampled the
    driver); None without a sample (simulated GPUs)."""
    if not use:
        return None
    text = f"busy {use['busy_pct']:g}% of the time"
    if use.get("memory_peak_mb") is not None:
        total = f" of {use['memory_total_mb']:,}" if use.get("memory_total_mb") else ""
        text += f", at most {use['memory_peak_mb']:,}{total} MiB held"
    if use.get("idle_since"):
        text += f"; idle since {local_clock(use['idle_since'])}"
    return text


def spec_rows(job: dict[str, Any], spec: dict[str, Any], api_url: str = "") -> list[tuple[str, str | None]]:
    """What the job runs, as its kind says it: a model on a dataset with its settings, a
    command from a code bundle, or a notebook session and where it opens."""
    code = f" (code {spec['code'][:12]})" if spec.get("code") else ""
    if spec.get("kind") == "notebook":
        idle = spec.get("idle_timeout_s")
        url = api_url.rstrip("/") + job["url"] if job.get("url") else None
        rows = [("session", url), ("idle", f"ends after {span_text(idle)} idle" if idle else None)]
        return rows + ([("code", f"{spec['code'][:12]} (at $TOWERQ_CODE_DIR)")] if spec.get("code") else [])
    if spec.get("command"):
        per_gpu = "; one process per GPU" if spec.get("processes") == "per_gpu" else ""
        resumable = "; resumable" if spec.get("resumable") else ""
        rows = [("command", f"{shlex.join(spec['command'])}{code}{per_gpu}{resumable}")]
        return rows + ([("packages", " ".join(spec["requirements"]))] if spec.get("requirements") else [])
    hyper = spec.get("hyperparameters") or {}
    settings = ", ".join(f"{key} {value}" for key, value in hyper.items() if not isinstance(value, dict | list))
    model = f"{spec.get('model', '?')}{code} on {spec.get('dataset') or '?'}"
    return [("spec", model + (f"; {settings}" if settings else ""))]


def sweep_line(sweep: dict[str, Any]) -> str:
    """One line of a sweep's progress and its best job so far."""
    states = ", ".join(f"{state} {n}" for state, n in sorted(sweep["counts"].items()))
    line = f"sweep {sweep['id']}: {sweep['done']}/{sweep['total']} done ({states})"
    best = next((job for job in sweep.get("jobs") or [] if job["id"] == sweep["best_job"]), None)
    if best is not None and best["result"] is not None:
        line += f"; best: job {best['id']}, {sweep['metric']} {best['result']:.4g}"
    elif sweep.get("best_job") is not None:
        line += f"; best: job {sweep['best_job']}"
    return line


def sweeps_table(sweeps: list[dict[str, Any]]) -> list[str]:
    """The rows of `towerq sweeps`."""
    lines = [f"{'ID':>5}  {'USER':<12} {'DONE':>9}  {'BEST':>6}  {'METRIC':<16} NAME"]
    for sweep in sweeps:
        done = f"{sweep['done']}/{sweep['total']}"
        best = str(sweep["best_job"]) if sweep.get("best_job") is not None else "-"
        metric = f"{sweep['goal']} {sweep['metric']}"
        lines.append(f"{sweep['id']:>5}  {sweep['user'][:12]:<12} {done:>9}  {best:>6}  {metric:<16} {sweep['name']}")
    lines.append(f"({len(sweeps)} sweep{'' if len(sweeps) == 1 else 's'})")
    return lines


def sweep_page(sweep: dict[str, Any]) -> list[str]:
    """`towerq sweep show ID`: every job with its setting and result, the best one marked."""
    lines = [f"sweep {sweep['id']}  {sweep['name']}  ({sweep['user']})", f"  {sweep_line(sweep)}"]
    lines.append(f"  goal: {sweep['goal']} {sweep['metric']}; fields: {', '.join(sweep['fields'])}")
    lines.append(f"  {'':1} {'JOB':>6}  {'STATE':<10} {'STEP':>{STEP_WIDTH}}  {'RESULT':>9}  SETTING")
    for job in sweep["jobs"]:
        mark = "*" if job["id"] == sweep["best_job"] else " "
        result = f"{job['result']:.4g}" if job["result"] is not None else "-"
        setting = ", ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in job["setting"].items())
        lines.append(f"  {mark} {job['id']:>6}  {job['state']:<10} {steps(job):>{STEP_WIDTH}}  {result:>9}  {setting}")
    if sweep["best_job"] is not None:
        lines.append("  (* the best job so far)")
    elif sweep.get("metric_missing"):
        lines.append(f"  ({sweep['metric_missing']})")
    return lines + rung_lines(sweep)


def rung_lines(sweep: dict[str, Any]) -> list[str]:
    """An adaptive sweep's rungs: how many settings reached each, how many it stopped there,
    its cut now, and which settings it stopped (nothing for a sweep without early stopping)."""
    early = sweep.get("early_stopping")
    if not early:
        return []
    factor = early["reduction_factor"]
    lines = [f"  early stopping (ASHA): rungs from step {early['min_steps']}, 1 in {factor} goes on at each"]
    rows = sweep.get("rungs") or []
    for rung in sorted({row["rung"] for row in rows}):
        there = [row for row in rows if row["rung"] == rung]
        stopped = [row["job_id"] for row in there if row["stopped"]]
        cut = there[-1]["cut"]
        line = f"    rung {rung} (step {early['min_steps'] * factor ** (rung - 1)}): {len(there)} reached"
        line += f", cut {cut:.4g}" if cut is not None else ""
        line += f"; stopped: {', '.join(f'job {job_id}' for job_id in stopped)}" if stopped else "; none stopped"
        lines.append(line)
    return lines
