"""The Tokens page in a real browser: an admin adds a member (a token for a new user, its
secret shown once, with the line that logs in with it), sets their limits and revokes the
token, the API's refusals shown beside the form in words; a member sees and makes only
their own tokens, sees which one this browser holds, and revoking it logs them out. Before,
tokens and users were the command line's alone."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.stack import Stack
from tests.web.conftest import shot

pytestmark = pytest.mark.slow


def test_an_admin_adds_a_member_sets_their_limits_and_revokes_a_token_and_a_member_sees_their_own(
    stack: Stack, make_token: Callable[..., str], add_host: Callable[..., None], open_page: Callable[..., object]
) -> None:
    url = stack.start_api()
    add_host("lab-a", 2)
    admin = open_page()
    admin.goto(f"{url}/?token={make_token('root', True)}#/tokens")
    admin.wait_for_selector("#tokens table")
    assert admin.locator("h1").inner_text() == "Tokens and users"

    made = admin.locator("#new-token")
    made.locator('input[name="user"]').fill("bob")
    made.locator('input[name="name"]').fill("laptop")
    made.locator("button[type=submit]").click()
    admin.wait_for_selector("#new-secret code.token")
    secret = admin.locator("#new-secret code.token").inner_text()
    assert secret.startswith("tq_"), secret
    assert f"towerq login {url} --token {secret}" in admin.locator("#new-secret").inner_text()
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {secret}"}) as bob:
        assert bob.get("/api/me").json() == {"user": "bob", "is_admin": False, "token_id": 2, "places_jobs": True}
    admin.wait_for_selector('#users tr[data-user="bob"]')

    limits = admin.locator("#user-limits")
    limits.locator('input[name="user"]').fill("bob")
    limits.locator('input[name="share"]').fill("-1")
    limits.locator("button[type=submit]").click()
    admin.wait_for_function("document.querySelector('#user-limits .error')?.textContent.includes('share')")
    limits.locator('input[name="user"]').fill("bob")
    limits.locator('input[name="share"]').fill("3")
    limits.locator('input[name="gpu_limit"]').fill("2")
    limits.locator('select[name="max_priority"]').select_option("low")
    limits.locator("button[type=submit]").click()
    admin.wait_for_function("document.querySelector('#users tr[data-user=\"bob\"]').textContent.includes('low')")
    cells = admin.locator('#users tr[data-user="bob"] td').all_inner_texts()
    assert cells[:5] == ["bob", "no", "2", "3", "low"], cells
    shot(admin, "tokens")

    member = open_page()
    member.goto(f"{url}/?token={secret}#/tokens")
    member.wait_for_selector("#tokens table")
    assert member.locator("h1").inner_text() == "Your tokens" and member.locator("#users").count() == 0
    assert member.locator("#user-limits").count() == 0 and member.locator('#new-token input[name="admin"]').count() == 0
    assert member.locator('#new-token input[name="user"]').input_value() == "bob"
    member.locator('#new-token input[name="name"]').fill("ci")
    member.locator("#new-token button[type=submit]").click()
    member.wait_for_selector("#new-secret code.token")
    member.wait_for_function("document.querySelectorAll('#tokens tr[data-token]').length === 2")
    assert "root" not in member.locator("#tokens").inner_text(), "a member sees their own tokens only"
    assert member.locator('#tokens tr[data-token="2"]').inner_text().find("active (this browser)") >= 0

    admin.on("dialog", lambda dialog: dialog.accept())
    admin.reload()
    admin.wait_for_selector('#tokens tr[data-token="3"]')
    admin.locator('#tokens tr[data-token="3"]').get_by_role("button", name="Revoke").click()
    admin.wait_for_selector('#tokens tr[data-token="3"][data-state="revoked"]')

    said: list[str] = []
    member.on("dialog", lambda dialog: (said.append(dialog.message), dialog.accept()))
    member.locator('#tokens tr[data-token="2"]').get_by_role("button", name="Revoke").click()
    member.wait_for_selector("form.login")  # its own session's token: logged out
    assert "you will be logged out" in said[0], said
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {secret}"}) as bob:
        assert bob.get("/api/me").status_code == 401
