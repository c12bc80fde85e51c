"""Client commands that read the lab: the queue, sweeps, usage, fair share, GPUs."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from towerq.cli import views
from towerq.cli.plain import rewrite_line
from towerq.cli.session import Api, UsageError, chosen_user, offset_in, print_json, read_spec
from towerq.cli.transfer import upload_code
from towerq.client import FINAL_STATES as FINAL
from towerq.errors import ApiError


def run_sweep(args: argparse.Namespace) -> int:
    api = Api(args)
    client = api.client
    if args.spec in ("show", "cancel"):
        if args.code is not None:
            raise UsageError(f"towerq sweep {args.spec}: --code goes with a sweep's file")
        if args.id is None:
            raise UsageError(f"towerq sweep {args.spec} ID: which sweep? (`towerq sweeps` lists them)")
        found = client.sweep_status(args.id) if args.spec == "show" else client.cancel_sweep(args.id)
        if args.output_format == "json":
            return print_json(found)
        if args.spec == "cancel":
            stopping = sum(job["state"] not in FINAL for job in found["jobs"])
            return _print([f"sweep {found['id']} ({found['name']}): cancelled; {stopping} of its jobs stopping"])
        return _print(views.sweep_page(found))
    if args.id is not None:
        raise UsageError(
            f"towerq sweep {args.spec} {args.id}: a sweep's file takes no id (did you mean `show` or `cancel`?)"
        )
    spec = read_spec(args.spec)
    if args.code is not None:  # as `towerq submit --code`: the folder packed, the base's `code` its bundle
        base = spec.setdefault("base", {})
        if not isinstance(base, dict):
            raise UsageError("--code: the sweep's base must be a mapping of job fields to take the code bundle")
        base["code"] = upload_code(api, args.code)
    sweep = client.sweep(spec)
    if args.output_format == "json":  # the API's answer; with --follow, the sweep once every job ended
        while args.follow and sweep["done"] < sweep["total"]:
            time.sleep(2)
            sweep = client.sweep_status(sweep["id"])
        print_json(sweep)
        return sweep_exit(sweep) if args.follow else 0
    ids = [job["id"] for job in sweep["jobs"]]
    print(f"sweep {sweep['id']} ({sweep['name']}): {sweep['total']} jobs, {ids[0]}-{ids[-1]}", flush=True)
    if not args.follow:
        return 0
    live = sys.stdout.isatty()
    shown = ""
    while sweep["done"] < sweep["total"]:
        time.sleep(2)
        sweep = client.sweep_status(sweep["id"])
        line = views.sweep_line(sweep)
        if live:
            rewrite_line(line)
        elif line != shown:
            print(line, flush=True)
        shown = line
    last = views.sweep_line(sweep)
    if live:
        print()
    elif last != shown:
        print(last, flush=True)
    return sweep_exit(sweep)


def sweep_exit(sweep: dict[str, Any]) -> int:
    """A followed sweep's exit code: 1 if a job failed, else 3 if one was cancelled, else 0."""
    counts = sweep["counts"]
    if counts.get("failed"):
        return 1
    return 3 if counts.get("cancelled") else 0


def run_sweeps(args: argparse.Namespace) -> int:
    listed = Api(args).client.sweeps()
    return print_json(listed) if args.output_format == "json" else _print(views.sweeps_table(listed))


def _print(lines: list[str]) -> int:
    print("\n".join(lines))
    return 0


def run_queue(args: argparse.Namespace) -> int:
    # Dispatched jobs have left towerq's queue; those an executor's cluster still holds
    # (Slurm's pending jobs) wait there, with its reason and expected start: listed first.
    client = Api(args).client
    page = client.jobs_page(state=["dispatched", "queued"], user=chosen_user(args, client), limit=500)
    waiting = sorted(page["items"], key=lambda job: (job["state"] == "queued", job["queue_position"] or 1e9, job["id"]))
    if args.output_format == "json":
        return print_json(waiting)
    print(f"{'#':>4} {'ID':>6}  {'USER':<12} {'PRIORITY':<8} {'GPUS':>4}  {'WAITED':>8}  {'STARTS':<22} WHY")
    for job in waiting:
        waited = views.duration_text(waited_s(job))
        starts = views.expected_start_text(job) if job.get("expected_start_at") else "-"
        print(
            f"{job['queue_position'] or '-':>4} {job['id']:>6}  {job['user'][:12]:<12} {job['priority']:<8} "
            f"{job['gpu_count']:>4}  {waited:>8}  {starts:<22} {job['reason'] or ''}"
        )
    print(f"({len(waiting)} waiting)")
    return 0


