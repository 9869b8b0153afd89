"""The knowledge loader: front matter, chunking rules, `manage.py load_knowledge` and the upsert service."""

import re
from io import StringIO
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from agent.knowledge import ingest
from agent.knowledge.ingest import MAX_CHUNK_CHARS, MIN_CHUNK_CHARS, chunk_markdown, parse_markdown
from diagnosis.models import KnowledgeChunk, KnowledgeDocument

RUNBOOKS = Path(__file__).resolve().parents[3] / "runbooks"
FENCE = "```"


def paragraph(word: str, chars: int) -> str:
    """A prose paragraph of about `chars` characters made of sentences mentioning `word`."""
    sentence = f"The {word} check reports a value that operators compare with the threshold. "
    return (sentence * (chars // len(sentence) + 1))[:chars].rsplit(" ", 1)[0] + "."


def load(directory, *extra) -> str:
    out = StringIO()
    call_command("load_knowledge", str(directory), *extra, stdout=out)
    return out.getvalue()


def write(
    directory: Path, name: str, *, title="Disk alarm", tags="[disk, linux]", summary="", body=""
) -> Path:
    path = directory / name
    path.write_text(
        f"---\ntitle: {title}\ntags: {tags}\nsummary: {summary}\n---\n\n{body}\n", encoding="utf-8"
    )
    return path


# ---------------------------------------------------------------------------------------------------
# Front matter
# ---------------------------------------------------------------------------------------------------
def test_front_matter_fields_and_body():
    doc = parse_markdown(
        "\ufeff---\r\ntitle: 'Redis: connection timeout'\r\ntags: [redis, \"连接超时\", timeout, ]\r\n"
        "summary: Why clients time out.\r\n---\r\n\r\nFirst paragraph.\r\n\r\n## Symptoms\r\nSlow.\r\n"
    )
    assert doc.title == "Redis: connection timeout"
    assert doc.tags == ["redis", "连接超时", "timeout"]
    assert doc.summary == "Why clients time out."
    assert doc.language is None
    assert doc.body == "First paragraph.\n\n## Symptoms\nSlow."


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("title: x\n\nbody", "must start with"),
        ("---\ntitle: x\nbody", "not closed"),
        ("---\ntitle: x\nowner: ops\n---\nbody", "Unknown front matter key 'owner'"),
        ("---\ntags: [a]\n---\nbody", "no 'title'"),
        ("---\ntitle: a\ntitle: b\n---\nbody", "appears twice"),
        ("---\ntitle: a\ntags: [a, b\n---\nbody", "not closed by ']'"),
        ("---\ntitle: [a, b]\n---\nbody", "single value"),
        ("---\njust text\n---\nbody", "not 'key: value'"),
    ],
)
def test_front_matter_errors_are_explicit(text, message):
    with pytest.raises(ValidationError) as excinfo:
        parse_markdown(text)
    assert message in " ".join(excinfo.value.messages)


# ---------------------------------------------------------------------------------------------------
# Chunking
# ---------------------------------------------------------------------------------------------------
def test_chunks_carry_their_section_heading_and_never_cross_sections():
    body = (
        "Intro text.\n\n## Symptoms\n\nAlarm fires.\n\n## Likely causes\n\nA big transaction.\n\n"
        "# Top\n\nEnd."
    )
    chunks = chunk_markdown(body)
    assert [(c.heading, c.text) for c in chunks] == [
        ("", "Intro text."),
        ("Symptoms", "Alarm fires."),
        ("Likely causes", "A big transaction."),
        ("Top", "End."),
    ]


def test_small_paragraphs_are_merged_up_to_the_maximum():
    paragraphs = [paragraph(f"p{i}", 250) for i in range(12)]
    chunks = chunk_markdown("## Steps\n\n" + "\n\n".join(paragraphs))
    assert len(chunks) == 3  # 4 paragraphs of ~250 + separators fit in 1200, a fifth does not
    assert all(MIN_CHUNK_CHARS <= len(c.text) <= MAX_CHUNK_CHARS for c in chunks)
    assert "\n\n".join(c.text for c in chunks) == "\n\n".join(paragraphs)


def test_a_short_trailing_paragraph_joins_the_previous_chunk():
    big, small = paragraph("big", 700), paragraph("tail", 120)
    chunks = chunk_markdown(f"## S\n\n{big}\n\n{paragraph('mid', 600)}\n\n{small}")
    assert len(chunks) == 2
    assert chunks[-1].text.endswith(small)
    assert len(chunks[-1].text) <= MAX_CHUNK_CHARS


