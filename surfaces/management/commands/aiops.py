"""`manage.py aiops "alert or question" [--user NAME] [--queue]`: start an AI Ops analysis from a shell.

The analysis is queued like any other (`agent.aiops.intake`, source `shell`). Without `--queue` this
command then executes it here, printing its stages as `manage.py diagnose` does, and the released report
and a summary of its trace; with `--queue` it only prints the run's ids and leaves it to a worker (a
server process or `manage.py run_worker`).
"""

from __future__ import annotations

import asyncio

from django.core.management.base import CommandError

from agent.aiops import intake
from agent.runtime.executor import RunNotClaimable, execute_run
from agent.runtime.llm import aclose_clients
from diagnosis.models import AlertSource, DiagnosisRun
from diagnosis.services import InvalidQuery
from surfaces.management.commands.diagnose import Command as DiagnoseCommand
from surfaces.management.commands.diagnose import PrintSink


class Command(DiagnoseCommand):
    help = "Start an AI Ops analysis (planner and executor) of an alert or question; run it or queue it."

    def add_arguments(self, parser):
        parser.add_argument("question", help="the alert text or question to analyse")
        parser.add_argument("--user", help="run as this user (default: the first superuser)")
        parser.add_argument("--queue", action="store_true", help="only queue it for a worker")

    def handle(self, *args, question: str, user: str | None = None, queue: bool = False, **options):
        owner = self._user(user, None)
        try:
            run = intake.start_staff_analysis(user=owner, alert=question, source=AlertSource.SHELL)
        except InvalidQuery as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"Queued AI Ops run {run.run_id} in session {run.session_id}")
        if queue:
            return

        async def main():
            try:
                return await execute_run(run_id=run.run_id, sink=PrintSink(self.stdout))
            finally:
                await aclose_clients()

        try:
            outcome = asyncio.run(main())
        except RunNotClaimable:
            raise CommandError(f"A worker took run {run.run_id} first; follow it in the admin.") from None
        self.stdout.write("")
        self.stdout.write(f"Report ({outcome.status}, release {outcome.release_decision or '-'}):")
        self.stdout.write(outcome.content or "(no content)")
        if outcome.error_code:
            self.stdout.write(f"Error: {outcome.error_code}: {outcome.error_message}")
        self.stdout.write("")
        self._summary(DiagnosisRun.objects.get(run_id=run.run_id))
