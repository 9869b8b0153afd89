# The two commands of the README, and a few helpers.
.PHONY: run test lint bench bench-peers

run:  ## install what is missing, migrate, create demo data and serve on http://127.0.0.1:8000
	scripts/run.sh

test:  ## lint, then the whole suite on SQLite and on MariaDB
	scripts/test.sh

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

bench:  ## benchmarks on MariaDB (B1–B7, B11, B13 on the Galera cluster), prints the table and writes docs/performance.md
	scripts/setup.sh dev
	scripts/mariadb.sh
	.venv/bin/python -m bench $(BENCH_ARGS)

bench-peers:  ## B0: install MLflow into .venv-peers (Phoenix: .venv-phoenix), then run B0 against B1's floor
	scripts/setup.sh dev
	scripts/peers.sh
	scripts/mariadb.sh
	.venv/bin/python -m bench --only b0 --no-write $(BENCH_ARGS)
