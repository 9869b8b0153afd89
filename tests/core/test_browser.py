"""The Content-Security-Policy in a real browser, and injection strings shown as text.

Debian's headless Chromium (Playwright, never a downloaded browser) against a daphne subprocess on the
test database with the local fake provider. Every page records `securitypolicyviolation` events (an
init script, which CSP does not govern) and the console's CSP messages. The staff member logs in, asks
the chat page a question that is an SQL and HTML injection string, gets an answer that carries HTML, and
opens the run in the admin, then the admin's run list and the Swagger UI: no CSP violation anywhere,
every page works (the answer streams and is released, the waterfall and timeline render, Swagger lists
the API), and the injected markup is text — no element, no script run. A last page checks that the
detector does catch a violation (an inline script injected at run time is refused and reported).
Screenshots go to `test-artifacts/`.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from io import StringIO
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.core.management import call_command
from django.db import connection

from diagnosis.models import DiagnosisRun, RunStatus
from tests.browser import launch_chromium, requires_chromium
from tests.fakes.openai_server import FakeLLMServer
from tests.surfaces.admin.support import grant_console
from tests.surfaces.chat.support import (
    AGENT_MODEL,
    ARTIFACTS,
    EVIDENCE_ID,
    DaphneServer,
    ScriptedProvider,
    wait_for,
)

pytestmark = [pytest.mark.browser, requires_chromium, pytest.mark.django_db(transaction=True)]

PASSWORD = "pw-staff-1"
TIMEOUT_MS = 20_000
QUESTION = "nginx 502? '); DROP TABLE diagnosis_run; -- <img src=x onerror=\"window.__pwned='q'\">"
ANSWER_HTML = "<script>window.__pwned='a'</script><b>bold</b><img src=x onerror=\"window.__pwned='i'\">"

COLLECT_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push({directive: e.violatedDirective, blocked: e.blockedURI, sample: e.sample});
});
"""


class HtmlAnsweringProvider(ScriptedProvider):
    """The chat tests' scripted provider, whose cited answer also carries HTML."""

    def __call__(self, request):
        if request.model == AGENT_MODEL and any(m.get("role") == "tool" for m in request.messages):
            tools = " ".join(str(m.get("content") or "") for m in request.messages if m.get("role") == "tool")
            self.answer = f"Check the upstream port [{EVIDENCE_ID.search(tools).group(0)}]. {ANSWER_HTML}"
        return super().__call__(request)


@pytest.fixture
def provider():
    with FakeLLMServer() as server:
        scripted = HtmlAnsweringProvider(tools=(("lookup_knowledge", {"query": "nginx 502 upstream"}),))
        server.handler = scripted
        scripted.base_url = server.base_url
        yield scripted


@pytest.fixture
def site(provider, staff_user):
    staff_user.password = PBKDF2PasswordHasher().encode(PASSWORD, "browser-salt", iterations=1000)
    staff_user.save(update_fields=["password"])
    grant_console(staff_user)
    call_command("load_knowledge", "runbooks", stdout=StringIO())
    server = DaphneServer(
        env={**provider.env(provider.base_url), "RUN_SWEEP_INTERVAL_SECONDS": "0"}, name="csp"
    ).start()
    yield server
    server.stop()


def _read(fn):
    """A database read outside Playwright's event loop, on a connection of its own that is closed after
    (Django refuses sync ORM calls inside the loop)."""

    def call():
        try:
            return fn()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


@pytest.fixture
def browser_context(site):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.add_init_script(COLLECT_VIOLATIONS)
        yield context
        context.close()
        browser.close()


class Watched:
    """A page with its CSP console messages; `violations()` adds the DOM events."""

    def __init__(self, context):
        self.page = context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.console: list[str] = []
        self.page.on(
            "console",
            lambda message: (
                self.console.append(message.text) if "Content Security Policy" in message.text else None
            ),
        )

    def violations(self) -> list:
        return self.console + self.page.evaluate("window.__csp")


def test_chat_admin_and_docs_work_under_the_policy_and_show_injection_as_text(
    browser_context, site, provider, staff_user
):
    ARTIFACTS.mkdir(exist_ok=True)
    w = Watched(browser_context)
    page = w.page
    page.goto(f"{site.url}/admin/login/?next=/chat/")
    page.fill("#id_username", staff_user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(lambda url: urlsplit(url).path == "/chat/")
    policy = page.evaluate("fetch('/chat/').then(r => r.headers.get('content-security-policy'))")
    assert "script-src 'self'" in policy and "'unsafe-inline'" not in policy

    # The chat page: an injection question, an answer carrying HTML, streamed and released.
    page.fill("#query", QUESTION)
    page.click("#ask")
    turn = page.locator(".turn").last
    wait_for(lambda: turn.get_attribute("data-finished") == "true", 20, message="the outcome")
    run_id = turn.get_attribute("data-run-id")
    run = _read(lambda: DiagnosisRun.objects.get(run_id=run_id))
    assert run.status == RunStatus.SUCCESS and run.release_decision == "PUBLISHED"
    assert run.query == QUESTION and ANSWER_HTML in run.content
    assert turn.locator(".question").inner_text() == QUESTION
    # Rendered (the outcome's contentHtml): the citation is a link, the model's HTML is text.
    content = turn.locator(".content")
    assert content.inner_text() == re.sub(r"\[(kb:[^\]]+)\]", r"\1", run.content)
    assert content.locator("a.citation").count() == 1
    assert turn.locator("img, script, b").count() == 0
    assert page.evaluate("window.__pwned") is None
    page.screenshot(path=str(ARTIFACTS / "csp-chat-injection.png"), full_page=True)
    assert w.violations() == []

    # The admin's run page, from the chat's link: it works (waterfall, timeline) and shows text.
    page.goto(site.url + turn.locator(".admin-link").get_attribute("href"))
    assert re.search(rf"/admin/diagnosis/diagnosisrun/{run.pk}/change/", page.url)
    assert page.locator("#timeline tr.dc-ev").count() == run.expected_events
    assert page.locator("#waterfall .dc-wf-bar").count() >= 3
    bar = page.locator("#waterfall .dc-wf-bar").first.bounding_box()
    assert bar and bar["width"] > 0  # the inline style attributes of the waterfall were applied
    body = page.locator("body").inner_text()
    assert QUESTION in body
    assert page.locator("#content img[src=x], #content script:not([src])").count() == 0
    assert page.evaluate("window.__pwned") is None
    page.screenshot(path=str(ARTIFACTS / "csp-admin-run.png"), full_page=True)
    assert w.violations() == []

    # The run list (search by the injection's words) and the Swagger UI.
    page.goto(f"{site.url}/admin/diagnosis/diagnosisrun/?q=DROP+TABLE")
    assert page.locator("#result_list tbody tr").count() == 1
    assert w.violations() == []
    page.goto(f"{site.url}/api/docs/")
    page.locator(".swagger-ui .opblock").first.wait_for()
    assert page.locator(".swagger-ui .opblock").count() >= 9
    page.screenshot(path=str(ARTIFACTS / "csp-swagger.png"))
    assert w.violations() == []

    # The detector works: an inline script added at run time is refused and reported.
    probe = Watched(browser_context)
    probe.page.goto(f"{site.url}/chat/")
    probe.page.evaluate(
        "() => { const s = document.createElement('script'); s.textContent = 'window.__ran = 1';"
        " document.body.appendChild(s); }"
    )
    wait_for(lambda: probe.violations(), 5, message="the CSP violation report")
    assert probe.page.evaluate("window.__ran") is None
    assert any("script-src" in str(v) for v in probe.violations())
