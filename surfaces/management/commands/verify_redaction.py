"""`manage.py verify_redaction RUN_ID < candidate`: confirm whether a value is one the run redacted.

For an auditor holding `REDACTION_HMAC_KEY`: the candidate value (say, the key someone reports having
pasted) is read from standard input, never from the command line (which shells keep in their history and
`ps` shows), one value per line (a multi-line value such as a PEM block: `--whole` reads all of stdin as
one). Each is compared with the keyed HMAC of every original the run's `REDACTION_APPLIED` events name
(`agent.redaction.verify_hmac`); the placeholder it was replaced by is printed, or that it does not match.
The key id each event names must be the configured key's, or the comparison is refused for that event.
"""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError

from agent.redaction import hmac_key, key_id, verify_hmac
from audit.models import EventType, TraceEvent


class Command(BaseCommand):
    help = "Check values read from stdin against the keyed HMACs a run's REDACTION_APPLIED events recorded."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--whole", action="store_true", help="all of stdin is one value (a PEM block)")

    def handle(self, *args, run_id: str, whole: bool = False, **options):
        key = hmac_key()
        events = list(
            TraceEvent.objects.filter(run_id=run_id, event_type=EventType.REDACTION_APPLIED)
            .order_by("sequence_no")
            .values_list("sequence_no", "details")
        )
        if not events:
            raise CommandError(f"run {run_id} recorded no REDACTION_APPLIED event")
        text = sys.stdin.read()
        candidates = [text.rstrip("\n")] if whole else [line for line in text.splitlines() if line]
        mine = key_id(key)
        found_any = False
        for n, candidate in enumerate(candidates, start=1):
            matches = []
            for sequence_no, details in events:
                if (details or {}).get("keyId") != mine:
                    self.stderr.write(f"sequence {sequence_no}: recorded under another key; not compared")
                    continue
                matches += [
                    f"{item['placeholder']} (sequence {sequence_no}, {details.get('source')})"
                    for item in details.get("items") or []
                    if verify_hmac(key, candidate, item.get("hmac", ""))
                ]
            found_any = found_any or bool(matches)
            self.stdout.write(f"value {n}: " + (", ".join(matches) if matches else "no match"))
        if not found_any:
            raise CommandError("no value matched")
