"""The version of the rules a job spec is admitted under.

The API validates a spec when it is submitted, stores it with the rules' version
(`jobs.spec_version`), and the worker validates it again when an attempt starts (the
trainer's input is built from it). Between the two, towerq may be upgraded: a rule made
stricter then would fail a job the lab accepted, perhaps days ago, at its start. So a change
that could refuse a spec admitted before bumps `SPEC_VERSION`, and is written to spare the
specs admitted under earlier versions:

- a new or stricter check in a validator runs only `if applies(info, since=N)`;
- a field renamed or reshaped gets an entry in `UPGRADES`: version N's function turns a
  stored spec of version N-1 into N's form before it is validated.

A constraint in a `Field` (`le=...`) cannot ask which version admitted the spec: make it
stricter in a validator instead. A spec admitted by a newer towerq than the worker reading
it (a worker not upgraded yet) is refused with that said (`NewerSpecError`): the older rules
may not read its fields as they were meant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationInfo

SPEC_VERSION = 1
ADMITTED_UNDER = "admitted_under"
"""The validation context's key for the version a stored spec was admitted under."""

UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}
"""Version N: a stored spec of version N-1 in version N's form."""


class NewerSpecError(ValueError):
    """A stored spec was admitted under rules newer than this towerq's."""


def applies(info: ValidationInfo, since: int) -> bool:
    """Whether a rule added in version `since` applies: always to a spec being submitted,
    and to a stored one admitted under `since` or later."""
    admitted = (info.context or {}).get(ADMITTED_UNDER)
    return admitted is None or admitted >= since


def upgraded(stored: dict[str, Any], version: int) -> dict[str, Any]:
    """A stored spec of `version` in today's form."""
    if version > SPEC_VERSION:
        raise NewerSpecError(
            f"the job was admitted under version {version} of the spec's rules and this towerq knows up to "
            f"{SPEC_VERSION}: upgrade this worker"
        )
    for step in range(version + 1, SPEC_VERSION + 1):
        if step in UPGRADES:
            stored = UPGRADES[step](stored)
    return stored
