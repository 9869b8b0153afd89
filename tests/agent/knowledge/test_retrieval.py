"""Retrieval (`agent.knowledge.retrieval.search_knowledge`): quality on the real runbooks, layers, bounds,
evidence ids, index freshness, query counts and concurrent use."""

import threading
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from agent.knowledge import ingest, retrieval
from agent.knowledge.retrieval import (
    EVIDENCE_ID_RE,
    EVIDENCE_TEXT_CHARS,
    MAX_TOP_K,
    RetrievalResult,
    search_knowledge,
    tokenize,
)
from diagnosis.models import KnowledgeChunk, KnowledgeDocument

RUNBOOKS = Path(__file__).resolve().parents[3] / "runbooks"

ENGLISH = [
    ("replica is 300 seconds behind master", "mysql-replication-lag"),
    ("users see stale data right after saving, read replica lagging", "mysql-replication-lag"),
    ("nginx returns 502 bad gateway after deploy", "nginx-502-bad-gateway"),
    ("upstream prematurely closed connection while reading response header", "nginx-502-bad-gateway"),
    ("pod keeps restarting with CrashLoopBackOff", "k8s-crashloopbackoff"),
    ("dmesg says Killed process, out of memory", "oom-killer"),
    ("No space left on device but df shows free space", "inode-exhaustion"),
    ("/var/log is 100% full", "disk-full-var-log"),
    ("kafka consumer group lag keeps increasing", "kafka-consumer-lag"),
    ("FATAL: sorry, too many clients already", "postgres-connection-exhaustion"),
    ("certificate has expired x509 error", "tls-certificate-expiry"),
    ("redis evicting keys, used_memory reached maxmemory", "redis-memory-eviction"),
    ("long stop-the-world GC pauses in a java service", "jvm-gc-pauses"),
    ("high steal time on the VM, burstable instance out of CPU credits", "cpu-steal-noisy-neighbour"),
    ("temporary failure in name resolution", "dns-resolution-failures"),
    ("elasticsearch cluster status red with unassigned shards", "elasticsearch-cluster-red"),
    ("targets marked unhealthy by the ALB", "load-balancer-health-checks"),
    ("prometheus target down: context deadline exceeded", "prometheus-scrape-failures"),
    ("p99 latency went up after the release", "api-latency-p99-regression"),
]
CHINESE = [
    ("Redis 连接超时 怎么排查", "redis-connection-timeout-zh"),
    ("Redis连接超时怎么排查", "redis-connection-timeout-zh"),
    ("磁盘 IO 很高，iowait 升高", "disk-io-high-zh"),
    ("Java 堆内存一直涨，频繁 Full GC", "jvm-memory-leak-zh"),
    ("消息积压了，消费太慢", "message-queue-backlog-zh"),
    ("服务器之间丢包，TCP 重传率高", "network-packet-loss-zh"),
    ("线上 5xx 错误率突然升高", "service-5xx-spike-zh"),
]
MIXED = [
    ("k8s pod 一直 pending 调度不上去", "k8s-pod-pending-zh"),
    ("k8s 节点 NotReady 了", "k8s-node-notready-zh"),
    ("MySQL 慢查询导致接口变慢", "mysql-slow-query-zh"),
    ("nginx 报 502 怎么处理", "nginx-502-bad-gateway"),
    ("dns 解析失败", "dns-resolution-failures"),
    ("redis timeout connecting from the app", "redis-connection-timeout-zh"),
]


@pytest.fixture
def corpus(db):
    call_command("load_knowledge", str(RUNBOOKS), stdout=StringIO())


def doc(slug: str, *, title: str, tags: list[str], summary: str = "", body: str) -> None:
    ingest.upsert_document(slug=slug, title=title, tags=tags, summary=summary, body=body)


# ---------------------------------------------------------------------------------------------------
# Quality on the real corpus
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("language", "cases"), [("en", ENGLISH), ("zh", CHINESE), ("mixed", MIXED)], ids=["en", "zh", "mixed"]
)
def test_expected_runbook_is_in_the_top_three(corpus, language, cases):
    misses = []
    for question, slug in cases:
        result = search_knowledge(question, top_k=5)
        top3 = list(dict.fromkeys(item.slug for item in result.items))[:3]
        if slug not in [item.slug for item in result.items[:3]]:
            misses.append((question, slug, top3))
    assert misses == []


