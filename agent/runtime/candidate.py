"""A candidate configuration for an experiment (issue 34 item 4): what replaces the product's own.

A candidate is a JSON or TOML file (`Candidate.load`), every key optional: `name`, `runbooks` (a folder),
`tools` (a subset of the flow's), `[models]` and `[prompts]` per role. `apply_candidate(candidate,
client=…, registry=…)` gives the model client, the registry, the instruction texts and the runbook
corpus that `execute_run` then runs with, so the run's configuration fingerprint is the candidate's.
An unknown key, role or tool is refused (`CandidateError`), never ignored.
Details: docs/experiments.md, *Candidates*.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.knowledge.corpus import Corpus, CorpusError, corpus_from_folder
from agent.runtime.llm import ModelClient, ModelRoles
from agent.runtime.prompts import DEFAULT_PROMPTS, SystemPrompts
from agent.runtime.tools.registry import ToolRegistry

KEYS = frozenset({"name", "description", "models", "prompts", "runbooks", "tools"})
MODEL_ROLES = ("router", "agent", "guard")
PROMPT_CHARS = 20_000


class CandidateError(ValueError):
    """A candidate that cannot be applied; the message is safe to show."""


@dataclass(frozen=True)
class Candidate:
    name: str = ""
    description: str = ""
    models: Mapping[str, str] = field(default_factory=dict)
    prompts: Mapping[str, str] = field(default_factory=dict)
    runbooks: str = ""
    tools: tuple[str, ...] | None = None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, base: Path | None = None) -> Candidate:
        if not isinstance(data, Mapping):
            raise CandidateError("a candidate is an object")
        unknown = set(data) - KEYS
        if unknown:
            raise CandidateError(f"unknown key(s): {', '.join(sorted(unknown))}")
        models = dict(data.get("models") or {})
        bad = set(models) - set(MODEL_ROLES)
        if bad or not all(isinstance(v, str) and v.strip() for v in models.values()):
            raise CandidateError(f"models: roles are {', '.join(MODEL_ROLES)}, each a model name")
        prompts: dict[str, str] = {}
        for role, value in dict(data.get("prompts") or {}).items():
            if role not in SystemPrompts.roles():
                raise CandidateError(f"prompts: unknown role {role!r}")
            if isinstance(value, Mapping) and set(value) == {"file"}:
                path = Path(str(value["file"]))
                path = path if path.is_absolute() or base is None else base / path
                try:
                    value = path.read_text(encoding="utf-8")
                except OSError:
                    raise CandidateError(f"prompts.{role}: cannot read {path.name}") from None
            if not isinstance(value, str) or not value.strip() or len(value) > PROMPT_CHARS:
                raise CandidateError(f"prompts.{role}: a text of 1 to {PROMPT_CHARS} characters")
            prompts[role] = value
        runbooks = str(data.get("runbooks") or "")
        if runbooks and base is not None and not Path(runbooks).is_absolute():
            runbooks = str(base / runbooks)
        tools = data.get("tools")
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)):
            raise CandidateError("tools: a list of tool names")
        return cls(
            name=str(data.get("name") or "")[:200],
            description=str(data.get("description") or "")[:500],
            models=models,
            prompts=prompts,
            runbooks=runbooks,
            tools=tuple(tools) if tools is not None else None,
        )

    @classmethod
    def load(cls, path: str | Path) -> Candidate:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
            data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
        except (OSError, ValueError) as exc:
            raise CandidateError(f"cannot read the candidate {path.name}: {type(exc).__name__}") from None
        return cls.from_mapping(data, base=path.parent.resolve())

    def as_dict(self) -> dict[str, Any]:
        """What the experiment stores: the candidate as applied (prompt texts inline, paths absolute)."""
        out: dict[str, Any] = {"name": self.name, "description": self.description}
        for key in ("models", "prompts"):
            if getattr(self, key):
                out[key] = dict(getattr(self, key))
        if self.runbooks:
            out["runbooks"] = self.runbooks
        if self.tools is not None:
            out["tools"] = list(self.tools)
        return out


class _Renamed:
    """A model client whose roles use the candidate's models; every call goes to the same provider."""

    def __init__(self, inner: ModelClient, roles: ModelRoles) -> None:
        self._inner = inner
        self.provider = inner.provider
        self.roles = roles
        if hasattr(inner, "max_retries"):
            self.max_retries = inner.max_retries

    async def complete(self, **kwargs: Any):
        return await self._inner.complete(**kwargs)


@dataclass(frozen=True)
class Applied:
    client: ModelClient
    registry: ToolRegistry
    prompts: SystemPrompts
    corpus: Corpus | None


def apply_candidate(candidate: Candidate, *, client: ModelClient, registry: ToolRegistry) -> Applied:
    """The runtime's objects under `candidate` (see the module docstring)."""
    if candidate.models:
        roles = dataclasses.replace(client.roles, **dict(candidate.models))
        client = _Renamed(client, roles)
    if candidate.tools is not None:
        missing = [t for t in candidate.tools if t not in registry]
        if missing:
            raise CandidateError(f"tools: not offered to this flow: {', '.join(missing)}")
        registry = ToolRegistry([registry.get(t) for t in candidate.tools])
    prompts = (
        dataclasses.replace(DEFAULT_PROMPTS, **dict(candidate.prompts))
        if candidate.prompts
        else DEFAULT_PROMPTS
    )
    corpus = None
    if candidate.runbooks:
        try:
            corpus = corpus_from_folder(candidate.runbooks)
        except CorpusError as exc:
            raise CandidateError(f"runbooks: {exc}") from None
    return Applied(client=client, registry=registry, prompts=prompts, corpus=corpus)
