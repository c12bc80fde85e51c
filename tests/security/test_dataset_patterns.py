"""A member's dataset pattern must not reach another member's uploads: the owner check
read the pattern's letters (`users/<owner>/`), so `tfrecord:u*/alice/cells/*.tfrecord`
passed it and, without the sandbox, trained on alice's data."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.service.api.conftest import Api

RECORDS = {"model": "mlp", "gpus": [0], "dataset_options": {"classes": 3}}


@pytest.mark.parametrize(
    "pattern",
    ["u*/alice/cells/*.tfrecord", "*/alice/cells/*.tfrecord", "[u]sers/alice/cells/*.tfrecord",
     "users/*/cells/*.tfrecord", "users/a?ice/cells/*.tfrecord", "use?s/*/cells/x.tfrecord"],
)  # fmt: skip
def test_a_pattern_that_could_reach_another_members_upload_is_refused(
    as_user: Callable[..., Api], add_host: Callable[..., None], pattern: str
) -> None:
    add_host("lab-a", 2)
    refused = as_user("bob").post("/api/jobs", json={**RECORDS, "dataset": f"tfrecord:{pattern}"})
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["msg"].startswith("dataset: "), refused.text


def test_a_pattern_over_ones_own_uploads_or_the_shared_data_is_fine(
    as_user: Callable[..., Api], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 2)
    bob = as_user("bob")
    for pattern in ("users/bob/cells/*.tfrecord", "shared/cells-*.tfrecord"):
        created = bob.post("/api/jobs", json={**RECORDS, "dataset": f"tfrecord:{pattern}"})
        assert created.status_code == 201, (pattern, created.text)
