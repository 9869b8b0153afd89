"""Debian's Chromium for the browser tests: where it is, how it is started, and the skip when it is absent.

Playwright drives `/usr/bin/chromium` (installed by `scripts/setup.sh dev`); it never downloads a browser.
The flags keep Chromium from reaching for the network, which this machine refuses.
"""

from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

requires_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason="needs Debian's Chromium at /usr/bin/chromium (apt-get install chromium)",
)


def launch_chromium(playwright):
    """A headless Chromium browser from a running Playwright."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
