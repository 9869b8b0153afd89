"""The executor's saved state: how an attempt that ends unfinished (calls waiting for approval, a
handover by a draining process) keeps what the run needs to go on, and how the next attempt reads it back.

`RunInterrupted` (`RunHandedOver`) carries the agent loop's state to the executor; `save_state` stores it
in the run's canonical store, encrypted with the reasoning keys, its digest chained in RUN_INTERRUPTED;
`saved_state` reads it back once, checked against that digest (fail-closed: `ResumeStateUnavailable`).
The reasoning purge erases saved states with the reasoning (`discard_resume_states`). Details:
docs/aiops.md, *Approvals*; docs/runtime.md, *Handover*.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.dispatch import receiver

from agent.runtime.canonical import CanonicalUnavailable, delete_states
from audit.models import EventType
from audit.payloads import canonical_json, sha256_hex
from audit.verify.authenticity import authenticated_chain
from audit.write import ChainNotAuthentic
from reasoning import crypto
from reasoning.signals import reasoning_purging

logger = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1
CHECKPOINT = "checkpoint"  # the state's name in the run's canonical store (`run:<id>:state:checkpoint`)


@dataclass
class RunInterrupted(Exception):
    """The agent loop stopped because calls of its last step wait for approval. `messages` end with
    that step's assistant turn; `calls` are its calls in order (`DeclaredToolCall`s); `results` the
    tool messages of the calls that did run, by `tool_call_id`; `pending` the waiting calls' ids."""

    agent_name: str
    messages: list[dict[str, Any]]
    calls: list[Any]
    results: dict[str, dict[str, Any]]
    pending: list[str]
    steps_used: int
    max_steps: int
    # Calls whose bare error was observed: kept pending, run again by the resumption (seed 002).
    kept: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    checkpoint_sha256: str = ""

    def __post_init__(self) -> None:
        super().__init__(f"{len(self.pending)} call(s) wait for approval")


@dataclass
class RunHandedOver(RunInterrupted):
    """The serving process drains (`agent.runtime.drain`): the agent loop stopped at a step boundary and
    the run goes to another process with the same saved state an interruption keeps. Nothing waits:
    `calls`, `pending` and `kept` are empty and every result of the last step is in `messages`.
    `retried_step`: the index of the model step whose stream was cut (recorded abandoned; the next owner
    asks the model again), 0 when the run stopped between steps and nothing is repeated."""

    retried_step: int = 0

    def __post_init__(self) -> None:
        Exception.__init__(self, "the run is handed over to another process")

    def record(self, *, lease_owner: str) -> dict[str, Any]:
        """What `RunRecorder.hand_over` records of it (the state's digest, where the loop stopped)."""
        return {
            "checkpoint_sha256": self.checkpoint_sha256,
            "reason": "the serving process is stopping; another process continues the run",
            "details": {
                "agentName": self.agent_name,
                "stepsUsed": self.steps_used,
                "retriedStep": self.retried_step,
                "leaseOwner": lease_owner,
            },
        }


class ResumeStateUnavailable(Exception):
    """The interrupted run's saved state is missing or differs from the digest its record names."""


def checkpoint_of(interrupted: RunInterrupted, *, step_counts: dict[str, int], gathered: list[str]) -> str:
    """The executor's state at the interruption, as canonical JSON."""
    return canonical_json(
        {
            "version": CHECKPOINT_VERSION,
            "agentName": interrupted.agent_name,
            "messages": interrupted.messages,
            "calls": [
                {
                    "toolCallId": c.tool_call_id,
                    "providerToolCallId": c.provider_id,
                    "name": c.name,
                    "arguments": c.arguments,
                }
                for c in interrupted.calls
            ],
            "results": interrupted.results,
            "pending": interrupted.pending,
            "kept": interrupted.kept,
            "stepsUsed": interrupted.steps_used,
            "maxSteps": interrupted.max_steps,
            "stepCounts": step_counts,
            "gatheredEvidence": gathered,
            "extra": interrupted.extra,
        }
    )


