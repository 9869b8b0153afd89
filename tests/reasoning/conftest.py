"""Fixtures of the reasoning-governance tests."""

import pytest
from django.core.cache import cache


@pytest.fixture(autouse=True)
def _no_throttle_state():
    """Reasoning reads are throttled through the cache: every test starts and ends with none counted."""
    cache.clear()
    yield
    cache.clear()
