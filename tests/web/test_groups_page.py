"""The Groups page in a real browser: an admin creates a group, puts a member in it and
keeps GPUs for it, the API's refusals shown beside the form in words; a member reads the
same without the forms; the Usage page shows the fair-share tree once there are groups."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from service.core.db import Database
from tests.service.api.test_usage import add_run
from tests.stack import Stack
from tests.web.conftest import shot

pytestmark = pytest.mark.slow


def test_admins_make_groups_and_reservations_and_members_read_them(
    stack: Stack,
    db: Database,
    make_token: Callable[..., str],
    add_host: Callable[..., None],
    open_page: Callable[..., object],
) -> None:
    url = stack.start_api()
    add_host("lab-a", 4)
    member_token = make_token("alice")
    admin = open_page()
    admin.goto(f"{url}/?token={make_token('root', True)}#/groups")
    admin.wait_for_selector("#groups table")
    assert "No groups yet" in admin.locator("#groups").inner_text()
    assert "No reservation ahead" in admin.locator("#reservations").inner_text()

    form = admin.locator("#new-group")
    form.locator('input[name="name"]').fill("Vision!")
    form.locator("button[type=submit]").click()
    admin.wait_for_function("document.querySelector('#new-group .error')?.textContent.includes('name')")
    form.locator('input[name="name"]').fill("vision")
    form.locator('input[name="share"]').fill("2")
    form.locator('input[name="max_gpus"]').fill("3")
    form.locator("button[type=submit]").click()
    admin.wait_for_selector('#groups tr[data-group="vision"]')
    row = admin.locator('#groups tr[data-group="vision"] td').all_inner_texts()
    assert row[:3] == ["vision", "2", "3 max"]

    members = admin.locator("#add-member")
    members.locator('select[name="group"]').select_option("vision")
    members.locator('input[name="user"]').fill("alice")
    members.locator('input[name="default"]').check()
    members.locator("button[type=submit]").click()
    admin.wait_for_function(
        "document.querySelector('#groups tr[data-group=\"vision\"]').textContent.includes('alice (default)')"
    )

    keep = admin.locator("#new-reservation")
    keep.locator('select[name="group"]').select_option("vision")
    keep.locator('input[name="gpus"]').fill("9")
    keep.locator('input[name="note"]').fill("CVPR deadline")
    keep.locator("button[type=submit]").click()
    admin.wait_for_function("document.querySelector('#new-reservation .error')?.textContent.includes('gpus')")
    assert "the lab has 4" in keep.locator(".error").inner_text()
    keep.locator('input[name="gpus"]').fill("2")
    keep.locator("button[type=submit]").click()
    admin.wait_for_selector("#reservations tr[data-reservation]")
    cells = admin.locator("#reservations tbody tr").first.locator("td").all_inner_texts()
    assert cells[1:3] == ["vision", "lab-a 0, 1"] and cells[4] == "ahead" and cells[5] == "CVPR deadline"
    shot(admin, "groups")
    admin.goto(f"{url}/#/gpus")  # a kept GPU is not shown as free to everyone
    admin.wait_for_selector(".reserved[data-reservation]")
    assert admin.locator(".reserved").count() == 2
    assert admin.locator(".reserved").first.inner_text().startswith("reserved for vision from ")
    admin.goto(f"{url}/#/groups")

    member = open_page()
    member.goto(f"{url}/?token={member_token}#/groups")
    member.wait_for_selector('#groups tr[data-group="vision"]')
    member.wait_for_selector("#reservations tr[data-reservation]")
    assert member.locator("form").count() == 0  # the forms are the admins'
    assert member.locator("#reservations button").count() == 0
    spec = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 5}}
    submitted = member.evaluate(
        "spec => fetch('api/jobs', {method: 'POST', headers: {'Content-Type': 'application/json'},"
        " body: JSON.stringify(spec)}).then(r => r.json())",
        spec,
    )
    assert submitted["group"] == "vision"  # her default group
    now = datetime.now(UTC)
    add_run(db, "alice", "lab-a", [2], now - timedelta(hours=3), now - timedelta(hours=3), now, group="vision")
    add_run(db, "bob", "lab-a", [3], now - timedelta(hours=2), now - timedelta(hours=2), None)
    member.goto(f"{url}/#/usage")
    member.wait_for_selector('#fair-share table.fair-share-groups tr[data-group="vision"]')
    assert member.locator('#fair-share table.fair-share tr[data-user="alice"][data-group="vision"]').count() == 1
    assert member.locator("#chart-gpus-per-user").get_attribute("data-users") == "alice,bob"
    member.click('#per-what a:text("per group")')
    member.wait_for_url("**/#/usage?window=day&by=group")
    member.wait_for_function("document.querySelector('#chart-gpus-per-user')?.dataset.users === '(no group),vision'")
    assert "GPUs in use per group" in member.locator("#chart-gpus-per-user figcaption").inner_text()
    member.goto(f"{url}/#/jobs/{submitted['id']}")
    member.wait_for_selector(".summary")
    assert "alice · group vision" in member.locator(".summary").first.inner_text()

    admin.on("dialog", lambda dialog: dialog.accept())
    admin.locator("#reservations button.danger").first.click()
    admin.wait_for_function("document.querySelector('#reservations')?.textContent.includes('No reservation ahead')")
