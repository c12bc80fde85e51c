"""The attack suite shares the API fixtures (an app on a real database, tokens, hosts)."""

from tests.service.api.conftest import alice, as_user, client  # noqa: F401 - fixtures
