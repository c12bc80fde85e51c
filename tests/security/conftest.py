"""The attack suite shares the API fixtures (an app on a real database, tokens, hosts)."""

from tests.service.api.conftest import alice, as_user, client  # noqa: F401 - fixtures
from tests.web.conftest import browser, open_page  # noqa: F401 - fixtures