def when_from(text: str, option: str) -> str:
    """An ISO time as given, or `30m` / `24h` / `7d` ago as an ISO time."""
    from datetime import UTC, datetime, timedelta

    if (age := offset_in(text)) is not None:
        return (datetime.now(UTC) - timedelta(seconds=age)).isoformat()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{option} {text!r}: give an ISO time (2026-11-23T09:00Z) or an age (30m, 24h, 7d)") from None
    return (moment if moment.tzinfo else moment.astimezone()).isoformat()


def run_usage(args: argparse.Namespace) -> int:
    until = when_from(args.until, "--until") if args.until else None
    answer = Api(args).client.usage(when_from(args.since, "--since"), until, args.by)
    if args.output_format == "json":
        return print_json(answer)
    print(f"{answer['since'][:16]} to {answer['until'][:16]} (UTC)")
    print(
        f"{args.by.upper():<16} {'GPU HOURS':>10} {'JOBS':>6} {'STARTED':>8} {'WAIT P50':>9} {'WAIT P95':>9} "
        f"{'GPU BUSY':>8}"
    )
    for row in answer["rows"]:
        busy = row.get("gpu_busy_pct")
        print(
            f"{row['key'][:16]:<16} {row['gpu_hours']:>10.2f} {row['jobs']:>6} {row['started']:>8} "
            f"{views.duration_text(row['median_wait_s']):>9} {views.duration_text(row['p95_wait_s']):>9} "
            f"{f'{busy:.0f}%' if busy is not None else '-':>8}"
        )
    total = sum(row["gpu_hours"] for row in answer["rows"])
    print(f"{'total':<16} {total:>10.2f}")
    return 0


