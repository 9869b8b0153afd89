"""The accessibility check of the browser tests: axe-core (its `axe.min.js`, shipped inside the pinned
PyPI package `axe-playwright-python`, so nothing is downloaded) run in the page under test, in Chromium.

`violations(page)` injects axe-core and returns the violations of the WCAG 2.x A and AA rules (and
axe's best practices) with impact "serious" or "critical"; `assert_accessible(page, what)` fails with
each rule, its help text and the first offending elements. Injection goes through the DevTools protocol
(`page.evaluate`), which the pages' `script-src 'self'` CSP does not apply to."""

from __future__ import annotations

from functools import cache
from importlib import resources

BLOCKING_IMPACTS = ("serious", "critical")
RUN_OPTIONS = {
    "runOnly": {"type": "tag", "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]},
    "resultTypes": ["violations"],
}


@cache
def axe_source() -> str:
    return resources.files("axe_playwright_python").joinpath("axe.min.js").read_text(encoding="utf-8")


def violations(page) -> list[dict]:
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.evaluate(axe_source())
    result = page.evaluate("options => window.axe.run(document, options)", RUN_OPTIONS)
    return [v for v in result["violations"] if v.get("impact") in BLOCKING_IMPACTS]


def describe(found: list[dict]) -> str:
    lines = []
    for v in found:
        targets = [", ".join(node["target"]) for node in v["nodes"][:3]]
        lines.append(f"{v['impact']} {v['id']}: {v['help']} ({len(v['nodes'])} element(s): {targets})")
        first = v["nodes"][0]
        why = (first.get("any") or first.get("all") or first.get("none") or [{}])[0].get("message", "")
        lines.append(f"  first: {first.get('html', '')[:200]} — {why}")
    return "\n".join(lines)


def assert_accessible(page, what: str) -> None:
    found = violations(page)
    assert not found, f"{what} ({page.url}):\n{describe(found)}"
