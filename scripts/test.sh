#!/usr/bin/env bash
# The whole test suite: lint, then pytest on embedded SQLite, then pytest on MariaDB.
# Extra arguments go to pytest (e.g. scripts/test.sh -k recorder).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
scripts/mariadb.sh
scripts/redis.sh

export DEBUG=true
# setup.sh dev installed Prometheus and Alertmanager: their tests must run here, never be skipped.
export AIOPS_REQUIRE_SERVERS=1
# ... and nginx: the deployment test (tests/config/) must run on MariaDB, never be skipped.
export DEPLOY_REQUIRE_NGINX=1
unset DATABASE_URL REDIS_URL LLM_API_KEY LLM_PROVIDER || true

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .

echo "== pytest on SQLite"
.venv/bin/python -m pytest "$@"

echo "== pytest on MariaDB"
DATABASE_URL="mysql://root@127.0.0.1:3306/diagnosis" .venv/bin/python -m pytest "$@"
