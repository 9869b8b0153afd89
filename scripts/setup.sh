#!/usr/bin/env bash
# Prepare this checkout on a Debian machine: system packages (as root), a Python 3.11 venv in .venv, and
# the pinned requirements. Idempotent and quick when nothing changed. Usage: scripts/setup.sh [dev]
set -euo pipefail
cd "$(dirname "$0")/.."

want_dev="${1:-}"

apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages: ${missing[*]} (run as root, or install them yourself)" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# mysqlclient builds against the MariaDB client library.
apt_install pkg-config libmariadb-dev gcc
# Browser tests drive Debian's Chromium through Playwright (never a downloaded browser); CJK fonts so
# screenshots of Chinese runbooks are legible.
[ "$want_dev" = "dev" ] && apt_install chromium fonts-noto-cjk

PY=""
for candidate in python3.11 python3; do
  if command -v "$candidate" >/dev/null 2>&1 && \
     "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    PY="$candidate"; break
  fi
done
if [ -z "$PY" ]; then
  apt_install python3 python3-venv python3-dev
  PY=python3
fi
"$PY" -c 'import venv, ensurepip' 2>/dev/null || apt_install python3-venv python3-dev

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$PY" --version)"
  "$PY" -m venv .venv
fi

reqs=requirements.txt
[ "$want_dev" = "dev" ] && reqs=requirements-dev.txt
stamp=".venv/.installed-$(basename "$reqs")"
digest=$(cat requirements.txt requirements-dev.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$digest" ]; then
  echo "setup: installing $reqs"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r "$reqs"
  echo "$digest" > "$stamp"
fi
