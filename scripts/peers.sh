#!/usr/bin/env bash
# The peers of bench B0 (`make bench-peers`): MLflow, for its tracing on the same MariaDB, in a venv of its
# own (.venv-peers; never a dependency of the app). Phoenix comes from .venv-phoenix (scripts/setup.sh dev)
# and its OTLP exporter from the app's dev requirements.
set -euo pipefail
cd "$(dirname "$0")/.."
MLFLOW_VERSION="3.17.2"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
stamp=".venv-peers/.installed-mlflow"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$MLFLOW_VERSION" ]; then
  echo "peers: installing mlflow $MLFLOW_VERSION into .venv-peers"
  [ -x .venv-peers/bin/python ] || "$PY" -m venv .venv-peers
  .venv-peers/bin/python -m pip install -q --upgrade pip
  .venv-peers/bin/python -m pip install -q "mlflow==$MLFLOW_VERSION" "mysqlclient==2.3.2"
  echo "$MLFLOW_VERSION" > "$stamp"
fi
