"""How `audit.write.run.RunRecorder`, the one front of the recorder, shows its parts (`recorder.chain`,
`decisions`, `tools`, `approvals`): a name declared on the front with `Part("chain")` is the part's
value, one declared with `PartMethod("tools")` the part's method, so decision owners call
`recorder.<method>` and never reach a part."""

from __future__ import annotations

from typing import Any


class Part:
    """A value of `RunRecorder` that is one of its parts': reading it reads the part's, setting it sets
    the part's (`recorder.fenced` is `recorder.chain.fenced`)."""

    __slots__ = ("name", "part")

    def __init__(self, part: str) -> None:
        self.part = part

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, recorder: Any, owner: type | None = None) -> Any:
        if recorder is None:
            return self
        return getattr(getattr(recorder, self.part), self.name)

    def __set__(self, recorder: Any, value: Any) -> None:
        setattr(getattr(recorder, self.part), self.name, value)


class PartMethod:
    """A method of `RunRecorder` that is one of its parts': `recorder.tool_started` is
    `recorder.tools.tool_started`, looked up once and then kept on the recorder (a decision costs no
    more than a method of the recorder itself)."""

    __slots__ = ("name", "part")

    def __init__(self, part: str) -> None:
        self.part = part

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, recorder: Any, owner: type | None = None) -> Any:
        if recorder is None:
            return self
        method = getattr(getattr(recorder, self.part), self.name)
        recorder.__dict__[self.name] = method
        return method
