"""The docs stay true: the generated reference pages match the code (job spec, REST
routes, CLI), every page the index names exists, and the README links the docs."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.stack import REPO


def test_the_generated_reference_pages_are_current() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "docs.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_every_linked_page_exists() -> None:
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(((?:docs/)?[a-z-]+\.md)\)", page.read_text()):
            base = page.parent
            assert (base / target).is_file(), f"{page.name} links {target}"
    assert "docs/README.md" in (REPO / "README.md").read_text()
