"""Online evaluation as a background duty of every serving process (issue 45 item 5): every
`EVALUATION_DUTY_INTERVAL_SECONDS` a pass of `services.score_pending` scores the runs finished since,
on a thread of its own (`agent.runtime.db.evaluations_pass`), so configured evaluators score new runs
without anyone running `manage.py run_evaluations`. Several processes pass side by side: each (run,
evaluator) is claimed first (`services.claim`), so none is scored twice. Registered at app start-up
(`EvaluationsConfig.ready`). Details: docs/evaluations.md, *The worker*.
"""

from __future__ import annotations

import logging

from django.conf import settings

from agent.runtime import duties

logger = logging.getLogger("evaluations")

NAME = "evaluations:score"
PASS_LIMIT = 100  # runs per evaluator per pass, as `run_evaluations`' default


def interval() -> float:
    return float(settings.EVALUATION_DUTY_INTERVAL_SECONDS)


def _one_pass() -> tuple[int, int, int]:
    from evaluations.services import score_pending

    result = score_pending(limit=PASS_LIMIT)
    return len(result.scores), result.skipped, result.errors


async def score_new_runs() -> None:
    """One pass of the duty (see the module)."""
    from agent.runtime.db import evaluations_pass

    recorded, skipped, failed = await evaluations_pass(_one_pass)
    if recorded or failed:
        logger.info("evaluations duty: %d recorded, %d skipped, %d failed", recorded, skipped, failed)


def register() -> None:
    duties.register(duties.Duty(name=NAME, what="evaluation", job=score_new_runs, interval=interval))
