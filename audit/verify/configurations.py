"""The stored run configurations against what hashes to what (`diagnosis.RunConfiguration`).

Each run chains its own configuration document and fingerprint in RUN_STARTED (`audit.verify.rows` checks
the run's column and the document's hash); this table keeps each distinct configuration once, with the
instruction texts the document's prompt digests were computed over, for the lists and the compare page.
So that what it shows is what was hashed, `configuration_problems` holds every row to: its fingerprint is
the SHA-256 of its canonical text, its document is that text decoded, each prompt text hashes to the
document's digest of its role (no role missing or added), and some run's chain names its fingerprint
(a row no run chains was forged). A deleted row loses only the display of the texts: each run keeps its
own chained document. Problems name fingerprints (short) and roles only, never a prompt's text."""

from __future__ import annotations

import json

from audit.models import EventType, TraceEvent
from audit.payloads import canonical_json, sha256_hex
from diagnosis.models import DiagnosisRun, RunConfiguration


def configuration_problems() -> tuple[int, list[str]]:
    """(rows checked, problems) of every stored run configuration."""
    problems = []
    checked = 0
    for row in RunConfiguration.objects.order_by("pk").iterator(chunk_size=500):
        checked += 1
        where = f"configuration {row.fingerprint[:12]}"
        if sha256_hex(row.canonical) != row.fingerprint:
            problems.append(f"{where}: its fingerprint is not the SHA-256 of its canonical text")
        try:
            decoded = json.loads(row.canonical)
        except ValueError:
            problems.append(f"{where}: its canonical text is not JSON")
            continue
        if canonical_json(decoded) != row.canonical or row.document != decoded:
            problems.append(f"{where}: its document differs from its canonical text")
        digests = decoded.get("prompts") if isinstance(decoded, dict) else None
        digests = digests if isinstance(digests, dict) else {}
        texts = row.prompts if isinstance(row.prompts, dict) else {}
        for role in sorted(set(digests) | set(texts)):
            text = texts.get(role)
            if not isinstance(text, str) or sha256_hex(text) != digests.get(role):
                problems.append(f"{where}: the prompt text of {role} does not hash to the document's digest")
        if not _chained(row.fingerprint):
            problems.append(f"{where}: no run's chain names it (RUN_STARTED configFingerprint)")
    return checked, problems


def _chained(fingerprint: str) -> bool:
    """Whether a run's RUN_STARTED chains `fingerprint` (the run's column, then its chained event)."""
    runs = DiagnosisRun.objects.filter(config_fingerprint=fingerprint).values_list("run_id", flat=True)[:20]
    return TraceEvent.objects.filter(
        run_id__in=list(runs), event_type=EventType.RUN_STARTED, details__configFingerprint=fingerprint
    ).exists()
