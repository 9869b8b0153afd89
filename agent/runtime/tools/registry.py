"""The tool registry: what tools exist, their JSON schema, their timeout, and how the model sees them.

A tool is one module in `agent/runtime/tools/` with one function decorated by `register_tool` (name,
description, JSON `parameters`, `timeout`, `flows`, `requires_approval`, `available`, `action`); it
receives the validated arguments and returns a `ToolResult`. `default_registry(flow=...)` imports every
module of the package and returns that flow's tools; `offered()` leaves out those whose backend cannot
run them. Arguments are validated against the schema subset the runtime relies on.
Details: docs/runtime.md, *Adding a tool*; docs/contributing.md, *A new tool*.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from audit.write import RetrievalFacts

SKIP_MODULES = frozenset({"registry", "boundary"})

# Agent flows (the values of `DiagnosisRun.agent_flow`) a tool may be offered to.
FLOW_CHAT = "DIAGNOSIS_AGENT"
FLOW_AI_OPS = "AI_OPS"


@dataclass(frozen=True, slots=True)
class EvidenceRecord:
    """One citable piece of evidence a tool returned: `id` (e.g. `kb:<slug>#<n>`) and its full payload,
    stored by id in the run's canonical store."""

    id: str
    payload: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool returns.

    `data` is the full, JSON-serialisable result: it goes to the canonical store (by tool call id) and its
    bounded preview, length and sha256 to the audit. `evidence` are the citable items. `retrieval` are
    the retrieval facts recorded on the tool invocation. `model_content` is what the model sees (default:
    the JSON of `data`); it must never hold more than the tool's own output.
    """

    data: Any
    evidence: Sequence[EvidenceRecord] = ()
    retrieval: RetrievalFacts | None = None
    model_content: str | None = None


class ToolArgumentsError(ValueError):
    """The model's arguments do not match the tool's schema (becomes TOOL_BAD_ARGUMENTS)."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: Mapping[str, Any]
    func: Callable[..., Any]
    timeout: float | None = None
    is_async: bool = field(default=False)
    flows: frozenset[str] = frozenset({FLOW_CHAT})
    # A tool that changes the world waits for a person: the boundary records the call AWAITING_APPROVAL
    # and interrupts the run instead of executing it (docs/aiops.md, *Approvals*).
    requires_approval: bool = False
    # Checks the schema cannot state (e.g. a bound that is a setting); raises ToolArgumentsError.
    check: Callable[[dict[str, Any]], None] | None = None
    # Why the tool cannot run now (its backend not configured or not reachable), or None: a tool with a
    # reason is not offered to a run (`ToolRegistry.offered`). Cheap and bounded: it runs at each start.
    available: Callable[[], str | None] | None = None
    # What an approved call will do, for the person asked (`requires_approval` tools): from the
    # validated arguments, `{"executedBy": who acts, "where": the backend's host, "lastsMinutes": how
    # long its effect lasts once made, or None}` (docs/aiops.md, *Approvals*).
    action: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # Where the tool comes from: "" for this package's tools, `mcp:<server>` for an MCP server's
    # (`agent.mcp.toolset`; the run's configuration lists those by server).
    origin: str = ""

    @property
    def changes_world(self) -> bool:
        """Whether a call changes something outside this service: the one mark that keeps such a call
        out of replays (`agent.runtime.replay`). Today a tool that requires approval."""
        return self.requires_approval

    def openai_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def validate(self, arguments: str | Mapping[str, Any] | None) -> dict[str, Any]:
        """Parse the model's argument string and check it against the schema; defaults applied."""
        if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
            value: Any = {}
        elif isinstance(arguments, str):
            try:
                value = json.loads(arguments)
            except ValueError as exc:
                raise ToolArgumentsError(f"arguments are not valid JSON ({exc.msg})") from None
        else:
            value = dict(arguments)
        validated = _validate_object(value, self.parameters, "arguments")
        if self.check is not None:
            self.check(validated)
        return validated


