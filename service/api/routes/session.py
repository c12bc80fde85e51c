"""Who am I, and the dashboard's login: a token exchanged for a same-site session cookie."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service.api.deps import SESSION_COOKIE, CallerDep, ExecutorDep, bearer_token
from service.core.schemas.lab import Me
from service.executors import Executor
from service.lab.auth import Caller

router = APIRouter(prefix="/api", tags=["session"])


@router.get("/me", response_model=Me)
def me(caller: CallerDep, executor: ExecutorDep) -> Me:
    """The user the token belongs to (and whether towerq places jobs itself)."""
    return me_of(caller, executor)


@router.post("/session", response_model=Me)
def login(caller: CallerDep, executor: ExecutorDep, request: Request, response: Response) -> Me:
    """Keep the bearer token in an HttpOnly, same-site cookie for this browser session."""
    token = bearer_token(request)
    assert token is not None  # the caller dependency already checked it
    # Secure over HTTPS (behind a proxy: the forwarded scheme), scoped to where towerq is served.
    response.set_cookie(
        SESSION_COOKIE,
        token,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=cookie_path(request),
    )
    return me_of(caller, executor)


@router.delete("/session", status_code=204)
def logout(request: Request, response: Response) -> None:
    """Forget the session cookie."""
    response.delete_cookie(SESSION_COOKIE, path=cookie_path(request))


def me_of(caller: Caller, executor: Executor) -> Me:
    return Me(user=caller.name, is_admin=caller.is_admin, token_id=caller.token_id, places_jobs=executor.places_jobs)


def cookie_path(request: Request) -> str:
    """`/`, or the prefix a reverse proxy serves towerq under (`TOWERQ_ROOT_PATH`)."""
    return str(request.scope.get("root_path") or "").rstrip("/") + "/"
