"""`manage.py sweep_runs`: fail runs whose lease expired and close their tools (see
`agent.runtime.sweeper`). Server processes do this periodically; the command is for cron or an
operator after a crash. It also expires approval requests older than `APPROVAL_TIMEOUT_SECONDS`
(recorded APPROVAL_DECIDED EXPIRED, treated as rejected; `agent.runtime.approvals.expire_due`)."""

from asgiref.sync import async_to_sync
from django.core.management.base import BaseCommand

from agent.runtime.approvals import expire_due, publish_decision
from agent.runtime.sweeper import SWEEP_BATCH, publish_swept, sweep_expired_runs


class Command(BaseCommand):
    help = "Fail runs whose executing process stopped renewing its lease (LEASE_EXPIRED)."

    def add_arguments(self, parser):
        parser.add_argument("--limit", type=int, default=SWEEP_BATCH, help="runs per batch")

    def handle(self, *args, limit: int, **options):
        total = 0
        while True:
            swept = sweep_expired_runs(limit=limit)
            if swept:
                async_to_sync(publish_swept)(swept)
            total += len(swept)
            if len(swept) < limit:
                break
        expired = expire_due()
        for decided in expired:
            publish_decision(decided)
        self.stdout.write(
            f"swept {total} run(s)" + (f", expired {len(expired)} approval request(s)" if expired else "")
        )