class ToolRegistry:
    """A set of tools by name. `tool(...)` is the decorator form of `register`."""

    def __init__(self, specs: Sequence[ToolSpec] = (), *, absent: Mapping[str, str] | None = None) -> None:
        self._specs: dict[str, ToolSpec] = {}
        # Tools of the flow known not to be here, with why (an MCP server not connected): `offered`
        # reports them as left out.
        self.absent: dict[str, str] = dict(absent or {})
        for spec in specs:
            self.register(spec)

    def register(self, spec: ToolSpec) -> ToolSpec:
        existing = self._specs.get(spec.name)
        if existing is not None and existing.func is not spec.func:
            raise ValueError(f"a tool named {spec.name!r} is registered already")
        self._specs[spec.name] = spec
        return spec

    def tool(
        self,
        *,
        name: str,
        description: str,
        parameters: Mapping[str, Any],
        timeout: float | None = None,
        flows: Sequence[str] = (FLOW_CHAT,),
        requires_approval: bool = False,
        check: Callable[[dict[str, Any]], None] | None = None,
        available: Callable[[], str | None] | None = None,
        action: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        if parameters.get("type") != "object":
            raise ValueError("a tool's parameters schema must be of type object")
        if isinstance(flows, str) or not flows:
            raise ValueError("a tool's flows must be a non-empty sequence of flow names")

        def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
            self.register(
                ToolSpec(
                    name=name,
                    description=description,
                    parameters=dict(parameters),
                    func=func,
                    timeout=timeout,
                    is_async=inspect.iscoroutinefunction(func),
                    flows=frozenset(flows),
                    requires_approval=requires_approval,
                    check=check,
                    available=available,
                    action=action,
                )
            )
            return func

        return decorate

    def get(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    def names(self) -> list[str]:
        return sorted(self._specs)

    def openai_tools(self) -> list[dict[str, Any]]:
        return [self._specs[name].openai_schema() for name in self.names()]

    def copy(self) -> ToolRegistry:
        return ToolRegistry(list(self._specs.values()))

    def for_flow(self, flow: str) -> ToolRegistry:
        """A new registry of the tools that declare `flow`."""
        return ToolRegistry([spec for spec in self._specs.values() if flow in spec.flows])

    def only(self, names: Iterable[str]) -> ToolRegistry:
        """A new registry of the tools named in `names` (a resumed run keeps the tools it started with)."""
        keep = set(names)
        if keep >= set(self._specs):
            return self
        return ToolRegistry([spec for spec in self._specs.values() if spec.name in keep])

    def checks_availability(self) -> bool:
        """Whether `offered` has a tool's `available` check to run (only then does it block)."""
        return any(spec.available is not None for spec in self._specs.values())

    def offered(self) -> tuple[ToolRegistry, dict[str, str]]:
        """`(the tools that can run now, {name: why not} of those left out)` (this registry itself when
        none is left out): each tool's `available` check, concurrently (checks of one backend share its
        probe); a check that raises leaves its tool out too, since nothing says it can run. Blocking:
        the executor runs it on the tool pool."""
        checked = [spec for spec in self._specs.values() if spec.available is not None]
        if not checked:
            return self, dict(self.absent)
        with ThreadPoolExecutor(max_workers=len(checked), thread_name_prefix="tool-available") as pool:
            futures = {spec.name: pool.submit(spec.available) for spec in checked}  # type: ignore[arg-type]
        left_out: dict[str, str] = dict(self.absent)
        for name, future in futures.items():
            try:
                reason = future.result()
            except Exception as exc:
                reason = f"{type(exc).__name__}: the availability check failed"
            if reason:
                left_out[name] = str(reason)[:300]
        if not left_out:
            return self, {}  # this very registry (a caller's own kind of registry stays itself)
        if left_out.keys() <= self.absent.keys():
            return self, left_out
        return ToolRegistry([s for s in self._specs.values() if s.name not in left_out]), left_out

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __len__(self) -> int:
        return len(self._specs)


_default = ToolRegistry()
_discovered = False
_discover_lock = threading.Lock()


def register_tool(
    *,
    name: str,
    description: str,
    parameters: Mapping[str, Any],
    timeout: float | None = None,
    flows: Sequence[str] = (FLOW_CHAT,),
    requires_approval: bool = False,
    check: Callable[[dict[str, Any]], None] | None = None,
    available: Callable[[], str | None] | None = None,
    action: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function in the default registry (see the module docstring)."""
    return _default.tool(
        name=name,
        description=description,
        parameters=parameters,
        timeout=timeout,
        flows=flows,
        requires_approval=requires_approval,
        check=check,
        available=available,
        action=action,
    )


def default_registry(*, flow: str = FLOW_CHAT) -> ToolRegistry:
    """The tools of agent flow `flow` (a new registry each call), every tool module of this package
    imported first, and the tools of the configured MCP servers serving the flow (`agent.mcp.toolset`;
    what they leave out is the registry's `absent`)."""
    global _discovered
    if not _discovered:
        with _discover_lock:
            if not _discovered:
                package = importlib.import_module("agent.runtime.tools")
                for module in pkgutil.iter_modules(package.__path__):
                    if module.name not in SKIP_MODULES and not module.name.startswith("_"):
                        importlib.import_module(f"agent.runtime.tools.{module.name}")
                _discovered = True
    from agent.mcp.toolset import mcp_tools  # the MCP toolsets build on this module

    native = _default.for_flow(flow)
    specs, absent = mcp_tools(flow)
    if not specs and not absent:
        return native
    return ToolRegistry([*(native.get(n) for n in native.names()), *specs], absent=absent)  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------------
# Schema validation (the subset tools use)
# ---------------------------------------------------------------------------------------------------
_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _validate_object(value: Any, schema: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ToolArgumentsError(f"{where} must be a JSON object")
    properties: Mapping[str, Any] = schema.get("properties") or {}
    out = dict(value)
    for name in schema.get("required") or []:
        if name not in out:
            raise ToolArgumentsError(f"{where}.{name} is required")
    if schema.get("additionalProperties") is False:
        extra = sorted(set(out) - set(properties))
        if extra:
            raise ToolArgumentsError(f"{where} has unknown field(s): {', '.join(extra[:5])}")
    for name, sub in properties.items():
        if name not in out:
            if "default" in sub:
                out[name] = sub["default"]
            continue
        out[name] = _validate_value(out[name], sub, f"{where}.{name}")
    return out


def _validate_value(value: Any, schema: Mapping[str, Any], where: str) -> Any:
    kind = schema.get("type")
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(kind, str) and not _TYPES.get(kind, lambda v: True)(value):
        raise ToolArgumentsError(f"{where} must be of type {kind}")
    if "enum" in schema and value not in schema["enum"]:
        raise ToolArgumentsError(f"{where} must be one of {schema['enum']}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            raise ToolArgumentsError(f"{where} must have at least {schema['minLength']} character(s)")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise ToolArgumentsError(f"{where} must have at most {schema['maxLength']} characters")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise ToolArgumentsError(f"{where} must be ≥ {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise ToolArgumentsError(f"{where} must be ≤ {schema['maximum']}")
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise ToolArgumentsError(f"{where} must have at most {schema['maxItems']} item(s)")
        if "items" in schema:
            value = [_validate_value(item, schema["items"], f"{where}[{i}]") for i, item in enumerate(value)]
    if kind == "object":
        value = _validate_object(value, schema, where)
    return value