def test_the_best_hit_is_the_runbook_itself_for_exact_titles(corpus):
    for document in KnowledgeDocument.objects.all():
        result = search_knowledge(document.title, top_k=3)
        assert result.items[0].slug == document.slug, document.title


def test_results_are_ordered_deduplicated_and_repeatable(corpus):
    first = search_knowledge("mysql replication lag on the replica", top_k=8)
    again = search_knowledge("mysql replication lag on the replica", top_k=8)
    assert first == again
    ids = [item.id for item in first.items]
    assert len(ids) == len(set(ids)) == 8
    scores = [item.score for item in first.items]
    assert scores == sorted(scores, reverse=True)
    assert all(score > 0 for score in scores)


def test_evidence_is_well_formed_and_matches_the_stored_chunk(corpus):
    result = search_knowledge("Seconds_Behind_Master 复制延迟 replication", top_k=MAX_TOP_K)
    assert result.items
    for item in result.items:
        match = EVIDENCE_ID_RE.fullmatch(item.id)
        assert match, item.id
        slug, ordinal = match.group(1), int(match.group(2))
        assert slug == item.slug
        chunk = KnowledgeChunk.objects.select_related("document").get(document__slug=slug, ordinal=ordinal)
        assert chunk.evidence_id == item.id
        assert len(chunk.text) <= EVIDENCE_TEXT_CHARS  # true of every runbook chunk: the text is whole
        assert (item.title, item.heading, item.text) == (chunk.document.title, chunk.heading, chunk.text)
        assert item.layer in ("L0", "L1")
    assert "MySQL replication lag" in result.details["l0"]
    for entry in result.details["l1"]:
        assert set(entry) == {"id", "score"} and EVIDENCE_ID_RE.fullmatch(entry["id"]) and entry["score"] > 0
    assert result.as_dict()["items"][0]["id"] == result.items[0].id


# ---------------------------------------------------------------------------------------------------
# Layers, counts and details
# ---------------------------------------------------------------------------------------------------
@pytest.fixture
def synthetic(db):
    doc(
        "zk-session-expiry",
        title="ZooKeeper session expiry",
        tags=["zookeeper", "coordination"],
        summary="Clients lose their ephemeral nodes.",
        body="## Symptoms\n\nEphemeral nodes vanish and leaders are re-elected.\n\n## Fix\n\nRaise tickTime.",
    )
    doc(
        "haproxy-queueing",
        title="HAProxy backend queueing",
        tags=["haproxy", "load-balancer"],
        summary="Requests wait in the backend queue.",
        body="## Symptoms\n\nThe qcur column grows; maxconn is reached on every server.\n\n"
        "## Fix\n\nIncrease maxconn or add servers.",
    )


def test_l0_only_when_the_query_matches_metadata_but_no_chunk(synthetic):
    result = search_knowledge("zookeeper")
    assert (result.layer, result.l0_match_count, result.l1_match_count) == ("L0", 1, 0)
    assert [(i.id, i.layer) for i in result.items] == [("kb:zk-session-expiry#1", "L0")]
    assert result.details == {"l0": ["ZooKeeper session expiry"], "l1": []}
    assert result.is_truncated is False


def test_l1_only_when_the_query_matches_chunks_but_no_metadata(synthetic):
    result = search_knowledge("qcur maxconn")
    assert (result.layer, result.l0_match_count, result.l1_match_count) == ("L1", 0, 2)
    assert [(i.id, i.layer) for i in result.items] == [
        ("kb:haproxy-queueing#1", "L1"),
        ("kb:haproxy-queueing#2", "L1"),
    ]
    assert result.details["l0"] == []
    assert [entry["id"] for entry in result.details["l1"]] == [
        "kb:haproxy-queueing#1",
        "kb:haproxy-queueing#2",
    ]


