"""Fixtures of the transparency log tests: a configured signing key (not the development file)."""

import pytest

from audit.transparency import keys


@pytest.fixture
def signing_key(settings):
    """One configured Ed25519 signing key (its text, as AUDIT_SIGNING_KEYS holds it)."""
    text = keys.generate_key_text()
    settings.AUDIT_SIGNING_KEYS = [text]
    settings.AUDIT_VERIFY_KEYS = []
    return text
