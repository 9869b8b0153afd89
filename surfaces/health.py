"""`GET /healthz`: the readiness probe for the proxy and the process manager. No authentication, no data.

The answer names only components and `up`/`down`: the database (`SELECT 1` on the runtime's database
pool within `HEALTH_TIMEOUT_SECONDS`), Redis when `REDIS_URL` is set, and each background duty of this
process (`duty_status`; the probe never starts them). 200 when everything is up, 503 otherwise; a
draining process (SIGTERM: `agent.runtime.drain`) answers 503 `{"status": "draining"}` at once. Exempt
from the HTTPS redirect, `Cache-Control: no-store`.
Details: docs/deployment.md, *Metrics and readiness*.
"""

from __future__ import annotations

import asyncio

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_safe

from agent.runtime import drain
from agent.runtime.db import db
from agent.runtime.supervisor import duty_status

HEALTH_TIMEOUT_SECONDS = 3.0
UP, DOWN, DRAINING = "up", "down", "draining"


def _select_one() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


async def _database_up() -> bool:
    try:
        await asyncio.wait_for(db(_select_one), HEALTH_TIMEOUT_SECONDS)
    except Exception:
        return False
    return True


async def _redis_up(url: str) -> bool:
    from redis.asyncio import Redis

    timeout = HEALTH_TIMEOUT_SECONDS
    client = Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(await asyncio.wait_for(client.ping(), HEALTH_TIMEOUT_SECONDS))
    except Exception:
        return False
    finally:
        await client.aclose()


@require_safe
async def healthz(request: HttpRequest) -> JsonResponse:
    """The readiness answer above; see the module docstring for its contract."""
    if drain.draining():  # stopping (SIGTERM): the proxy must send nothing new here
        response = JsonResponse({"status": DRAINING}, status=503)
        response["Cache-Control"] = "no-store"
        return response
    checks = [_database_up()]
    redis_url = settings.REDIS_URL
    if redis_url:
        checks.append(_redis_up(redis_url))
    results = await asyncio.gather(*checks)
    body: dict = {"database": UP if results[0] else DOWN}
    if redis_url:
        body["redis"] = UP if results[1] else DOWN
    duties = duty_status()
    body["duties"] = {name: UP if alive else DOWN for name, alive in sorted(duties.items())}
    healthy = all(results) and bool(duties) and all(duties.values())
    response = JsonResponse({"status": UP if healthy else DOWN, **body}, status=200 if healthy else 503)
    response["Cache-Control"] = "no-store"
    return response
