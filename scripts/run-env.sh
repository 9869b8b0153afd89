# The environment `make run` serves with, sourced by scripts/run.sh (and read through bash by
# tests/config/test_make_run.py, so what the README says of `make run` is what it does).
# Development: embedded SQLite, the offline demo model, demo accounts.
export DEBUG="${DEBUG:-true}"
# The product as it is deployed: reading reasoning needs the TOTP step-up (docs/security.md, section 3);
# `manage.py bootstrap_demo` prints the demo auditor's TOTP key once. `REASONING_REQUIRE_OTP=false make run`
# turns it off explicitly for development.
export REASONING_REQUIRE_OTP="${REASONING_REQUIRE_OTP:-true}"
