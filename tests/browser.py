"""A real headless Chromium (Debian's package, driven by Playwright) for the dashboard tests
and the security suite's browser cases: one browser for the whole session, whichever
folder asks (tests/conftest.py registers these fixtures; two session browsers would be two
Playwright drivers on one thread, which Playwright refuses).

Every page a test opens records its console errors and uncaught exceptions; the test fails
on any of them (after the test body, so the failure names what the page said). Each test
leaves a screenshot under tests/artifacts/.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).parent / "artifacts"
"""Screenshots and logs the tests leave (tests/conftest.py makes the folder). Defined here,
not imported from conftest: bench/dashboard.py imports this module, and conftest imports it."""
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Deliberate 4xx answers (a refused spec) make Chromium log "Failed to load resource";
# those are the app working, not a page error.
EXPECTED_CONSOLE = re.compile(r"Failed to load resource: the server responded with a status of 4\d\d")


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: run scripts/setup-system --test (installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@dataclass
class PageProblems:
    errors: list[str] = field(default_factory=list)

    def console(self, message: object, unreachable_ok: bool = False) -> None:
        kind, text = message.type, message.text
        if unreachable_ok and "net::ERR_CONNECTION_REFUSED" in text:
            return  # a page a test keeps open while it stops the API
        if kind == "error" and not EXPECTED_CONSOLE.search(text):
            self.errors.append(f"console: {text}")

    def exception(self, error: object) -> None:
        self.errors.append(f"page error: {error}")


@pytest.fixture
def open_page(browser: object, request: pytest.FixtureRequest) -> Iterator[Callable[..., object]]:
    """open_page(viewport=(w, h)) -> a new page in its own browser context (own cookies);
    `unreachable_ok=True`: its requests may find the API gone (a test stops it)."""
    contexts = []
    problems = PageProblems()
    pages = []

    def open_(viewport: tuple[int, int] = (1280, 900), unreachable_ok: bool = False) -> object:
        context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
        context.set_default_timeout(20_000)
        contexts.append(context)
        page = context.new_page()
        page.on("console", lambda message: problems.console(message, unreachable_ok))
        page.on("pageerror", problems.exception)
        pages.append(page)
        return page

    yield open_
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    for i, page in enumerate(pages):
        try:
            page.screenshot(path=str(ARTIFACTS / f"{name}{'' if i == 0 else f'-{i}'}-end.png"), full_page=True)
        except Exception:  # the page may already be gone; the screenshot is only a help
            pass
    for context in contexts:
        context.close()
    assert not problems.errors, "the dashboard logged errors:\n" + "\n".join(problems.errors)


def shot(page: object, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
