"""The dashboard tests' fixtures live in tests/browser.py (shared with tests/security/)."""

from tests.browser import shot

__all__ = ["shot"]
