"""Folders of a checkout that are not the project's own files: the virtual environments scripts/setup.sh
makes (`.venv`, `.venv-*`), installed node modules, caches and tools' working copies. The tests that walk
the repository (module sizes, settings read, committed secrets) skip them: one list, so a new environment
is added once."""

LOCAL_DIRS = frozenset(
    {".git", ".local", "node_modules", "mutants", "__pycache__", ".pytest_cache", ".ruff_cache"}
    | {"staticfiles", "test-artifacts", "build"}
)


def is_local(part: str) -> bool:
    """Whether a path component names such a folder."""
    return part in LOCAL_DIRS or part == ".venv" or part.startswith(".venv-") or part.endswith(".egg-info")