def test_l0_and_l1_merge_without_duplicates(synthetic):
    result = search_knowledge("haproxy qcur ephemeral")
    assert result.layer == "L0+L1"
    assert (result.l0_match_count, result.l1_match_count) == (1, 2)
    # haproxy#1 is both the L0 document's best chunk (only it mentions qcur) and an L1 hit: listed once.
    assert [(i.id, i.layer) for i in result.items] == [
        ("kb:haproxy-queueing#1", "L0"),
        ("kb:zk-session-expiry#1", "L1"),
    ]
    assert result.items[0].score > 1.0 >= result.items[1].score
    assert result.details["l0"] == ["HAProxy backend queueing"]
    assert sorted(entry["id"] for entry in result.details["l1"]) == sorted(i.id for i in result.items)
    assert all(entry["score"] > 0 for entry in result.details["l1"])  # raw BM25, not the merged score


def test_hyphenated_and_plural_tags_match_as_phrases(synthetic):
    for query in ("load balancer queueing", "our load-balancers queue", "LOAD_BALANCER"):
        assert search_knowledge(query).items[0].slug == "haproxy-queueing", query
    assert search_knowledge("balancer").l0_match_count == 0  # half a tag is no tag hit


def test_chinese_tags_match_as_substrings(db):
    doc("zh-doc", title="缓存雪崩处理", tags=["缓存雪崩"], body="## 症状\n\n数据库压力骤增。")
    result = search_knowledge("昨晚发生了缓存雪崩吗")
    assert result.l0_match_count == 1
    assert result.items[0].id == "kb:zh-doc#1"


@pytest.mark.parametrize(
    "query", ["", "   ", "?!…——。，", "the of and to", "的了吗呢", "zzqxv blorptangle", None, "x" * 5000]
)
def test_empty_or_unmatched_query_returns_an_empty_result(corpus, query):
    result = search_knowledge(query)
    assert result == RetrievalResult(
        items=[],
        layer="",
        l0_match_count=0,
        l1_match_count=0,
        details={"l0": [], "l1": []},
        is_truncated=False,
    )


def test_empty_knowledge_base_returns_an_empty_result(db):
    assert search_knowledge("mysql replication lag").layer == ""


# ---------------------------------------------------------------------------------------------------
# Bounds: top_k and evidence text
# ---------------------------------------------------------------------------------------------------
def test_top_k_is_clamped_and_truncation_is_reported(corpus):
    one = search_knowledge("redis", top_k=0)
    assert len(one.items) == 1 and one.is_truncated
    many = search_knowledge("redis", top_k=1000)
    assert len(many.items) == MAX_TOP_K
    assert many.l1_match_count > MAX_TOP_K and many.is_truncated
    assert len(many.details["l1"]) == MAX_TOP_K
    assert len(search_knowledge("redis", top_k="3").items) == 3
    assert len(search_knowledge("redis", top_k="three").items) == 5


def test_long_chunk_text_is_cut_and_flagged(db):
    code = "```\n" + "\n".join(f"step {i}: verify the flux capacitor" for i in range(120)) + "\n```"
    doc("long-code", title="Flux capacitor", tags=["flux"], body=f"## Steps\n\n{code}")
    assert len(KnowledgeChunk.objects.get(document__slug="long-code").text) > EVIDENCE_TEXT_CHARS
    result = search_knowledge("flux capacitor")
    assert len(result.items) == 1
    assert len(result.items[0].text) == EVIDENCE_TEXT_CHARS
    assert result.items[0].text.endswith("…")
    assert result.is_truncated is True


def test_not_truncated_when_everything_fits(synthetic):
    result = search_knowledge("qcur maxconn", top_k=2)
    assert len(result.items) == 2 and result.is_truncated is False
    assert search_knowledge("qcur maxconn", top_k=1).is_truncated is True