def interrupted_record(run_id: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The last RUN_INTERRUPTED's details and each pending call's latest APPROVAL_DECIDED details (by
    `tool_call_id`), read from the run's chain once it is proven written by the service
    (`audit.verify.authenticity.authenticated_chain`; else `ResumeStateUnavailable`: a decision a database
    writer put into the chain, or changed, releases nothing)."""
    try:
        chain = authenticated_chain(run_id)
    except ChainNotAuthentic:
        raise ResumeStateUnavailable("the run's recorded chain does not authenticate") from None
    interrupted: dict[str, Any] = {}
    decisions: dict[str, dict[str, Any]] = {}
    for event in chain:
        if event.event_type not in (EventType.RUN_INTERRUPTED, EventType.APPROVAL_DECIDED):
            continue
        details = event.details if isinstance(event.details, dict) else {}
        if event.event_type == EventType.RUN_INTERRUPTED:
            interrupted, decisions = details, {}
        else:
            decisions[str(details.get("toolCallId"))] = details
    return interrupted, decisions


def checkpoint_lifetime_seconds() -> int:
    """How long the saved state is kept (its canonical-store TTL): the request's timeout
    (`APPROVAL_TIMEOUT_SECONDS`, decisions after it are expiries) plus the time a decided run may wait
    for a worker (`AIOPS_QUEUE_TIMEOUT_SECONDS`; after it the sweeper fails the run, so nothing can
    resume it any more). Nothing reads the state after that."""
    from agent.runtime.approvals import timeout_seconds
    from agent.runtime.sweeper import queue_timeout_seconds

    return timeout_seconds() + int(queue_timeout_seconds())


def save_checkpoint(canonical: Any, text: str) -> str:
    """Store the executor's state `text` (`checkpoint_of`: it holds the conversation, so the provider's
    `reasoning_content` and the assistant's text) in the run's canonical store, encrypted with the
    reasoning keys exactly as the reasoning table stores its rows (`reasoning.crypto.keyring()`: the
    newest key, `fernet:<kid>:<token>`), kept `checkpoint_lifetime_seconds()`, read back. Returns the
    sha256 of the value as stored (ciphertext), which RUN_INTERRUPTED chains. Fail-closed: a state that
    cannot be encrypted or stored is `ResumeStateUnavailable`, never stored in plaintext."""
    try:
        stored = crypto.keyring().encrypt(text)
        canonical.put_state(CHECKPOINT, stored, timeout=checkpoint_lifetime_seconds())
    except (CanonicalUnavailable, ImproperlyConfigured):  # the store, or no reasoning keys
        raise ResumeStateUnavailable("the executor's state could not be saved for the resumption") from None
    return sha256_hex(stored)


def load_checkpoint(canonical: Any, *, expected_sha256: str) -> dict[str, Any]:
    """The saved state, read back from the canonical store, checked against the digest the chain
    names (over the stored value) and decrypted with the configured reasoning keys (fail-closed:
    missing, unreadable, different, or under a key no longer configured is `ResumeStateUnavailable`).
    Rotating the reasoning keys does not rewrite a saved state (its digest is chained): a retired key
    stays configured for `checkpoint_lifetime_seconds()` after a rotation, as docs/aiops.md says."""
    try:
        stored = canonical.get_state(CHECKPOINT)
    except Exception:  # CanonicalUnavailable and the cache's own errors alike
        raise ResumeStateUnavailable("the saved state could not be read") from None
    if not stored or not expected_sha256 or sha256_hex(stored) != expected_sha256:
        raise ResumeStateUnavailable("the saved state is missing or differs from the recorded digest")
    try:
        text = crypto.keyring().decrypt(stored)
    except (crypto.Undecryptable, ImproperlyConfigured):
        raise ResumeStateUnavailable("the saved state cannot be decrypted with the configured keys") from None
    state = json.loads(text)
    if state.get("version") != CHECKPOINT_VERSION:
        raise ResumeStateUnavailable("the saved state has an unknown version")
    return state


async def save_state(ctx: Any, interrupted: RunInterrupted, *, extra: dict[str, Any]) -> None:
    """The one way an attempt that ends unfinished keeps its state (an interruption for approval, a
    handover): `interrupted` with `extra` and the run context's step counts, evidence and canonical flag,
    saved (`save_checkpoint`); its digest set on `interrupted` for RUN_INTERRUPTED to chain."""
    from agent.runtime.db import db

    interrupted.extra = {**extra, "canonicalDegraded": ctx.canonical_degraded}
    text = checkpoint_of(interrupted, step_counts=dict(ctx.step_counts), gathered=list(ctx.gathered_evidence))
    interrupted.checkpoint_sha256 = await db(save_checkpoint, ctx.canonical, text)


async def saved_state(ctx: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The state the run's last attempt saved (`save_state`) and the decisions recorded since
    (`interrupted_record`), read back, checked against the digest RUN_INTERRUPTED chains and decrypted
    (fail-closed: `ResumeStateUnavailable`), then dropped from the store (read once: a later interruption
    saves a new state); the run context's step counts, evidence and canonical flag restored."""
    from agent.runtime.db import db, read

    interrupted, decisions = await read(interrupted_record, ctx.run_id)
    state = await db(
        load_checkpoint, ctx.canonical, expected_sha256=str(interrupted.get("checkpointSha256") or "")
    )
    await db(forget_checkpoint, ctx.canonical)
    ctx.step_counts.update({str(k): int(v) for k, v in (state.get("stepCounts") or {}).items()})
    ctx.gathered_evidence.extend(state.get("gatheredEvidence") or [])
    ctx.canonical_degraded = bool((state.get("extra") or {}).get("canonicalDegraded"))
    return state, decisions


def forget_checkpoint(canonical: Any) -> None:
    """Drop a run's saved state once it is no longer needed (read back by the resumption, or the run
    cancelled while it waited). Best effort: the TTL bounds it if the store cannot be reached."""
    try:
        delete_states([canonical.run_id], CHECKPOINT, alias=canonical.alias)
    except CanonicalUnavailable:
        logger.warning("saved state not dropped run=%s (it expires with its TTL)", canonical.run_id)


@receiver(reasoning_purging, dispatch_uid="agent.runtime.resume_state.discard_resume_states")
def discard_resume_states(*, run_ids: Any, **_signal: Any) -> None:
    """Erase the saved state of every run in `run_ids` (an iterable of run ids, e.g. a queryset): the
    reasoning purge sends `reasoning.signals.reasoning_purging` before it erases any row, with the runs
    whose rows it is about to purge,
    because a saved state holds the same reasoning (`audit.write.reasoning_changes.purge_reasoning`, by age
    and by run; runs under a legal hold are not in its scope, so their state is kept). A run whose state was
    erased that way fails its resumption with RESUME_STATE_UNAVAILABLE: the erasure wins. Raises
    `CanonicalUnavailable` when the store cannot be reached (the purge then erases nothing)."""
    delete_states(run_ids, CHECKPOINT)
