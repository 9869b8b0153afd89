#!/usr/bin/env bash
# Run the product on http://127.0.0.1:8000 with embedded SQLite, the offline demo model and demo data.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# DEBUG on, the TOTP step-up for reading reasoning on (REASONING_REQUIRE_OTP=false turns it off).
source scripts/run-env.sh
.venv/bin/python manage.py migrate --noinput
.venv/bin/python manage.py bootstrap_demo
exec .venv/bin/python manage.py runserver 127.0.0.1:8000
