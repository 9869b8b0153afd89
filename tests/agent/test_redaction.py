"""The redaction rules themselves (agent/redaction.py): each corpus secret is replaced by a typed, stable
placeholder, ordinary diagnosis text is left alone, the HMAC facts verify with the key and only with it."""

from __future__ import annotations

import pytest

from agent.redaction import Config, Redactor, find_secrets, parse_extra_patterns, verify_hmac
from tests.agent.secrets_corpus import AWS_KEY_ID, CORPUS, DB_PASSWORD, pasted_all

KEY = b"test-redaction-key-0123456789abcdef"

ORDINARY = [
    "nginx returns 502 after deploy, see [kb:nginx-502#2]",
    "MySQL max_connections reached on db-1, error 1040",
    "pod OOMKilled 3 times, memory limit 512Mi",
    "password reset emails not sent; smtp timeout",
    "chain head sha256 4bf92f3577b34da6a3ce929d0e0e4736a3ce929d0e0e47364bf92f3577b34da6 does not verify",
    "redis latency p99 1200ms at 10.0.3.4, evidence prom:9f86d081884c7d65",
    "error: token expired for user alice",
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
    other = redactor.redact("key AKIAZZZZ7XZ2B6JTKPL3 too")
    assert "[REDACTED:aws-access-key#2]" in other
    rebuilt = Redactor(config=Config(), key=KEY, known=redactor.known())
    assert rebuilt.redact(f"the {AWS_KEY_ID}") == "the [REDACTED:aws-access-key#1]"
    assert "[REDACTED:aws-access-key#3]" in rebuilt.redact("AKIAYYYY7XZ2B6JTKPL3")


def test_hmac_verifies_with_the_key_only():
    redactor = Redactor(config=Config(), key=KEY)
    redactor.redact(f"postgres://u:{DB_PASSWORD}@db:5432/x")
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
    value = {"rows": [{"dsn": f"postgres://u:{DB_PASSWORD}@h/db", "n": 3}], "ok": True}
    assert redactor.redact_value(value) == {
        "rows": [{"dsn": "postgres://u:[REDACTED:url-password#1]@h/db", "n": 3}],
        "ok": True,
    }
