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

# The AI Ops tests run real Prometheus and Alertmanager processes of their own on free 127.0.0.1 ports
# (tests/agent/aiops/servers.py). The packages' system services (ports 9090 and 9093, nginx's 80) are never wanted here:
# they are kept from starting during the install and are stopped and disabled if they run.
install_without_services() {
  local policy=/usr/sbin/policy-rc.d
  if ! dpkg -s "$@" >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# scripts/setup.sh: no service starts while it installs packages\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    apt_install "$@"
    rm -f "$policy"
    trap - EXIT
  else
    apt_install "$@"
  fi
}
disable_services() {
  [ "$(id -u)" -eq 0 ] || return 0
  for svc in "$@"; do
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
      if systemctl is-enabled --quiet "$svc" 2>/dev/null || systemctl is-active --quiet "$svc" 2>/dev/null; then
        echo "setup: stopping and disabling the $svc service"
        systemctl disable --now --quiet "$svc" || true
      fi
    elif [ -x "/etc/init.d/$svc" ]; then
      if "/etc/init.d/$svc" status >/dev/null 2>&1; then
        echo "setup: stopping the $svc service"
        "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
      fi
      update-rc.d "$svc" disable >/dev/null 2>&1 || true
    fi
  done
}
# The deployment test (tests/config/test_deployment.py) runs Debian's nginx as a foreground process of
# its own with the shipped site (deploy/nginx/); the package's system service (port 80) is never wanted.
# The Galera failover test (tests/core/galera/) runs scripts/mariadb-galera.sh's cluster: Debian's galera-4,
# rsync (its state transfers), socat (the nodes' health checks) and HAProxy in front, a process of its own
# (the package's service is never wanted).
if [ "$want_dev" = "dev" ]; then
  install_without_services prometheus prometheus-alertmanager nginx haproxy galera-4 rsync socat
  disable_services prometheus prometheus-alertmanager nginx haproxy
fi

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

# The project itself, editable, so the offline bundle verifier is a command that runs from any directory:
# .venv/bin/diagnosis-verify-bundle, and `.venv/bin/python -m audit.verify_bundle` outside this checkout
# (pyproject.toml, [project.scripts]; docs/audit-integrity.md, *Commands*). Re-done when pyproject changes.
project_stamp=".venv/.installed-project"
project_digest=$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$project_stamp" ] || [ "$(cat "$project_stamp")" != "$project_digest" ] || [ ! -x .venv/bin/diagnosis-verify-bundle ]; then
  echo "setup: installing this checkout's verifier command (pip install -e .)"
  .venv/bin/python -m pip install -q --no-deps -e .
  echo "$project_digest" > "$project_stamp"
fi

# Arize Phoenix, the trace store the telemetry tests export to (tests/telemetry/phoenix.py): too heavy for
# the app's venv (and never a runtime dependency), so it lives in a venv of its own. About 45 s once.
PHOENIX_VERSION=20.26.1
if [ "$want_dev" = "dev" ]; then
  phoenix_stamp=".venv-phoenix/.installed-arize-phoenix"
  if [ ! -f "$phoenix_stamp" ] || [ "$(cat "$phoenix_stamp")" != "$PHOENIX_VERSION" ]; then
    echo "setup: installing arize-phoenix $PHOENIX_VERSION into .venv-phoenix"
    [ -x .venv-phoenix/bin/python ] || "$PY" -m venv .venv-phoenix
    .venv-phoenix/bin/python -m pip install -q --upgrade pip
    .venv-phoenix/bin/python -m pip install -q "arize-phoenix==$PHOENIX_VERSION"
    echo "$PHOENIX_VERSION" > "$phoenix_stamp"
  fi
fi

# An off-the-shelf C2SP tlog-witness and tlog library nobody here wrote (aics-witness, aics-tlog from PyPI),
# which tests/audit/transparency/test_standard_witness.py runs with its default settings to show that
# our checkpoints are witness-ready (issue 50). Both require Python >= 3.12, so they live in a venv of
# their own, built with the first Python 3.12 or newer found (pyenv's on this machine kind).
AICS_WITNESS_VERSION=0.1.0
AICS_TLOG_VERSION=0.2.1
if [ "$want_dev" = "dev" ]; then
  witness_stamp=".venv-witness/.installed-aics-witness"
  witness_want="$AICS_WITNESS_VERSION $AICS_TLOG_VERSION"
  if [ ! -f "$witness_stamp" ] || [ "$(cat "$witness_stamp")" != "$witness_want" ]; then
    PY312=""
    for candidate in python3.13 python3.12 /root/.pyenv/versions/3.13*/bin/python3 \
                     /root/.pyenv/versions/3.12*/bin/python3; do
      if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
        PY312="$candidate"; break
      fi
    done
    if [ -z "$PY312" ]; then
      # The witness test then fails and says why (it is never skipped).
      echo "setup: no Python >= 3.12 found: .venv-witness (aics-witness) not built" >&2
    else
      echo "setup: installing aics-witness $AICS_WITNESS_VERSION into .venv-witness ($("$PY312" --version))"
      [ -x .venv-witness/bin/python ] || "$PY312" -m venv .venv-witness
      .venv-witness/bin/python -m pip install -q "aics-witness==$AICS_WITNESS_VERSION" \
        "aics-tlog==$AICS_TLOG_VERSION"
      echo "$witness_want" > "$witness_stamp"
    fi
  fi
fi

# MCP servers nobody here wrote, which the MCP tests start on 127.0.0.1 (docs/mcp.md): prometheus-mcp-server
# in a venv of its own (it pins its own fastmcp and mcp), and the reference servers of
# tools/mcp/package.json (server-everything, server-filesystem, the conformance suite) from npm, locked.
# The conformance suite stays at 0.1.13, the last release that runs on Debian's Node 20 (0.1.14 to 0.1.16
# import fs.globSync, Node >= 22).
PROMETHEUS_MCP_VERSION=1.6.2
if [ "$want_dev" = "dev" ]; then
  mcp_stamp=".venv-mcp/.installed-prometheus-mcp-server"
  if [ ! -f "$mcp_stamp" ] || [ "$(cat "$mcp_stamp")" != "$PROMETHEUS_MCP_VERSION" ]; then
    echo "setup: installing prometheus-mcp-server $PROMETHEUS_MCP_VERSION into .venv-mcp"
    [ -x .venv-mcp/bin/python ] || "$PY" -m venv .venv-mcp
    .venv-mcp/bin/python -m pip install -q "prometheus-mcp-server==$PROMETHEUS_MCP_VERSION"
    echo "$PROMETHEUS_MCP_VERSION" > "$mcp_stamp"
  fi
  command -v npm >/dev/null || apt_install nodejs npm
  npm_stamp="tools/mcp/node_modules/.installed-lock"
  lock_digest=$(sha256sum tools/mcp/package-lock.json | cut -c1-16)
  if [ ! -f "$npm_stamp" ] || [ "$(cat "$npm_stamp")" != "$lock_digest" ]; then
    echo "setup: installing the MCP test servers (tools/mcp, npm ci)"
    (cd tools/mcp && npm ci --no-audit --no-fund --loglevel=error)
    echo "$lock_digest" > "$npm_stamp"
  fi
fi
