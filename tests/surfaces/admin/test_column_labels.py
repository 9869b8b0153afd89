"""Every column of the console's busy lists says what its cells hold (issue 50, item 4): each header of the
run list and of the AI Ops analyses has words and an explanation (`<abbr title>`), so no column is a
bare number nobody can read (the run list's EVAL score; the analyses' alert and notification counts)."""

from __future__ import annotations

import re

import pytest

from agent.aiops import intake
from tests.factories import make_recorded_run

pytestmark = pytest.mark.django_db
HEADER = re.compile(r'<th scope="col"\s+class="([^"]*)">(.*?)</th>', re.S)


def _headers(html: str) -> dict[str, str]:
    head = html.split('<table id="result_list">', 1)[1].split("</thead>", 1)[0]
    found = {}
    for classes, cell in HEADER.findall(head):
        name = next(c for c in classes.split() if c.startswith("column-") or c == "action-checkbox-column")
        if name != "action-checkbox-column":
            found[name] = cell
    return found


@pytest.mark.parametrize(
    ("url", "columns", "explained"),
    [
        ("/admin/diagnosis/diagnosisrun/", 14, {"column-evaluation_score": ("eval score", "0 to 1")}),
        (
            "/admin/diagnosis/aiopsalert/",
            10,
            {"column-alerts": ("alerts", "firing"), "column-notified": ("notified", "Alertmanager sent")},
        ),
    ],
    ids=["runs", "aiops"],
)
def test_every_header_has_words_and_says_what_its_cells_hold(
    client, superuser, user, url, columns, explained
):
    make_recorded_run(user)
    intake.start_staff_analysis(user=user, alert={"labels": {"alertname": "DiskFull"}, "annotations": {}})
    client.force_login(superuser)
    headers = _headers(client.get(url).content.decode())
    assert len(headers) == columns, list(headers)
    for name, cell in headers.items():
        found = re.search(r'<abbr class="dc-col" title="([^"]+)">([^<]+)</abbr>', cell)
        assert found and found.group(2).strip() and len(found.group(1)) > len(found.group(2)), (name, cell)
    for name, (words, explanation) in explained.items():
        found = re.search(r'<abbr class="dc-col" title="([^"]+)">([^<]+)</abbr>', headers[name])
        assert found.group(2) == words and explanation in found.group(1), (name, headers[name])