def test_fenced_code_is_never_split_nor_read_as_heading_or_paragraph_break():
    code = "\n".join(["```", "SHOW SLAVE STATUS\\G", "", "## not a heading", "", *["x = 1"] * 400, "```"])
    chunks = chunk_markdown(f"## Diagnosis\n\nRun this on the replica:\n\n{code}\n\nThen read the output.")
    assert {c.heading for c in chunks} == {"Diagnosis"}
    holder = [c for c in chunks if FENCE in c.text]
    assert len(holder) == 1
    assert code in holder[0].text
    assert len(holder[0].text) > MAX_CHUNK_CHARS  # kept whole although longer than the maximum
    assert holder[0].text.startswith("Run this on the replica:")  # lead-in glued to its code block


def test_an_unclosed_fence_runs_to_the_end():
    chunks = chunk_markdown("## A\n\ntext\n\n```\ncode\n\n## B\nmore")
    assert [c.heading for c in chunks] == ["A"]
    assert chunks[0].text.endswith("## B\nmore")


def test_a_subheading_stays_with_the_block_it_introduces():
    first = paragraph("first", 1000)
    chunks = chunk_markdown(f"## S\n\n{first}\n\n### Details\n\n{paragraph('second', 400)}")
    assert len(chunks) == 2
    assert chunks[1].text.startswith("### Details\n\n")


def test_an_overlong_paragraph_is_cut_at_sentence_ends():
    text = paragraph("long", 3000)
    chunks = chunk_markdown(f"## S\n\n{text}")
    assert len(chunks) >= 3
    assert all(len(c.text) <= MAX_CHUNK_CHARS and c.text.endswith(".") for c in chunks)
    assert " ".join(c.text for c in chunks) == text


def test_chinese_paragraphs_are_cut_at_chinese_sentence_ends():
    text = "。".join(["慢查询会阻塞后续请求，需要先确认是否存在大 key 或者 KEYS 命令"] * 60) + "。"
    chunks = chunk_markdown(f"## 排查\n\n{text}")
    assert len(chunks) >= 2
    assert all(len(c.text) <= MAX_CHUNK_CHARS and c.text.endswith("。") for c in chunks)
    assert "".join(c.text for c in chunks) == text


def without_section_headings(body: str) -> str:
    """The body minus its `#`/`##` heading lines outside fenced code (shell comments stay)."""
    kept, in_fence = [], False
    for line in body.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        if not in_fence and re.match(r"#{1,2} ", line):
            continue
        kept.append(line)
    return "\n".join(kept)


@pytest.mark.parametrize("path", sorted(RUNBOOKS.glob("*.md")), ids=lambda p: p.stem)
def test_corpus_chunks_follow_the_rules(path):
    doc = parse_markdown(path.read_text(encoding="utf-8"))
    chunks = chunk_markdown(doc.body)
    assert chunks
    # Nothing is lost or reordered: the chunks' words are the body's words minus section heading lines.
    words = "".join(without_section_headings(doc.body).split())
    assert "".join("".join(c.text for c in chunks).split()) == words
    by_section: dict[str, list[str]] = {}
    for chunk in chunks:
        by_section.setdefault(chunk.heading, []).append(chunk.text)
        assert chunk.text.count(FENCE) % 2 == 0, "a fenced block was split"
        if FENCE not in chunk.text:
            assert len(chunk.text) <= MAX_CHUNK_CHARS
    for texts in by_section.values():
        for i, text in enumerate(texts):
            if len(text) < MIN_CHUNK_CHARS and len(texts) > 1:
                neighbours = [texts[j] for j in (i - 1, i + 1) if 0 <= j < len(texts)]
                assert all(len(n) + 2 + len(text) > MAX_CHUNK_CHARS for n in neighbours)


# ---------------------------------------------------------------------------------------------------
# The command and the service
# ---------------------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_load_real_corpus_then_reload_is_a_no_op():
    output = load(RUNBOOKS)
    files = len(list(RUNBOOKS.glob("*.md")))
    assert files >= 20
    assert f"{files} files, {files} created, 0 updated, 0 unchanged, {files} re-chunked" in output
    assert KnowledgeDocument.objects.count() == files
    for document in KnowledgeDocument.objects.all():
        expected = "zh" if document.slug.endswith("-zh") else "en"
        assert document.language == expected, document.slug
        assert document.source_path == f"runbooks/{document.slug}.md"
        assert len(document.content_sha256) == 64
        ordinals = list(document.chunks.values_list("ordinal", flat=True))
        assert ordinals == list(range(1, len(ordinals) + 1))
    chunk_ids = set(KnowledgeChunk.objects.values_list("id", flat=True))

    again = load(RUNBOOKS)
    assert f"0 created, 0 updated, {files} unchanged, 0 re-chunked, {len(chunk_ids)} chunks" in again
    assert set(KnowledgeChunk.objects.values_list("id", flat=True)) == chunk_ids


