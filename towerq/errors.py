"""What the client raises: every error is a `TowerqError` whose message is for people."""

from __future__ import annotations

from typing import Any

from towerq.contract.api import field_of


class TowerqError(Exception):
    """Anything the client could not do; the message is for people."""


class UnreachableError(TowerqError):
    """The API did not answer (after the retries)."""


class ApiError(TowerqError):
    """The API answered with an error: `status`, `detail` (the message, each problem naming
    its field: `hyperparameters.steps: Input should be greater than 0`) and `errors` (the
    API's problems as it sent them, each a `{loc, msg, ...}` dict; empty when it sent one
    message)."""

    def __init__(self, status: int, detail: Any) -> None:
        self.status = status
        self.errors: list[Any] = detail if isinstance(detail, list) else []
        self.detail = describe(detail)
        super().__init__(f"{status}: {self.detail}")


class AuthError(ApiError):
    """401: no token, or one the API does not know (or has revoked); `refused`: the API
    refused the one sent (its message then says what to do)."""

    def __init__(self, status: int, detail: Any, refused: bool = False) -> None:
        super().__init__(status, detail)
        if refused:
            hint = (
                "this API does not take the token (revoked, or another API's); "
                "`towerq login URL --token TOKEN` saves another"
            )
            self.args = (f"{self.args[0]}: {hint}",)


class MissingPackageError(TowerqError):
    """An optional package the call needs is not installed; the message says which."""


def describe(detail: Any) -> str:
    """The API's `detail` in words: its message, or each refused field's (`field: message`)."""
    if not isinstance(detail, list):
        return str(detail)
    return "; ".join(_problem(d) if isinstance(d, dict) else str(d) for d in detail)


def _problem(problem: dict[str, Any]) -> str:
    """`field.path: message` (the API's message says its field first already)."""
    message = str(problem.get("msg", problem))
    field = field_of(problem.get("loc") or [])
    return f"{field}: {message}" if field and not message.startswith(field) else message
