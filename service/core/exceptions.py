"""Exceptions raised where a problem is found; the API layer maps them to HTTP statuses."""

from __future__ import annotations

from towerq.contract.attempts import StaleAttempt


class TowerqError(Exception):
    """Base of every towerq error."""


class NotFoundError(TowerqError):
    """The job, host, user or token asked for does not exist."""


class StateConflictError(TowerqError):
    """The job is in a state that does not allow what was asked (cancel a finished job)."""


class ForbiddenError(TowerqError):
    """The caller may not do this to this object."""


class TooManyError(TowerqError):
    """The caller holds as many of something (streams, queued jobs) as a limit allows (429)."""


class NotReadyError(TowerqError):
    """What was asked for is coming but not there yet (a notebook session starting): 503, try again."""


class AuthError(TowerqError):
    """No token, or a token that is unknown or revoked."""


class StaleAttemptError(TowerqError, StaleAttempt):
    """A worker reported for an attempt of a job that has since moved on (fencing); the
    attempt protocol's `StaleAttempt` (`towerq.contract.attempts`)."""


class SpecError(TowerqError):
    """A job spec that is well-formed but cannot run here; `field` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class TooLargeError(SpecError):
    """An upload over one of its limits (HTTP 413); `field` names the culprit."""
