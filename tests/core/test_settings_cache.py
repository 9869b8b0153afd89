"""`core.settings_cache.built_from_settings`: built once, again after a watched setting changed, never
kept when the build raised; and the two users (write keys, reasoning keyring) follow their settings."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet

from core import writeauth
from core.settings_cache import built_from_settings
from reasoning import crypto


def _counting(setting: str):
    calls: list[object] = []

    @built_from_settings(setting)
    def build() -> object:
        from django.conf import settings

        calls.append(getattr(settings, setting, None))
        return object()

    return build, calls


def test_built_once_until_a_watched_setting_changes(settings):
    settings.CACHED_THING = "a"
    build, calls = _counting("CACHED_THING")
    first = build()
    assert build() is first and build() is first
    assert calls == ["a"]

    settings.UNRELATED_THING = "x"  # another setting: kept
    assert build() is first and calls == ["a"]

    settings.CACHED_THING = "b"
    second = build()
    assert second is not first and build() is second
    assert calls == ["a", "b"]


def test_a_build_that_raises_keeps_nothing(settings):
    attempts = []

    @built_from_settings("CACHED_THING")
    def build() -> str:
        attempts.append(1)
        raise RuntimeError("no key")

    for _ in range(3):
        with pytest.raises(RuntimeError, match="no key"):
            build()
    assert len(attempts) == 3


def test_forget_drops_the_value(settings):
    build, calls = _counting("CACHED_THING")
    first = build()
    build.forget()
    assert build() is not first and len(calls) == 2


def test_each_function_follows_its_settings_even_under_one_name(settings):
    """Two functions made by one factory share a qualified name; each is forgotten on its own."""
    settings.CACHED_THING = "a"
    first_build, first_calls = _counting("CACHED_THING")
    second_build, second_calls = _counting("CACHED_THING")
    first_build(), second_build()
    settings.CACHED_THING = "b"
    first_build(), second_build()
    assert first_calls == ["a", "b"] and second_calls == ["a", "b"]


def test_the_write_keys_and_the_keyring_follow_their_settings(settings):
    settings.AUDIT_WRITE_KEYS = [writeauth.generate_key_text()]
    before = writeauth.verifier()
    assert writeauth.verifier() is before
    settings.AUDIT_WRITE_KEYS = [writeauth.generate_key_text()]
    after = writeauth.verifier()
    assert after is not before and after.tag("run", "00" * 32) != before.tag("run", "00" * 32)

    settings.REASONING_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    ring = crypto.keyring()
    assert crypto.keyring() is ring
    new_key = Fernet.generate_key().decode()
    settings.REASONING_ENCRYPTION_KEYS = [new_key]
    assert crypto.keyring() is not ring
    assert crypto.keyring().kids[0] == crypto.key_id(new_key)