# ---------------------------------------------------------------------------------------------------
# Tokenisation
# ---------------------------------------------------------------------------------------------------
def test_tokenisation_handles_chinese_latin_compounds_and_stop_words():
    assert tokenize("Redis连接超时怎么排查？") == ["redis", "连接", "超时"]
    assert tokenize("The max_connections is reached!") == ["max_connections", "max", "connections", "reached"]
    assert tokenize("ＭｙＳＱＬ　５．７") == ["mysql", "5.7"]  # full-width forms are normalised
    assert tokenize("主从复制") == ["主从", "复制", "主从复制"]


# ---------------------------------------------------------------------------------------------------
# Index freshness and query counts
# ---------------------------------------------------------------------------------------------------
def test_query_count_is_bounded_cold_and_zero_when_warm(
    corpus, django_assert_max_num_queries, django_assert_num_queries
):
    with django_assert_max_num_queries(3):  # version stamp + documents + chunks
        assert search_knowledge("nginx 502").items
    with django_assert_num_queries(0):
        for question, _slug in ENGLISH:
            search_knowledge(question)


def test_warming_builds_the_index_ahead_of_the_first_search(corpus, django_assert_num_queries):
    retrieval.warm_knowledge_index()
    with django_assert_num_queries(0):
        assert search_knowledge("nginx 502").items


def test_version_stamp_is_read_at_most_every_few_seconds(corpus, monkeypatch, django_assert_num_queries):
    search_knowledge("nginx 502")
    monkeypatch.setattr(retrieval, "VERSION_CHECK_SECONDS", 0.0)
    builds = retrieval._holder.builds
    with django_assert_num_queries(1):  # due: one stamp query, nothing changed, no rebuild
        search_knowledge("nginx 502")
    assert retrieval._holder.builds == builds


def test_a_write_by_another_process_is_seen_through_the_stamp(corpus, monkeypatch):
    assert search_knowledge("quuxbeacon").layer == ""
    # Another process changed a chunk (this process's generation does not move).
    chunk = KnowledgeChunk.objects.get(document__slug="ntp-clock-skew", ordinal=2)
    KnowledgeChunk.objects.filter(pk=chunk.pk).update(text=chunk.text + " The quuxbeacon drifts.")
    KnowledgeDocument.objects.filter(slug="ntp-clock-skew").update(
        updated_at=timezone.now() + timedelta(seconds=1)
    )
    assert search_knowledge("quuxbeacon").layer == ""  # not yet: the stamp was checked just now
    monkeypatch.setattr(retrieval, "VERSION_CHECK_SECONDS", 0.0)
    result = search_knowledge("quuxbeacon")
    assert [item.id for item in result.items] == ["kb:ntp-clock-skew#2"]


def test_an_upsert_in_this_process_rebuilds_at_once(corpus):
    assert search_knowledge("frobnicator").layer == ""
    document = KnowledgeDocument.objects.get(slug="oom-killer")
    ingest.upsert_document(
        slug=document.slug,
        title=document.title,
        tags=document.tags,
        summary=document.summary,
        body=document.body + "\n\n## Frobnicator\n\nThe frobnicator daemon leaks memory.",
    )
    result = search_knowledge("frobnicator")
    assert result.items[0].slug == "oom-killer" and result.items[0].heading == "Frobnicator"
    ingest.delete_document(slug="oom-killer")
    assert search_knowledge("frobnicator").layer == ""


@pytest.mark.django_db(transaction=True)
def test_concurrent_searches_share_one_build():
    call_command("load_knowledge", str(RUNBOOKS), stdout=StringIO())
    retrieval.reset_knowledge_index()
    builds = retrieval._holder.builds
    questions = [q for q, _slug in ENGLISH[:4] + CHINESE[:4]]
    results: dict[int, list] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(questions))

    def worker(i: int) -> None:
        try:
            barrier.wait()
            results[i] = [search_knowledge(questions[i]).items[0].slug for _ in range(3)]
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(questions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert retrieval._holder.builds == builds + 1
    expected = [search_knowledge(question).items[0].slug for question in questions]
    assert [results[i] for i in range(len(questions))] == [[slug] * 3 for slug in expected]
    assert expected[0] == "mysql-replication-lag" and expected[4] == "redis-connection-timeout-zh"
