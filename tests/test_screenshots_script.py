"""scripts/screenshots.py regenerates the docs' screenshots: on a throwaway database with the demo data it
serves the product, asks a question in the chat and visits the console's main pages in headless Chromium,
writing one PNG per entry of `SHOTS` (which docs/chat.md and docs/admin.md embed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser import requires_chromium

pytestmark = [pytest.mark.browser, requires_chromium]
ROOT = Path(__file__).resolve().parents[1]


def test_the_script_writes_every_screenshot_the_docs_embed(tmp_path):
    """Slow (≈ 30 s): the script is run as its users run it, starting its own server and Chromium and
    rendering every screenshot the docs embed."""
    done = subprocess.run(
        [sys.executable, "scripts/screenshots.py", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from screenshots import SHOTS
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    docs = (ROOT / "docs" / "chat.md").read_text() + (ROOT / "docs" / "admin.md").read_text()
    for name in SHOTS:
        png = (tmp_path / name).read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000, name
        assert f"images/{name}" in docs, f"{name} is not embedded in docs/chat.md or docs/admin.md"