@pytest.mark.django_db
def test_changed_body_is_rechunked_and_metadata_change_is_not(tmp_path):
    write(tmp_path, "disk-alarm.md", body=f"## Symptoms\n\n{paragraph('inode', 400)}")
    write(tmp_path, "cpu-alarm.md", title="CPU alarm", tags="[cpu]", body=paragraph("steal", 300))
    assert "2 created" in load(tmp_path)
    disk = KnowledgeDocument.objects.get(slug="disk-alarm")
    assert disk.tags == ["disk", "linux"]
    old_chunks = list(disk.chunks.values_list("id", "text"))
    old_sha = disk.content_sha256

    write(tmp_path, "disk-alarm.md", body=f"## Symptoms\n\n{paragraph('blocks', 400)}\n\n## Fix\n\nDelete.")
    output = load(tmp_path)
    assert "0 created, 1 updated, 1 unchanged, 1 re-chunked" in output
    disk.refresh_from_db()
    assert disk.content_sha256 != old_sha
    new_chunks = list(disk.chunks.values_list("id", "ordinal", "heading"))
    assert [(n, h) for _id, n, h in new_chunks] == [(1, "Symptoms"), (2, "Fix")]
    assert not {i for i, _t in old_chunks} & {i for i, _n, _h in new_chunks}
    assert "blocks" in disk.chunks.get(ordinal=1).text

    ids_before = list(disk.chunks.values_list("id", flat=True))
    write(
        tmp_path,
        "disk-alarm.md",
        tags="[disk, storage]",
        body=f"## Symptoms\n\n{paragraph('blocks', 400)}\n\n## Fix\n\nDelete.",
    )
    assert "1 updated, 1 unchanged, 0 re-chunked" in load(tmp_path)
    disk.refresh_from_db()
    assert disk.tags == ["disk", "storage"]
    assert list(disk.chunks.values_list("id", flat=True)) == ids_before


@pytest.mark.django_db
def test_one_invalid_file_loads_nothing(tmp_path):
    write(tmp_path, "good.md", body="Fine.")
    (tmp_path / "broken.md").write_text("no front matter\n", encoding="utf-8")
    write(tmp_path, "Bad Name.md", body="Fine.")
    with pytest.raises(CommandError) as excinfo:
        load(tmp_path)
    message = str(excinfo.value)
    assert "broken.md: file: The file must start with a '---' front matter block." in message
    assert "Bad Name.md: slug: file name must be a slug" in message
    assert "good.md" not in message
    assert not KnowledgeDocument.objects.exists()


@pytest.mark.django_db
def test_missing_directory_is_an_error(tmp_path):
    with pytest.raises(CommandError, match="is not a directory"):
        load(tmp_path / "nope")


@pytest.mark.django_db
def test_prune_deletes_only_documents_of_removed_files(tmp_path):
    write(tmp_path, "a.md", body="Alpha.")
    write(tmp_path, "b.md", body="Beta.")
    load(tmp_path)
    ingest.upsert_document(slug="handmade", title="Handmade", tags=[], summary="", body="Made in admin.")
    (tmp_path / "b.md").unlink()
    assert "0 pruned" not in load(tmp_path)  # without --prune nothing is deleted
    assert KnowledgeDocument.objects.filter(slug="b").exists()
    assert "1 pruned" in load(tmp_path, "--prune")
    assert set(KnowledgeDocument.objects.values_list("slug", flat=True)) == {"a", "handmade"}
    assert not KnowledgeChunk.objects.filter(document__slug="b").exists()


@pytest.mark.django_db
def test_upsert_validates_and_normalises():
    with pytest.raises(ValidationError) as excinfo:
        ingest.upsert_document(slug="Bad Slug", title="", tags="oops", summary="", body="  ")
    assert set(excinfo.value.message_dict) == {"slug", "title", "tags", "body"}
    result = ingest.upsert_document(
        slug="dns", title="  DNS   failures ", tags=[" dns ", "DNS", "", "network"], summary="a\n b", body="x"
    )
    assert (result.outcome, result.rechunked, result.chunk_count) == ("created", True, 1)
    doc = result.document
    assert (doc.title, doc.tags, doc.summary, doc.language) == (
        "DNS failures",
        ["dns", "network"],
        "a b",
        "en",
    )
    same = ingest.upsert_document(
        slug="dns", title="DNS failures", tags=["dns", "network"], summary="a b", body="x"
    )
    assert same.outcome == "unchanged"
    assert (
        ingest.upsert_document(
            slug="zh", title="标题", tags=[], summary="", body="中文正文"
        ).document.language
        == "zh"
    )


@pytest.mark.django_db
def test_writes_bump_the_generation():
    before = ingest.knowledge_generation()
    ingest.upsert_document(slug="a", title="A", tags=[], summary="", body="x")
    after_create = ingest.knowledge_generation()
    assert after_create != before
    ingest.upsert_document(slug="a", title="A", tags=[], summary="", body="x")
    assert ingest.knowledge_generation() == after_create  # unchanged: no write, no bump
    assert ingest.delete_document(slug="a") is True
    assert ingest.knowledge_generation() != after_create
    assert ingest.delete_document(slug="a") is False
