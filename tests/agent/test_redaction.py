"""The redaction rules themselves (agent/redaction.py): each corpus secret is replaced by a typed, stable
placeholder, ordinary diagnosis text is left alone, the HMAC facts verify with the key and only with it."""

from __future__ import annotations

import json

import pytest

from agent.redaction import Config, Redactor, find_secrets, parse_extra_patterns, verify_hmac
from tests.agent.secrets_corpus import AWS_KEY_ID, CORPUS, DB_PASSWORD, PG, pasted_all

KEY = b"test-redaction-key-0123456789abcdef"

ORDINARY = [
    "nginx returns 502 after deploy, see [kb:nginx-502#2]",
    "MySQL max_connections reached on db-1, error 1040",
    "pod OOMKilled 3 times, memory limit 512Mi",
    "password reset emails not sent; smtp timeout",
    "chain head sha256 4bf92f3577b34da6a3ce929d0e0e4736a3ce929d0e0e47364bf92f3577b34da6 does not verify",
    "redis latency p99 1200ms at 10.0.3.4, evidence prom:9f86d081884c7d65",
    "error: token expired for user alice",
    "usage total_tokens=1234567 prompt_tokens=100 max_tokens: 4096",
    "PWD=/srv/app and secretName: mysql-secret; if password = wrong, login fails",
    "What does 'Connection refused' on port 5432 mean?",
    "磁盘使用率超过 90%，如何清理 /var/log？",
]


@pytest.mark.parametrize(("label", "text", "originals", "kind"), CORPUS, ids=[c[0] for c in CORPUS])
def test_each_secret_is_replaced_by_a_typed_placeholder(label, text, originals, kind):
    redactor = Redactor(config=Config(), key=KEY)
    out = redactor.redact(text)
    for original in originals:
        assert original not in out
    assert f"[REDACTED:{kind}#1]" in out
    facts = redactor.take()
    assert facts["counts"] and facts["keyId"] and facts["algorithm"] == "HMAC-SHA256"
    assert all(original not in str(facts) for original in originals)


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_diagnosis_text_is_unchanged(text):
    redactor = Redactor(config=Config(), key=KEY)
    assert redactor.redact(text) == text
    assert redactor.take() is None


def test_the_same_original_keeps_its_placeholder_within_the_run_and_across_a_rebuild():
    redactor = Redactor(config=Config(), key=KEY)
    first = redactor.redact(f"key {AWS_KEY_ID} and again {AWS_KEY_ID}")
    assert first == "key [REDACTED:aws-access-key#1] and again [REDACTED:aws-access-key#1]"
    other = redactor.redact("key " + "AKIA" + "ZZZZ7XZ2B6JTKPL3 too")
    assert "[REDACTED:aws-access-key#2]" in other
    rebuilt = Redactor(config=Config(), key=KEY, known=redactor.known())
    assert rebuilt.redact(f"the {AWS_KEY_ID}") == "the [REDACTED:aws-access-key#1]"
    assert "[REDACTED:aws-access-key#3]" in rebuilt.redact("AKIA" + "YYYY7XZ2B6JTKPL3")


def test_hmac_verifies_with_the_key_only():
    redactor = Redactor(config=Config(), key=KEY)
    redactor.redact(f"{PG}://u:{DB_PASSWORD}@db:5432/x")
    (item,) = redactor.take()["items"]
    assert item["kind"] == "url-password"
    assert verify_hmac(KEY, DB_PASSWORD, item["hmac"])
    assert not verify_hmac(b"another-key-0123456789abcdef01234", DB_PASSWORD, item["hmac"])
    assert not verify_hmac(KEY, DB_PASSWORD + "x", item["hmac"])


def test_mode_off_allow_list_and_extra_patterns():
    assert Redactor(config=Config(mode="off"), key=KEY).redact(pasted_all()) == pasted_all()
    allowed = Redactor(config=Config(allow_kinds=frozenset({"aws-access-key"})), key=KEY)
    assert AWS_KEY_ID in allowed.redact(f"id {AWS_KEY_ID}")
    extra = Config(extra_patterns=tuple(parse_extra_patterns([r"ticket-secret=TKT-[0-9]{6}"])))
    assert (
        Redactor(config=extra, key=KEY).redact("use TKT-123456 now") == "use [REDACTED:ticket-secret#1] now"
    )
    with pytest.raises(ValueError):
        parse_extra_patterns(["no-equals-sign"])


