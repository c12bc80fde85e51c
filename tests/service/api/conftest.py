from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.core.settings import Settings


class Api:
    """A TestClient that sends one user's token."""

    def __init__(self, client: TestClient, token: str) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {token}"}

    def get(self, path: str, **kwargs: object):
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return self.client.get(path, headers=headers, **kwargs)

    def post(self, path: str, **kwargs: object):
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return self.client.post(path, headers=headers, **kwargs)

    def patch(self, path: str, **kwargs: object):
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return self.client.patch(path, headers=headers, **kwargs)

    def put(self, path: str, **kwargs: object):
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return self.client.put(path, headers=headers, **kwargs)

    def delete(self, path: str, **kwargs: object):
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return self.client.delete(path, headers=headers, **kwargs)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture
def as_user(client: TestClient, make_token: Callable[..., str]) -> Callable[..., Api]:
    def make(user: str = "alice", admin: bool = False) -> Api:
        return Api(client, make_token(user, admin))

    return make


@pytest.fixture
def alice(as_user: Callable[..., Api], add_host: Callable[..., None]) -> Api:
    add_host("lab-a", 4)
    return as_user("alice")
