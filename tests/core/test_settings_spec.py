"""Settings declared once (issue 44): every environment variable is declared in `core/settings_spec.py`,
`config/settings.py` reads them all from there, the code reads `settings.NAME` without restating a default,
and docs/configuration.md's table is the declaration's.

* the documentation's table is the one the declaration generates (the failure names the command);
* every declared setting is a Django setting of this process with the value `read` gives;
* `config/settings.py` reads no variable itself, and no project module reads a declared setting with
  `getattr(settings, NAME, default)`;
* a secret's default is never shown, a production-only variable is read only with DEBUG off, and with
  DEBUG off SECRET_KEY has no default.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import environ
import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from core import settings_doc, settings_spec
from core.env import env as process_env
from core.settings_spec import SETTINGS
from tests.local_dirs import is_local

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
NOT_PROJECT = {"tests", "bench", "migrations"}  # and the checkout's local folders (tests/local_dirs.py)


def _env(**values: str) -> environ.Env:
    """A django-environ reader of exactly `values` (not this process's environment)."""

    class Env(environ.Env):
        ENVIRON = values

    return Env()


def test_the_documentation_is_generated_from_the_declaration():
    text = DOC.read_text(encoding="utf-8")
    assert settings_doc.with_table(text) == text, (
        f"docs/configuration.md differs from core/settings_spec.py: run `{settings_doc.COMMAND}`"
    )
    for item in SETTINGS:
        assert f"| `{item.name}` |" in text, item.name


def test_every_declared_setting_is_a_django_setting_with_the_value_read():
    values = settings_spec.read(process_env)
    for item in SETTINGS:
        if item.django_name is None:
            continue
        assert hasattr(django_settings, item.django_name), item.name
        if item.production and values["DEBUG"]:
            continue
        # pytest-django and the test settings may change some values; the type is the declaration's.
        assert type(getattr(django_settings, item.django_name)) is type(values[item.name]), item.name


def test_config_settings_reads_no_variable_itself():
    source = (ROOT / "config" / "settings.py").read_text(encoding="utf-8")
    assert not re.findall(r'env\.\w+\("[A-Z_0-9]+"', source)


def _project_modules():
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if NOT_PROJECT.isdisjoint(parts) and not any(is_local(p) for p in parts):
            yield path


def test_no_module_restates_the_default_of_a_declared_setting():
    """`getattr(settings, "NAME", default)` of a declared setting hid a second default (REDACTION_MODE had
    three); the setting always exists, so it is `settings.NAME`. A default is left only for a setting this
    project does not declare (a library's, or a hook no deployment sets), named in the call."""
    declared = {item.django_name for item in SETTINGS if item.django_name}
    found = []
    for path in _project_modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) == 3
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id == "settings"
                and not (isinstance(node.args[1], ast.Constant) and node.args[1].value not in declared)
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node.args[1])}")
    assert found == []


def test_a_secrets_default_is_never_shown():
    text = DOC.read_text(encoding="utf-8")
    for item in SETTINGS:
        if not item.secret:
            continue
        default = item.default({"DEBUG": True}) if callable(item.default) else item.default
        if isinstance(default, str) and default:
            assert default not in text, item.name
        assert settings_doc.shown_default(item) == item.shown or not default, item.name


def test_production_reads_its_own_rules_and_development_does_not():
    development = settings_spec.read(_env(SECURE_HSTS_SECONDS="not a number"))
    assert development["DEBUG"] is True and "SECURE_HSTS_SECONDS" not in development
    assert development["SECRET_KEY"].startswith("django-insecure-")
    assert development["ALLOWED_HOSTS"] == ["127.0.0.1", "localhost", "[::1]"]
    assert development["REASONING_REQUIRE_OTP"] is False and development["METRICS_ALLOW_ANONYMOUS"] is True
    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY"):
        settings_spec.read(_env(DEBUG="false"))
    production = settings_spec.read(_env(DEBUG="false", SECRET_KEY="k" * 50))
    assert production["SECURE_SSL_REDIRECT"] is True and production["SECURE_HSTS_SECONDS"] == 31536000
    assert production["ALLOWED_HOSTS"] == [] and production["WEBSOCKET_REQUIRE_TLS"] is True
    assert production["REASONING_REQUIRE_OTP"] is True and production["METRICS_ALLOW_ANONYMOUS"] is False


def test_derived_defaults_follow_the_variables_they_depend_on():
    assert settings_spec.read(_env())["LLM_PROVIDER"] == "demo"
    keyed = settings_spec.read(_env(LLM_API_KEY="k", LLM_MODEL="m"))
    assert keyed["LLM_PROVIDER"] == "openai" and keyed["LLM_ROUTER_MODEL"] == keyed["LLM_GUARD_MODEL"] == "m"
    assert (
        settings_spec.read(_env(AUDIT_CHECKPOINT_INTERVAL_SECONDS="0"))["AUDIT_ANCHOR_DEADLINE_SECONDS"]
        == 120
    )
    base = settings_spec.read(
        _env(OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4318/", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="")
    )
    assert base["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == "http://c:4318/v1/traces"
    renamed = settings_spec.django_settings(
        settings_spec.read(_env(AXES_COOLOFF_MINUTES="2", CHAT_RELEASE=" Draft"))
    )
    assert renamed["AXES_COOLOFF_TIME"].total_seconds() == 120 and renamed["CHAT_RELEASE"] == "draft"
    assert "AXES_COOLOFF_MINUTES" not in renamed and "DATABASE_URL" not in renamed


def test_the_command_writes_and_checks_the_table(tmp_path, capsys):
    page = tmp_path / "configuration.md"
    page.write_text(
        f"# Title\n\nprose\n\n{settings_doc.BEGIN}\nOLD-TABLE-MARKER\n{settings_doc.END}\n\nmore prose\n"
    )
    assert settings_doc.main(["--check", str(page)]) == 1
    assert settings_doc.COMMAND in capsys.readouterr().err
    assert settings_doc.main(["--write", str(page)]) == 0
    assert settings_doc.main(["--check", str(page)]) == 0
    text = page.read_text()
    assert (
        text.startswith("# Title\n\nprose\n\n")
        and text.endswith("\n\nmore prose\n")
        and "OLD-TABLE-MARKER" not in text
    )