def run_fair_share(args: argparse.Namespace) -> int:
    answer = Api(args).client.fair_share()
    if args.output_format == "json":
        return print_json(answer)
    half_life = answer["half_life_s"] / 3600
    print(f"usage decays with a half-life of {half_life:g} h; a lower term goes first (0: used nothing, 0.5: fair)")
    heads = ("SHARE", 6), ("USAGE GPU-H", 12), ("RUNNING", 8), ("QUEUED", 7), ("OWED", 6), ("USED", 6), ("TERM", 6)
    print(f"{'USER':<16} " + " ".join(f"{head:>{width}}" for head, width in heads))

    def part(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    def line(name: str, row: dict[str, Any]) -> str:
        return (
            f"{name[:16]:<16} {row['share']:>6g} {row['usage_gpu_hours']:>12.2f} {row['running_gpus']:>8g} "
            f"{row['queued_jobs']:>7} {part(row['owed']):>6} {part(row['used']):>6} {part(row['term']):>6}"
        )

    if not answer.get("groups"):
        for row in answer["users"]:
            print(line(row["user"], row))
        return 0
    # The tree: each group (its term is its users' first level), then its users within it.
    for group in answer["groups"]:
        name = group["group"]
        quotas = [f"at most {group['max_gpus']:g} GPUs"] if group["max_gpus"] is not None else []
        if group["max_gpu_hours_week"] is not None:
            quotas.append(f"{group['gpu_hours_week']:.1f} of {group['max_gpu_hours_week']:g} GPU-h this week")
        print(line(f"[{name}]" if name else "[no group]", group) + (f"  ({'; '.join(quotas)})" if quotas else ""))
        for row in answer["users"]:
            if row["group"] == name:
                print(line(f"  {row['user']}", row))
    return 0


def dry_run_line(answer: dict[str, Any]) -> str:
    if answer["starts_now"]:
        size = answer.get("starts_on")
        on = f"{size} GPU{'s' if size != 1 else ''} of {answer['expected_host']}" if size else answer["expected_host"]
        return f"it would start now on {on}"
    if answer["queue_position"] is None and answer["reason"]:  # held back (on hold, a dependency, its begin)
        then = f"; then starts {views.expected_start_text(answer)}" if answer["expected_start_at"] else ""
        return f"it would not start yet: {answer['reason']}{then}"
    where = f"#{answer['queue_position']} in the queue" if answer["queue_position"] else "queued"
    why = f" ({answer['reason']})" if answer["reason"] else ""
    if answer["expected_start_at"] is None:
        return f"it would wait, {where}{why}; no estimate of its start (nothing known frees room for it)"
    return f"it would wait, {where}{why}; starts {views.expected_start_text(answer)}"


def waited_s(job: dict[str, Any]) -> float:
    """Seconds a waiting job has waited since its submit: its time on hold, past and current,
    is no wait (`held_s`, `on_hold_at`)."""
    from datetime import UTC, datetime

    def since(iso: str) -> float:
        return (datetime.now(UTC) - datetime.fromisoformat(iso)).total_seconds()

    held = float(job.get("held_s") or 0.0) + (since(job["on_hold_at"]) if job.get("on_hold_at") else 0.0)
    return max(0.0, since(job["created_at"]) - held)


def run_gpus(args: argparse.Namespace) -> int:
    if args.action is not None:
        return run_drain(args)
    if args.host is not None:
        raise UsageError(f"towerq gpus {args.host}: drain or undrain first (towerq gpus drain {args.host} 0)")
    gpus = Api(args).client.gpus()
    if args.output_format == "json":
        return print_json(gpus)
    print(f"{'HOST':<14} {'GPU':>3}  {'NAME':<36} {'MEMORY':>15}  {'BUSY':>4}  {'FREE':>5}  HELD BY")
    for gpu in gpus:
        badges = [
            b
            for b, on in (
                ("simulated", gpu["simulated"]),
                ("drained", gpu["drained"]),
                ("down", gpu["host_state"] != "up"),
                ("UNSANDBOXED", gpu.get("sandboxed") is False),
                ("no notebooks", bool(gpu.get("no_notebooks"))),
            )
            if on
        ]
        memory = f"{gpu['memory_used_mb']}/{gpu['memory_total_mb']} MB"
        holders = ", ".join(f"job {h['job_id']} ({h['user']}, {h['fraction']:g})" for h in gpu["holders"]) or "-"
        if kept := gpu.get("reserved"):  # a free GPU kept for a group is not free to everyone
            holders += f"  {views.reservation_text(kept)}"
        flags = f"  [{', '.join(badges)}]" if badges else ""
        host, name = gpu["host"][:14], gpu["name"][:36]
        busy = f"{gpu['utilization_pct']:.0f}%" if gpu.get("utilization_pct") is not None else "-"  # NVML's, now
        print(
            f"{host:<14} {gpu['index']:>3}  {name:<36} {memory:>15}  {busy:>4}  {gpu['free_fraction']:>5.2f}  "
            f"{holders}{flags}"
        )
    for host in sorted({gpu["host"] for gpu in gpus if gpu.get("sandboxed") is False}):
        print(f"warning: {host} runs members' code WITHOUT a sandbox (TOWERQ_SANDBOX=none)", file=sys.stderr)
    for host, why in sorted({(gpu["host"], gpu["no_notebooks"]) for gpu in gpus if gpu.get("no_notebooks")}):
        print(f"{host} runs no notebook sessions: {why}")
    return 0


def run_drain(args: argparse.Namespace) -> int:
    """`towerq gpus drain|undrain HOST INDEX...` (admins), as Slurm's `scontrol update
    state=drain`: each GPU in turn, a line each; one the API refuses (no such GPU, not an
    admin) is said on stderr and the others go on (exit 1)."""
    if args.host is None or not args.indices:
        raise UsageError(f"towerq gpus {args.action} HOST INDEX...: which GPUs? (`towerq gpus` lists them)")
    client = Api(args).client
    act = client.drain_gpu if args.action == "drain" else client.undrain_gpu
    refused = 0
    host_gpus: list[dict[str, Any]] = []
    for index in dict.fromkeys(args.indices):
        try:
            host_gpus = act(args.host, index)
        except ApiError as err:
            print(f"towerq: {err.detail}", file=sys.stderr, flush=True)
            refused += 1
            continue
        if args.output_format != "json":
            gpu = next(g for g in host_gpus if g["index"] == index)
            print(drained_line(gpu, args.action), flush=True)
    if args.output_format == "json" and host_gpus:
        print_json(host_gpus)
    return 1 if refused else 0


def drained_line(gpu: dict[str, Any], action: str) -> str:
    name = f"{gpu['host']} GPU {gpu['index']}"
    if action == "undrain":
        return f"{name}: back in service"
    jobs = ", ".join(f"job {h['job_id']} ({h['user']})" for h in gpu["holders"])
    if not jobs:
        return f"{name}: drained"
    return f"{name}: drained; {jobs} finish{'es' if len(gpu['holders']) == 1 else ''} on it"
