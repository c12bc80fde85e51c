"""docs/screenshots/ shows the dashboard as it is: every page at both widths is there, and
the pictures were made from the dashboard's current files (else: say how to remake them)."""

from __future__ import annotations

import re

from tests.screenshots import FINGERPRINT_LINE, FOLDER, PAGES, VIEWPORTS, fingerprint

REMAKE = "run `.venv/bin/python scripts/screenshots.py` (about 20 s) and commit docs/screenshots/"


def test_every_page_has_its_pictures_at_both_widths() -> None:
    missing = [
        f"{page}-{width}.png" for page in PAGES for width in VIEWPORTS if not (FOLDER / f"{page}-{width}.png").is_file()
    ]
    assert not missing, f"docs/screenshots/ lacks {', '.join(missing)}: {REMAKE}"
    index = (FOLDER / "README.md").read_text()
    assert all(f"({page}-desktop.png)" in index for page in PAGES)


def test_the_pictures_were_made_from_the_current_dashboard() -> None:
    found = re.search(re.escape(FINGERPRINT_LINE) + r"`([0-9a-f]+)`", (FOLDER / "README.md").read_text())
    assert found, f"docs/screenshots/README.md names no fingerprint: {REMAKE}"
    assert found.group(1) == fingerprint(), f"the dashboard changed since docs/screenshots/ were made: {REMAKE}"
