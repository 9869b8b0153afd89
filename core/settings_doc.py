"""The table of docs/configuration.md, generated from the settings' specification (`core.settings_spec`).

    python -m core.settings_doc --write docs/configuration.md   # regenerate the table in place
    python -m core.settings_doc --check docs/configuration.md   # exit 1 when it differs from the spec
    python -m core.settings_doc                                 # print the table

Only the part between the BEGIN and END markers is generated; the prose around it is written by hand.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from core.settings_spec import CASTS, SETTINGS, Setting

COMMAND = "python -m core.settings_doc --write docs/configuration.md"
BEGIN = "<!-- settings table: BEGIN -->"
END = "<!-- settings table: END -->"
HEADER = ("| variable | type | default | meaning |", "|---|---|---|---|")


def shown_default(item: Setting) -> str:
    """The default as people read it; a secret's or a derived default only as its `shown` says."""
    if item.shown:
        return item.shown
    value = item.default
    if callable(value) or (item.secret and value):
        raise ValueError(f"{item.name}: say how its default is shown (shown=...)")
    if value in ("", [], ()):
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, list | tuple):
        value = ",".join(map(str, value))
    return f"`{value}`"


def _kind(item: Setting) -> str:
    kind = CASTS[item.cast]
    return f"{kind}, secret" if item.secret else kind


def table() -> str:
    """The generated part of docs/configuration.md: one table per section, in declaration order."""
    lines = [BEGIN, f"<!-- Generated from core/settings_spec.py by `{COMMAND}`: do not edit by hand. -->"]
    for section, items in itertools.groupby(SETTINGS, key=lambda item: item.section):
        lines += ["", f"### {section}", "", *HEADER]
        for item in items:
            doc = item.doc.replace("|", "\\|")
            lines.append(f"| `{item.name}` | {_kind(item)} | {shown_default(item)} | {doc} |")
    lines += ["", END]
    return "\n".join(lines)


def with_table(text: str) -> str:
    """`text` (the whole document) with its generated part replaced by the current table."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the document has no {BEGIN!r} … {END!r} part")
    return text[:start] + table() + text[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.settings_doc", description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="PATH", help="regenerate the table in this document")
    group.add_argument("--check", metavar="PATH", help="exit 1 when this document's table is stale")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        print(table())
        return 0
    path = Path(args.write or args.check)
    text = path.read_text(encoding="utf-8")
    fresh = with_table(text)
    if args.check:
        if fresh != text:
            print(f"{path} differs from core/settings_spec.py: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    if fresh != text:
        path.write_text(fresh, encoding="utf-8")
        print(f"{path}: table regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
