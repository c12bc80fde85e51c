"""A login link's token must not reach a server's log: with `?token=` it went to the API
(and any reverse proxy in front of it) in the request line, and left as `Referer` on the
page's first requests. The link now carries it in the fragment, which browsers never send,
and every response says `Referrer-Policy: no-referrer`."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.stack import Stack

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_fragment_login_link_logs_in_without_sending_the_token(
    stack: Stack, make_token: Callable[..., str], open_page: Callable[..., object]
) -> None:
    url = stack.start_api()
    token = make_token("alice")
    page = open_page()
    sent: list[str] = []
    page.on("request", lambda request: sent.append(f"{request.url} {request.headers.get('referer', '')}"))
    page.goto(f"{url}/#token={token}")
    page.wait_for_selector("#who:has-text('alice')")
    assert "token" not in page.url and page.url.endswith("#/")
    assert sent and not [line for line in sent if token in line], sent
    assert httpx.get(f"{url}/").headers["referrer-policy"] == "no-referrer"
    assert httpx.get(f"{url}/api/jobs").headers["referrer-policy"] == "no-referrer"  # a 401 too
