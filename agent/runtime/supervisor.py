"""Per-process ownership of live runs: start, cancel, and the process's background duties.

`launch` executes a run in an `asyncio` task kept in a per-process registry until it ends, tied to no
connection, so closing a socket never stops a run. `request_cancel` sets the run's `cancel_requested`
column, fires the token when this process owns the run, and otherwise messages the owner's control
group. `ensure_background()` starts the process's duties once per event loop (control listener,
sweeper, checkpointer, purge, queue worker, trace exporter, those apps register in `agent.runtime.duties`),
never from `/healthz`, which reports them (`duty_status`); `stop_background` stops them.
Details: docs/deployment.md, *Background duties*; docs/architecture.md, *Live runs*.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass

from channels.layers import get_channel_layer
from django.conf import settings

from agent.runtime import drain
from agent.runtime import duties as registered_duties
from agent.runtime.approvals import decision_event, expire_due
from agent.runtime.cancel import CancelToken
from agent.runtime.db import background, db, duty
from agent.runtime.events import SafeSink
from agent.runtime.executor import RunNotClaimable, RunOutcome, execute_run, lease_owner
from agent.runtime.live import ChannelLayerSink, publish
from agent.runtime.llm import aclose_clients, warm_client
from agent.runtime.receiver import Receiver
from agent.runtime.shutdown import SHUTDOWN_SECONDS, Deadline, bounded
from agent.runtime.sweeper import publish_swept, sweep_expired_runs
from audit.transparency.log import periodic_checkpoint
from audit.write.retention import purge_expired_runs
from diagnosis import services
from diagnosis.models import TERMINAL_RUN_STATUSES, DiagnosisRun, RunStatus
from telemetry.outbox import run_export_pass

logger = logging.getLogger(__name__)

ACTIVE_STATUSES = (RunStatus.PENDING, RunStatus.RUNNING)
CONTROL_MESSAGE_TYPE = "run.cancel"
QUEUE_DUTY = "runs:queue-worker"
ADOPT_DUTY = "runs:adopt"
CONTROL_STOP_SECONDS = 5.0  # of the shutdown bound (SHUTDOWN_SECONDS), for ending the control listener


# -------------------------------------------------------------------------------------------------
# The per-process registry of run tasks
# -------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Owned:
    task: asyncio.Task
    token: CancelToken


_runs: dict[str, _Owned] = {}


def launch(
    run_id: str,
    *,
    claimed: DiagnosisRun | None = None,
    on_finishing: Callable[[], None] | None = None,
    gate: asyncio.Event | None = None,
) -> asyncio.Task:
    """Execute the run in a task of this process (the executor takes the run's lease, unless `claimed`
    is the run as this process already claimed it). The task is referenced by the registry until it
    ends; nothing a connection does can cancel it. `on_finishing`, `gate`: see `execute_run`."""
    existing = _runs.get(run_id)
    if existing is not None and not existing.task.done():
        return existing.task
    ensure_background()
    token = CancelToken()
    task = asyncio.get_running_loop().create_task(
        _execute(run_id, token, claimed=claimed, on_finishing=on_finishing, gate=gate), name=f"run:{run_id}"
    )
    if drain.draining():
        # A request already past the draining check launches its run after the drain began: the run
        # hands over at its first boundary, and the drain counts and waits for it with the others.
        token.request_handover()
        drain.launched_while_draining(task, token)
    _runs[run_id] = _Owned(task=task, token=token)
    task.add_done_callback(lambda t, run_id=run_id: _forget(run_id, t))
    return task


def _forget(run_id: str, task: asyncio.Task) -> None:
    owned = _runs.get(run_id)
    if owned is not None and owned.task is task:
        del _runs[run_id]


def running_count() -> int:
    """Runs this process is executing now."""
    return sum(1 for owned in _runs.values() if not owned.task.done())


def owned_runs() -> dict[asyncio.Task, CancelToken]:
    """The run tasks this process executes now, with their tokens (the drain asks them to hand over)."""
    return {owned.task: owned.token for owned in _runs.values() if not owned.task.done()}


async def _execute(
    run_id: str,
    token: CancelToken,
    *,
    claimed: DiagnosisRun | None = None,
    on_finishing: Callable[[], None] | None = None,
    gate: asyncio.Event | None = None,
) -> RunOutcome | None:
    sink = SafeSink(ChannelLayerSink(run_id), run_id=run_id)
    joined = await _control_join(run_id)
    try:
        return await execute_run(
            run_id=run_id, sink=sink, cancel=token, claimed=claimed, on_finishing=on_finishing, gate=gate
        )
    except asyncio.CancelledError:
        raise
    except RunNotClaimable:
        # Another process owns it, or it finished (e.g. swept) before this task started: not ours.
        logger.warning("run not claimable run=%s", run_id)
    except Exception as exc:
        # The executor finishes every run it claimed; reaching here is a bug. Never leave the run open.
        logger.error("run task crashed run=%s error=%s", run_id, type(exc).__name__)
        from agent.runtime.sweeper import fail_run

        with contextlib.suppress(Exception):
            await db(fail_run, run_id, error_code="INTERNAL_ERROR", error_message="The run failed.")
    finally:
        if joined:
            await _control_leave(run_id)


async def request_cancel(run_id: str) -> str:
    """Ask the run to stop (see the module docstring); returns its status at the time of the request.
    Cancelling a finished run changes nothing."""
    status = await db(services.request_run_cancel, run_id=run_id)
    if status in TERMINAL_RUN_STATUSES:
        return status
    from agent.runtime.approvals import cancel_waiting, is_waiting

    run = await db(DiagnosisRun.objects.filter(run_id=run_id).first)
    if run is not None and is_waiting(run):
        # Nobody executes a run that waits for approval (or for a worker after its decision): this
        # process ends it, its pending calls closed.
        from agent.runtime.sweeper import publish_swept

        if await db(cancel_waiting, run=run):
            await publish_swept([run_id])
            return RunStatus.CANCELLED
        return await db(
            lambda: DiagnosisRun.objects.filter(run_id=run_id).values_list("status", flat=True).first() or ""
        )
    owned = _runs.get(run_id)
    if owned is not None and not owned.task.done():
        owned.token.cancel("cancel requested")
        return status
    layer = get_channel_layer()
    if layer is not None:
        try:
            await layer.group_send(control_group(run_id), {"type": CONTROL_MESSAGE_TYPE, "run_id": run_id})
        except Exception as exc:  # the owner's heartbeat still reads the column
            logger.warning("cancel message failed run=%s error=%s", run_id, type(exc).__name__)
    return status


# -------------------------------------------------------------------------------------------------
# Background duties of the process: control listener and periodic sweeper
# -------------------------------------------------------------------------------------------------
def control_group(run_id: str) -> str:
    return f"runctl.{run_id}"


@dataclass(slots=True)
class _Background:
    loop: asyncio.AbstractEventLoop
    channel: str | None
    tasks: list[asyncio.Task]
    ready: asyncio.Event
    # Set by `stop_claiming`: the queue worker and the adoption claim nothing more. An adoption pass holds
    # `claiming`, so the drain waits for a claim in flight to be launched (a claim cancelled mid-way would
    # leave its run held by nobody until its lease lapsed).
    claims_stopped: asyncio.Event
    claiming: asyncio.Lock
    # The control listener's loop, stopped by `Receiver.stop` (a cancel alone can be lost inside the
    # channel layer's receive: agent.runtime.receiver).
    control: Receiver | None = None


_background: _Background | None = None


def ensure_background(*, serve_queue: bool = True) -> None:
    """Start this process's control listener, periodic sweeper, checkpointer, purge, trace exporter
    (when an OTLP endpoint is set), the duties apps registered (`agent.runtime.duties`) and (unless
    `serve_queue` is false, or `AIOPS_WORKER_CONCURRENCY` is 0) queue worker once (again after a loop
    change)."""
    global _background
    if drain.draining():  # a draining process starts nothing again (its claims stopped on purpose)
        return
    loop = asyncio.get_running_loop()
    if (
        _background is not None
        and _background.loop is loop
        and not loop.is_closed()
        and all(not t.done() for t in _background.tasks)
    ):
        return
    ready, claims_stopped = asyncio.Event(), asyncio.Event()
    tasks = [loop.create_task(_control_listener(ready), name="runs:control")]
    exporting = bool(settings.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
    duties = (
        ("runs:sweeper", "sweep", _sweep, float(settings.RUN_SWEEP_INTERVAL_SECONDS)),
        (
            "audit:checkpoint",
            "checkpoint",
            _checkpoint,
            float(settings.AUDIT_CHECKPOINT_INTERVAL_SECONDS),
        ),
        (
            "audit:purge",
            "audit purge",
            _purge,
            float(settings.AUDIT_PURGE_INTERVAL_SECONDS),
        ),
        (
            "telemetry:export",
            "trace export",
            _export,
            float(settings.OTEL_EXPORT_INTERVAL_SECONDS) if exporting else 0.0,
        ),
    )
    duties += tuple((d.name, d.what, d.job, float(d.interval())) for d in registered_duties.registered())
    for name, what, job, every in duties:  # an interval of 0 turns a duty off
        if every > 0:
            tasks.append(loop.create_task(_periodically(every, what, job), name=name))
    workers = int(settings.AIOPS_WORKER_CONCURRENCY)
    if workers > 0 and serve_queue:
        tasks.append(loop.create_task(_work_queue(workers, claims_stopped), name=QUEUE_DUTY))
    adopt_every = float(settings.RUN_ADOPT_INTERVAL_SECONDS)
    if adopt_every > 0 and serve_queue:
        tasks.append(loop.create_task(_periodically(adopt_every, "adoption", _adopt), name=ADOPT_DUTY))
    _background = _Background(
        loop=loop,
        channel=None,
        tasks=tasks,
        ready=ready,
        claims_stopped=claims_stopped,
        claiming=asyncio.Lock(),
    )


async def _control_listener(ready: asyncio.Event) -> None:
    layer = get_channel_layer()
    if layer is None:
        ready.set()
        return
    # The default prefix, like the followers' channels: channels_redis pops one Redis list per prefix and
    # lets one receiver at a time do it, so a second prefix would hold every follower's frames behind
    # this listener's blocking pop (up to 5 s per round).
    channel = await layer.new_channel()
    receiver = Receiver(layer, channel, _on_control, what="control", pause=1.0)
    if _background is not None:
        _background.channel, _background.control = channel, receiver
    ready.set()
    await receiver.run()


def _on_control(message: dict) -> None:
    if message.get("type") == CONTROL_MESSAGE_TYPE:
        owned = _runs.get(str(message.get("run_id", "")))
        if owned is not None:
            owned.token.cancel("cancel requested")


async def _control_channel() -> str | None:
    ensure_background()
    background = _background
    if background is None:
        return None
    try:
        await asyncio.wait_for(background.ready.wait(), 5.0)
    except TimeoutError:
        return None
    return background.channel


async def _control_join(run_id: str) -> bool:
    channel = await _control_channel()
    layer = get_channel_layer()
    if channel is None or layer is None:
        return False
    try:
        await asyncio.wait_for(layer.group_add(control_group(run_id), channel), 5.0)
    except Exception as exc:
        logger.warning("control join failed run=%s error=%s", run_id, type(exc).__name__)
        return False
    return True


async def _control_leave(run_id: str) -> None:
    channel = _background.channel if _background is not None else None
    layer = get_channel_layer()
    if channel is None or layer is None:
        return
    with contextlib.suppress(Exception):
        await asyncio.shield(asyncio.wait_for(layer.group_discard(control_group(run_id), channel), 5.0))


async def _periodically(interval: float, what: str, job) -> None:
    """Run `job()` every `interval` seconds (the first time after one interval); a failing pass is
    logged by its exception class only and the next one runs on time."""
    while True:
        await asyncio.sleep(interval)
        try:
            await job()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("periodic %s failed error=%s", what, type(exc).__name__)


async def _sweep() -> None:
    await publish_swept(await duty(sweep_expired_runs))
    # Approval requests past APPROVAL_TIMEOUT_SECONDS: recorded EXPIRED (treated as rejected).
    for decided in await duty(expire_due):
        await publish(decided.run_id, decision_event(decided))


async def _checkpoint() -> None:
    await duty(periodic_checkpoint)


async def _purge() -> None:
    await duty(purge_expired_runs, purged_by="server")


async def _export() -> None:
    # On its own pool: an OTLP endpoint that hangs never takes a thread from the audit writes.
    await background(run_export_pass)


async def adopt_handed_over(*, stopped: asyncio.Event | None = None) -> int:
    """Claim and launch every run another process handed over (`agent.runtime.drain`), each under a new
    lease epoch, until none is left (or `stopped` is set, or this process drains); how many."""
    adopted = 0
    while not drain.draining() and not (stopped is not None and stopped.is_set()):
        run = await db(services.claim_handed_over, owner=lease_owner())
        if run is None:
            break
        logger.info("handed-over run claimed run=%s flow=%s", run.run_id, run.agent_flow)
        launch(run.run_id, claimed=run)
        adopted += 1
    return adopted


async def _adopt() -> None:
    background = _background
    if background is None:
        return
    async with background.claiming:
        await adopt_handed_over(stopped=background.claims_stopped)


async def stop_claiming() -> None:
    """This process takes no more runs (the drain): its queue worker and adoption finish the claim in
    flight (launching it) and stop; the runs they launched go on."""
    background = _background
    if background is None or background.loop is not asyncio.get_running_loop():
        return
    background.claims_stopped.set()
    async with background.claiming:  # an adoption pass in progress has launched what it claimed
        pass
    for task in background.tasks:
        if task.get_name() == ADOPT_DUTY:
            task.cancel()  # between passes: it holds no claim
        elif task.get_name() == QUEUE_DUTY:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(task), 30)  # it stops after its claim in flight


async def _work_queue(concurrency: int, stop: asyncio.Event) -> None:
    from agent.runtime.worker import work

    interval = float(settings.AIOPS_POLL_INTERVAL_SECONDS)
    while not stop.is_set():
        try:
            await work(launch=launch, concurrency=concurrency, poll_interval=interval, stop=stop)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("queue worker failed error=%s", type(exc).__name__)
            await asyncio.sleep(interval)


def duty_status() -> dict[str, bool]:
    """Whether each background duty of this process runs on the current event loop, by task name
    (`runs:control`, `runs:sweeper`, ...; a duty switched off by its setting is absent). Empty when
    `ensure_background` has not run on this loop. Read by the readiness probe (`surfaces.health`)."""
    background = _background
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return {}
    if background is None or background.loop is not loop:
        return {}
    return {task.get_name(): not task.done() for task in background.tasks}


HEALTH_PATH = "/healthz"


class BackgroundDuties:
    """ASGI wrapper that starts the process's background duties (`ensure_background`) with the first
    connection or at lifespan start-up (servers that send it, e.g. uvicorn), so a server process serves
    the queue and sweeps leases even when no chat has run in it; `python -m config.serve` starts them
    earlier, at process start. Lifespan shutdown stops them. A request for `HEALTH_PATH` does not start
    them: the probe must report whether the process started them by itself. While the process drains
    (`agent.runtime.drain`), every new request but the probe is refused here (`_refuse_draining`)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if drain.draining() and scope["type"] in ("http", "websocket") and scope.get("path") != HEALTH_PATH:
            return await _refuse_draining(scope, receive, send)
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    start_serving()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await shutdown()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if not (scope["type"] == "http" and scope.get("path") == HEALTH_PATH):
            ensure_background()
        return await self.app(scope, receive, send)


