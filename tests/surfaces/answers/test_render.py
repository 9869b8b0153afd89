"""`surfaces.answers.render_answer`: Markdown that reads well, nothing the model writes runs, citations
open their chunk, and citations written as code stay code."""

from __future__ import annotations

import re

import pytest

from surfaces.answers import ALLOWED_TAGS, chunk_url, render_answer


def _tags(html: str) -> set[str]:
    return {name.lower() for name in re.findall(r"<([a-zA-Z][a-zA-Z0-9]*)", html)}


def test_lists_emphasis_and_paragraphs():
    html = render_answer("From the runbooks:\n\n- first **step**\n- second *step*\n\n1. one\n2. two")
    assert html == (
        "<p>From the runbooks:</p>\n<ul>\n<li>first <strong>step</strong></li>\n"
        "<li>second <em>step</em></li>\n</ul>\n<ol>\n<li>one</li>\n<li>two</li>\n</ol>"
    )


def test_code_spans_and_fenced_code_blocks_keep_their_text_escaped():
    html = render_answer(
        "Run `df -h /var/log` then:\n\n```bash\ndu -xh /var/log | sort -h > /tmp/x && echo <ok>\n```"
    )
    assert "<code>df -h /var/log</code>" in html
    assert (
        '<pre><code class="language-bash">du -xh /var/log | sort -h &gt; /tmp/x &amp;&amp; echo &lt;ok&gt;\n'
        in html
    )


def test_tables_headings_quotes_and_rules():
    html = render_answer("# Title\n\n> quoted\n\n| a | b |\n|:--|--:|\n| 1 | 2 |\n\n---")
    assert {"h1", "blockquote", "table", "thead", "tbody", "tr", "th", "td", "hr"} <= _tags(html)
    assert "style" not in html  # column alignment attributes are not on the allowlist


@pytest.mark.parametrize(
    "markdown",
    [
        "<script>alert(1)</script>",
        '<img src=x onerror="alert(1)">',
        "<img src=x onerror=alert(1)>",
        '<a href="javascript:alert(1)">x</a>',
        "<iframe src=https://evil.example></iframe>",
        "<style>body{display:none}</style>",
        "<div onclick=alert(1)>click</div>",
        "<!-- a comment --><svg onload=alert(1)>",
    ],
)
def test_raw_html_is_shown_as_text_never_as_markup(markdown):
    html = render_answer(f"Before {markdown} after")
    assert _tags(html) == {"p"}
    assert not re.search(r"<[^>]*\son\w+=", html)  # no event-handler attribute inside any tag
    assert "&lt;" in html  # the would-be tag is visible, escaped


def test_script_in_a_block_of_its_own_is_escaped_too():
    html = render_answer("<script>\nwindow.pwned = 1\n</script>\n\n<img src=x onerror=alert(1)>")
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;" in html and "&lt;img src=x onerror=alert(1)&gt;" in html


@pytest.mark.parametrize(
    "target",
    ["javascript:alert(1)", "JAVASCRIPT:alert(1)", "java\tscript:alert(1)", "vbscript:x", "data:text/html,x"],
)
def test_links_with_unsafe_schemes_are_inert(target):
    html = render_answer(f"[click]({target}) and <{target}>")
    hrefs = re.findall(r'href="([^"]*)"', html)
    assert all(href.startswith(("http://", "https://", "/")) for href in hrefs), html
    assert "javascript:" not in "".join(hrefs).lower()


def test_safe_links_are_kept_with_noopener():
    html = render_answer("[docs](https://example.org/a?b=1) and [page](/chat/) and [m](mailto:x@example.org)")
    assert '<a href="https://example.org/a?b=1" rel="noopener noreferrer">docs</a>' in html
    assert '<a href="/chat/" rel="noopener noreferrer">page</a>' in html
    assert "mailto:" not in html  # not an allowed scheme: the link loses its target


def test_bare_urls_are_not_linkified():
    assert "<a" not in render_answer("see https://example.org/x")


def test_a_citation_becomes_a_link_to_its_chunk():
    html = render_answer("Check the SQL thread [kb:mysql-replication-lag#4].")
    href = chunk_url(slug="mysql-replication-lag", ordinal=4)
    assert href == "/knowledge/mysql-replication-lag/?chunk=4#chunk-4"
    assert html == (
        f'<p>Check the SQL thread <a class="citation" href="{href}" rel="noopener noreferrer">'
        "kb:mysql-replication-lag#4</a>.</p>"
    )


def test_a_bracket_of_several_citations_links_each():
    html = render_answer("- both [kb:disk-full-var-log#2, kb:inode-exhaustion#1; kb:oom-killer#3]")
    links = re.findall(r'<a class="citation" href="([^"]+)"[^>]*>([^<]+)</a>', html)
    assert links == [
        ("/knowledge/disk-full-var-log/?chunk=2#chunk-2", "kb:disk-full-var-log#2"),
        ("/knowledge/inode-exhaustion/?chunk=1#chunk-1", "kb:inode-exhaustion#1"),
        ("/knowledge/oom-killer/?chunk=3#chunk-3", "kb:oom-killer#3"),
    ]
    assert "</a>, <a" in html and "</a>; <a" in html  # the separators the model wrote


def test_citations_in_code_stay_literal():
    html = render_answer(
        "Cite as `[kb:oom-killer#1]`:\n\n```\n[kb:oom-killer#2]\n```\n\n    [kb:oom-killer#3]"
    )
    assert "citation" not in html
    assert "<code>[kb:oom-killer#1]</code>" in html
    assert "[kb:oom-killer#2]" in html and "[kb:oom-killer#3]" in html


def test_a_citation_that_is_already_a_link_text_is_not_nested():
    html = render_answer("[kb:oom-killer#1](https://example.org/)")
    assert html.count("<a") == 1 and "citation" not in html


def test_what_is_not_an_evidence_id_is_left_alone():
    html = render_answer("[kb:Bad_Slug#1] [kb:oom-killer#0] [kb:oom-killer] [see kb:oom-killer#1] [kb:a#1,]")
    assert "citation" not in html


def test_cjk_text_and_citations():
    html = render_answer(
        "根据运行手册：\n- 检查 `INFO clients` 的连接数 [kb:redis-connection-timeout-zh#2]。\n- 磁盘延迟"
    )
    assert "根据运行手册：" in html and "<code>INFO clients</code>" in html
    assert (
        '<a class="citation" href="/knowledge/redis-connection-timeout-zh/?chunk=2#chunk-2" '
        'rel="noopener noreferrer">kb:redis-connection-timeout-zh#2</a>。'
    ) in html


def test_the_demo_answer_shape_renders_as_a_list_with_links():
    answer = (
        "From the runbooks:\n- Free space with `journalctl --vacuum-size=500M`. [kb:disk-full-var-log#3]\n"
        "- Find deleted but open files with lsof. [kb:disk-full-var-log#3]"
    )
    html = render_answer(answer)
    assert html.startswith("<p>From the runbooks:</p>\n<ul>") and html.count('class="citation"') == 2


def test_only_allowlisted_tags_ever_come_out():
    markdown = "# a\n\n## b\n\n### c\n\n#### d\n\n##### e\n\n![img](https://example.org/x.png)\n\nx  \ny"
    assert _tags(render_answer(markdown)) <= ALLOWED_TAGS


def test_empty_content_and_caching():
    assert render_answer("") == ""
    render_answer.cache_clear()
    render_answer("cached [kb:oom-killer#1]")
    render_answer("cached [kb:oom-killer#1]")
    info = render_answer.cache_info()
    assert (info.hits, info.misses) == (1, 1) and info.maxsize is not None
