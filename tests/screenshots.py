"""What docs/screenshots/ holds: the pages, the widths, and the fingerprint of the files they
were made from (the dashboard and the seeded lab). scripts/screenshots.py makes them;
tests/test_screenshots.py says when they are stale."""

from __future__ import annotations

import hashlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FOLDER = REPO / "docs" / "screenshots"
VIEWPORTS = {"desktop": (1280, 860), "phone": (390, 844)}
PAGES = {
    "jobs": ("jobs", "table.jobs[data-drawn]"),
    "job": ("jobs/{running}", '#charts[data-points]:not([data-points="0"])'),
    "job-failed": ("jobs/{failed}", ".job-header .badge"),
    "sweeps": ("sweeps", "tr[data-sweep]"),
    "sweep": ("sweeps/{sweep}", "#sweep-curves[data-series]"),
    "gpus": ("gpus", '[data-host="lab-a"]'),
    "usage": ("usage", "#chart-gpus-per-user .uplot"),
    "groups": ("groups", "#reservations tr[data-reservation]"),
    "tokens": ("tokens", "#tokens tr[data-token]"),
    "submit": ("submit", "#submit"),
    "compare": ("compare?ids={a},{b},{c}", "#compare-chart[data-series='3'] canvas"),
}
"""Each page: its address after `#/` and what shows it is drawn."""
MADE_FROM = ("web", "scripts/seed-lab.py", "scripts/screenshots.py", "tests/screenshots.py")
FINGERPRINT_LINE = "Made from the dashboard files with fingerprint "


def fingerprint() -> str:
    """A hash of every file the pictures depend on (path and content)."""
    digest = hashlib.sha256()
    for root in MADE_FROM:
        path = REPO / root
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if "__pycache__" in file.parts:
                continue
            digest.update(str(file.relative_to(REPO)).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def index_text(made_from: str) -> str:
    lines = [
        "# The dashboard, page by page",
        "",
        "A lab of five members and a week of history (`scripts/seed-lab.py`), as the member",
        "alice sees it, at desktop and phone width. Made by `.venv/bin/python scripts/screenshots.py`;",
        "`tests/test_screenshots.py` says when the dashboard has changed since.",
        "",
    ]
    for name in PAGES:
        lines += [f"## {name}", "", f"![{name} at desktop width]({name}-desktop.png)", ""]
        lines += [f'<img src="{name}-phone.png" alt="{name} at phone width" width="260">', ""]
    lines += [f"{FINGERPRINT_LINE}`{made_from}`.", ""]
    return "\n".join(lines)