DRAINING_CODE = "service_draining"
DRAINING_MESSAGE = "This server process is restarting; send the request again (another process answers it)."


async def _refuse_draining(scope, receive, send) -> None:
    """A new request to a draining process (`agent.runtime.drain`), refused before anything is done:
    HTTP 503 `service_draining` in the contract's error shape, `Retry-After: 1`, `Connection: close` (the
    proxy sends it to another process: docs/deployment.md, *Draining restarts*); a WebSocket is
    accepted and closed at once with 1012 (service restart), which chat clients answer by reconnecting."""
    if scope["type"] == "websocket":
        message = await receive()
        if message.get("type") == "websocket.connect":
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": 1012})
        return
    import json

    from core.api import error_body

    body = json.dumps(error_body(DRAINING_CODE, DRAINING_MESSAGE)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
                (b"connection", b"close"),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def stop_background() -> None:
    """Stop this process's background duties (graceful shutdown, tests). Runs are not affected."""
    global _background
    background, _background = _background, None
    if background is None or background.loop is not asyncio.get_running_loop():
        return
    if background.control is not None:
        await background.control.stop(CONTROL_STOP_SECONDS)
    for task in background.tasks:
        task.cancel()
    for task in background.tasks:
        with contextlib.suppress(BaseException):
            await task


def start_serving() -> None:
    """This loop is a serving process's, for the process's whole life: the MCP sessions live on it (a
    run's MCP call then takes no thread hop: `agent.mcp.hub.serve_on`) and the background duties start.
    The model client is built now (`llm.warm_client`: its TLS context takes 10-30 ms in which the loop
    runs nothing else), not in the first chat, and `warm_up` runs on the duties' pool (nothing left to
    do after `python -m config.serve` ran it). `python -m config.serve` calls it at process start,
    `BackgroundDuties` at lifespan start-up."""
    from agent.mcp.hub import serve_on

    loop = asyncio.get_running_loop()
    serve_on(loop)
    warm_client()
    warming = loop.create_task(duty(warm_up), name="warm-up")
    _warming.add(warming)
    warming.add_done_callback(_warming.discard)
    ensure_background()


_warming: set[asyncio.Task] = set()  # start-up builds in progress (a task needs a reference to live)


def warm_up() -> bool:
    """Build what a serving process's first chats would otherwise build while they wait: the knowledge
    index (0.5-1 s, which every run starting meanwhile waited for: B3's first chats then came out of
    start-up together, docs/performance.md). Synchronous ORM work, off any event loop: `python -m
    config.serve` runs it before the server listens, `start_serving` on the duties' pool. A failure is
    logged by class and left to the first search; True when everything was built."""
    from agent.knowledge.retrieval import warm_knowledge_index

    try:
        warm_knowledge_index()
    except Exception as exc:
        logger.warning("knowledge index not built at start error=%s", type(exc).__name__)
        return False
    return True


def settle() -> None:
    """What the process holds by now lives as long as it does (Django, the apps, the URL map, the
    knowledge index): keep it out of the cyclic collector's passes (`gc.freeze`). Each full pass walked
    that start-up heap, 70-190 ms on a server's loop or inside a worker's analyses (docs/performance.md).
    Cyclic garbage left over from start-up is collected first, so none of it is kept for good. Called
    once a serving process has built what it keeps: at the end of `config.asgi`, and by `run_worker`
    after `warm_up`."""
    gc.collect()
    gc.freeze()


async def shutdown() -> bool:
    """The server process is ending: stop its background duties, then close this loop's model clients
    (their connection pools; an aiohttp session left open is reported as an error when it is collected)
    and the MCP sessions (stdio servers end with them), each stage bounded (`agent.runtime.shutdown`: a
    stage still waiting at the deadline is logged with where it waits and left behind). `python -m
    config.serve` runs it before daphne's reactor stops, `BackgroundDuties` at lifespan shutdown. True
    when every stage ended."""
    from agent.mcp.hub import aclose_hub

    deadline = Deadline(SHUTDOWN_SECONDS)
    duties = _background.tasks if _background is not None else ()
    ended = await bounded("stopping the background duties", stop_background(), deadline, watch=duties)
    ended &= await bounded("closing the model clients", aclose_clients(), deadline)
    ended &= await bounded("closing the MCP sessions", aclose_hub(), deadline)
    return ended