def test_pii_masking_is_off_by_default_and_masks_the_configured_kinds():
    text = "mail alice@example.com from 10.1.2.3 or fe80::1ff:fe23:4567:890a, call +1 415-555-0100"
    assert find_secrets(text, Config()) == []
    masked = Redactor(config=Config(pii_kinds=("email", "ipv4", "ipv6", "phone")), key=KEY).redact(text)
    assert masked == (
        "mail [REDACTED:email#1] from [REDACTED:ipv4#1] or [REDACTED:ipv6#1], call [REDACTED:phone#1]"
    )
    only_email = Redactor(config=Config(pii_kinds=("email",)), key=KEY).redact(text)
    assert "10.1.2.3" in only_email and "[REDACTED:email#1]" in only_email


def test_json_values_are_redacted_string_by_string():
    redactor = Redactor(config=Config(), key=KEY)
    value = {"rows": [{"dsn": f"{PG}://u:{DB_PASSWORD}@h/db", "n": 3}], "ok": True}
    assert redactor.redact_value(value) == {
        "rows": [{"dsn": f"{PG}://u:[REDACTED:url-password#1]@h/db", "n": 3}],
        "ok": True,
    }


def test_a_secret_spread_over_list_items_is_found():
    from tests.agent.secrets_corpus import PEM, PEM_BODY

    redactor = Redactor(config=Config(), key=KEY)
    lines = ["nginx: cannot load key", *PEM.splitlines(), "worker exited"]
    out = redactor.redact_value({"lines": lines})["lines"]
    assert len(out) == len(lines) and out[0] == lines[0] and out[-1] == "worker exited"
    assert out[1] == "[REDACTED:private-key#1]" and not any(b in "".join(out) for b in PEM_BODY)
    (item,) = redactor.take()["items"]
    assert verify_hmac(KEY, PEM, item["hmac"])


def test_an_original_met_once_is_replaced_wherever_it_repeats():
    redactor = Redactor(config=Config(), key=KEY)
    url = redactor.redact(f"{PG}://u:{DB_PASSWORD}@db/x")
    assert url == f"{PG}://u:[REDACTED:url-password#1]@db/x"
    # Bare (no detector sees it) and JSON-escaped, later in the run: the same placeholder.
    assert (
        redactor.redact(f"login failed with {DB_PASSWORD}") == "login failed with [REDACTED:url-password#1]"
    )
    from tests.agent.secrets_corpus import PEM

    redactor.redact(PEM)
    escaped = json.dumps({"key": PEM})
    assert redactor.redact(escaped) == '{"key": "[REDACTED:private-key#1]"}'


def test_checks_refuse_an_unknown_mode_a_bad_pattern_and_no_key_in_production(settings):
    from agent.checks import check_redaction

    settings.REDACTION_MODE = "enforce"
    settings.REDACTION_EXTRA_PATTERNS = []
    settings.REDACTION_DEV_KEY_FILE = None
    settings.REDACTION_HMAC_KEY = "k" * 32
    assert check_redaction() == []
    settings.REDACTION_MODE = "maybe"
    settings.REDACTION_EXTRA_PATTERNS = ["ticket=("]
    settings.REDACTION_HMAC_KEY = ""
    assert sorted(e.id for e in check_redaction()) == ["diagnosis.E003", "diagnosis.E003", "diagnosis.E004"]


def test_the_key_comes_from_the_setting_or_the_development_file(settings, tmp_path):
    from django.core.exceptions import ImproperlyConfigured

    from agent.redaction import hmac_key

    settings.REDACTION_HMAC_KEY = "x" * 40
    assert hmac_key() == b"x" * 40
    settings.REDACTION_HMAC_KEY = ""
    settings.REDACTION_DEV_KEY_FILE = tmp_path / "redaction.key"
    assert hmac_key() == hmac_key() and len(hmac_key()) == 64
    settings.REDACTION_DEV_KEY_FILE = None
    with pytest.raises(ImproperlyConfigured):
        hmac_key()


def test_a_scan_neither_reconfigures_detect_secrets_nor_verifies_a_secret(monkeypatch):
    """The keyword and high-entropy plugins run without detect-secrets' settings context (entering it
    cleared the package's caches on every scan) and never verify a finding over the network: the
    same secrets are found while both would fail the test."""
    import detect_secrets.settings
    from detect_secrets.plugins.base import BasePlugin

    def refuse(*_args, **_kwargs):
        raise AssertionError("must not be called by a scan")

    monkeypatch.setattr(detect_secrets.settings, "cache_bust", refuse)
    monkeypatch.setattr(BasePlugin, "verify", refuse)
    text = 'db_password = "Sx9$kq2Lw8vB3nRt"\ntoken: "b1946ac92492d2347c6235b4d2611184f00e6a91c8"'
    kinds = {kind for _s, _e, kind in find_secrets(text, Config())}
    assert kinds, "the keyword and high-entropy plugins still find what they found"
    assert "Sx9$kq2Lw8vB3nRt" not in Redactor().redact(text)
