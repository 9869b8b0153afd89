"""Regenerate the screenshots of docs/chat.md and docs/admin.md: the product with demo data, in headless
Chromium (Debian's /usr/bin/chromium through Playwright, as the browser tests), into docs/images/.

    .venv/bin/python scripts/screenshots.py [--out docs/images] [--width 1280]

What it does, on a throwaway SQLite database (nothing of yours is touched): `migrate`, `bootstrap_demo`
(the demo accounts, the runbooks, demo runs answered by the offline demo model), a known password for
`admin` set in that database only, then `manage.py runserver` (the ASGI server) on a free port of
127.0.0.1 with `DEBUG=true`. As `admin` it asks a question in the chat and waits for the cited answer,
then visits the console's main pages, saving one PNG per page (the names in `SHOTS`). The server and the
database are removed afterwards; exits non-zero when a page fails to load or the answer never comes.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PYTHON = str(ROOT / ".venv" / "bin" / "python")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
QUESTION = "Disk full on /var/log: what do I check first?"
# file name -> what it shows (docs/chat.md and docs/admin.md embed them)
SHOTS = {
    "chat-conversation.png": "the chat: a question, its progress and the cited answer with feedback",
    "admin-index.png": "the admin index: the console's pages, approvals and the review queue's counts",
    "admin-run-list.png": "the run list at 1280 px: the filters folded into one line, every column labelled",
    "admin-run-page.png": "a run page: verdict, answer, feedback, waterfall, ledger, timeline",
    "admin-dashboard.png": "the oversight dashboard",
    "admin-analyse-alert.png": 'AI Ops: "Analyse an alert"',
    "admin-keys.png": "the transparency log's public keys",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(  # noqa: S603 (this checkout's own manage.py, fixed arguments)
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode:
        sys.exit(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _wait_up(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    sys.exit(f"the server at {url} did not come up")


def _shoot(base: str, password: str, out: Path, width: int) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.set_default_timeout(60_000)
            page.goto(f"{base}/admin/login/")
            page.fill("#id_username", "admin")
            page.fill("#id_password", password)
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/")

            page.goto(f"{base}/chat/")
            page.fill("#query", QUESTION)
            page.keyboard.press("Control+Enter")
            turn = page.locator(".turn").last
            # The page's 60 s timeout covers actions only; an assertion waits 5 s unless told (a loaded
            # machine needs longer for the demo model's answer).
            expect(turn).to_have_attribute("data-finished", "true", timeout=120_000)
            page.screenshot(path=str(out / "chat-conversation.png"), full_page=True)

            pages = {
                "admin-index.png": "/admin/",
                "admin-run-list.png": "/admin/diagnosis/diagnosisrun/",
                "admin-dashboard.png": "/admin/diagnosis/diagnosisrun/dashboard/",
                "admin-analyse-alert.png": "/admin/diagnosis/diagnosisrun/analyse/",
                "admin-keys.png": "/admin/diagnosis/diagnosisrun/keys/",
            }
            for name, path in pages.items():
                response = page.goto(f"{base}{path}")
                if response is None or not response.ok:
                    sys.exit(f"{path}: HTTP {response.status if response else '?'}")
                page.screenshot(path=str(out / name), full_page=True)
            page.goto(f"{base}/admin/diagnosis/diagnosisrun/")
            page.locator("#result_list a.dc-run-link").first.click()
            page.wait_for_url("**/change/")
            page.screenshot(path=str(out / "admin-run-page.png"), full_page=True)
        finally:
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--width", type=int, default=1280)
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="screenshots-") as tmp:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "DATABASE_", "REDIS_"))},
            "DEBUG": "true",
            "DATABASE_URL": f"sqlite:///{tmp}/demo.sqlite3",
            "ALERTMANAGER_URL": "",
            "PROMETHEUS_URL": "",
            "RUN_SWEEP_INTERVAL_SECONDS": "0",
        }
        _manage(env, "migrate", "--noinput")
        _manage(env, "bootstrap_demo")
        password = secrets.token_urlsafe(16)
        _manage(
            env,
            "shell",
            "-c",
            "from django.contrib.auth import get_user_model as g; u = g().objects.get(username='admin'); "
            f"u.set_password({password!r}); u.save()",
        )
        port = _free_port()
        log = open(Path(tmp) / "server.log", "w")  # noqa: SIM115 (closed with the directory)
        server = subprocess.Popen(  # noqa: S603 (this checkout's own manage.py on 127.0.0.1)
            [PYTHON, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_up(f"{base}/admin/login/")
            _shoot(base, password, options.out, options.width)
        except SystemExit:
            log.flush()
            print((Path(tmp) / "server.log").read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a loaded machine: the screenshots are written already
                server.kill()
                server.wait(timeout=10)
            log.close()
    for name, what in SHOTS.items():
        print(f"{options.out / name}: {what}")


if __name__ == "__main__":
    main()
