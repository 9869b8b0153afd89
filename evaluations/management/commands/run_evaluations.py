"""`manage.py run_evaluations`: the evaluation worker (see `evaluations.services`)."""

from __future__ import annotations

import signal
import time

from django.core.management.base import BaseCommand

from evaluations.services import score_pending


class Command(BaseCommand):
    help = (
        "Score finished runs with the enabled evaluators, off the runs' path: a pass every "
        "--interval seconds until stopped (SIGTERM/SIGINT), or one pass with --once. Safe to run in "
        "several processes: each (run, evaluator) is claimed before it is scored."
    )

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="One pass, then exit.")
        parser.add_argument("--interval", type=float, default=10.0, help="Seconds between passes.")
        parser.add_argument("--limit", type=int, default=100, help="Runs per evaluator per pass.")

    def handle(self, *args, once: bool, interval: float, limit: int, **options):
        stop = {"now": False}

        def _stop(signum, frame):
            stop["now"] = True

        if not once:
            signal.signal(signal.SIGTERM, _stop)
            signal.signal(signal.SIGINT, _stop)
        while True:
            result = score_pending(limit=limit)
            self.stdout.write(
                f"evaluations: {len(result.scores)} recorded, {result.skipped} skipped, "
                f"{result.errors} failed"
            )
            if once or stop["now"]:
                return
            waited = 0.0
            while waited < interval and not stop["now"]:
                time.sleep(min(0.5, interval - waited))
                waited += 0.5
            if stop["now"]:
                return
