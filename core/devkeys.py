"""Development key files: a key generated once into `.local/` and reused by every process afterwards.

Used only while `DEBUG` is on and no key is configured (the settings name the file only then): the
reasoning encryption key (`reasoning.crypto`) and the audit log's signing key
(`audit.transparency.keys`). The file is created atomically with mode 0600, so that two processes
starting together agree on one key (the first one's), and it is git-ignored.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured


def read_or_create(
    path: str | Path, *, generate: Callable[[], str], validate: Callable[[str], None], what: str
) -> str:
    """The key in `path`, creating it with `generate()` first when the file does not exist. `validate`
    raises ValueError for a value that is not a usable key (then: ImproperlyConfigured, naming `what`
    and the file, never the value)."""
    file = Path(path)
    if not file.exists():
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(generate() + "\n")
        try:
            os.link(tmp, file)  # atomic; fails when another process created the file first
        except FileExistsError:
            pass
        except OSError:
            # A filesystem without hard links: exclusive create (a concurrent reader may retry once).
            try:
                fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as handle:
                    handle.write(tmp.read_text(encoding="ascii"))
        finally:
            tmp.unlink(missing_ok=True)
    key = file.read_text(encoding="ascii").strip()
    try:
        validate(key)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{file} does not hold {what}; delete it to generate one") from exc
    return key
