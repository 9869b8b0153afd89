#!/usr/bin/env bash
# A MariaDB primary (127.0.0.1:3307, server-id 1, binary log) and a replica of it (127.0.0.1:3308,
# server-id 2, read_only, GTID replication), each with its own data directory under $REPLICA_PAIR_DIR
# (default /tmp/diagnosis-mariadb-pair), for the replica tests and the bench (docs/reliability.md,
# *Reads on a replica*). It never touches the shared server on 3306.
#
#   scripts/mariadb-replica.sh [start]      both servers up and replicating (idempotent)
#   scripts/mariadb-replica.sh stop-replica | start-replica | stop
#
# Accounts on both (replicated from the primary): root (no password, as on 3306), `repl` (replication),
# `reader` / password `reader` (SELECT only: what the application's replica alias should use).
set -euo pipefail

DIR="${REPLICA_PAIR_DIR:-/tmp/diagnosis-mariadb-pair}"
PRIMARY_PORT="${REPLICA_PRIMARY_PORT:-3307}"
REPLICA_PORT="${REPLICA_REPLICA_PORT:-3308}"

[ -x /usr/sbin/mariadbd ] || { echo "mariadb-replica: /usr/sbin/mariadbd is not installed" >&2; exit 2; }

sql() {  # sql PORT STATEMENTS...
  local port="$1"
  shift
  mariadb --protocol=tcp -h127.0.0.1 -P"$port" -uroot -N -B -e "$*"
}
answers() { mariadb-admin --protocol=tcp -h127.0.0.1 -P"$1" -uroot ping >/dev/null 2>&1; }

start_server() {  # start_server NAME PORT SERVER_ID EXTRA_OPTIONS...
  local name="$1" port="$2" id="$3"
  shift 3
  local data="$DIR/$name"
  answers "$port" && return 0
  mkdir -p "$DIR" && chown mysql:mysql "$DIR" && chmod 755 "$DIR"
  if ! [ -d "$data/mysql" ]; then
    mkdir -p "$data" && chown mysql:mysql "$data"
    mariadb-install-db --user=mysql --datadir="$data" --auth-root-authentication-method=normal \
      --skip-test-db >"$DIR/$name-install.log" 2>&1
  fi
  # Small buffers: two extra servers on a 2-core machine shared with the rest.
  /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$data" --port="$port" \
    --bind-address=127.0.0.1 --socket="$DIR/$name.sock" --pid-file="$DIR/$name.pid" \
    --log-error="$DIR/$name.err" --server-id="$id" --innodb-buffer-pool-size=64M \
    --innodb-log-file-size=48M --skip-name-resolve --character-set-server=utf8mb4 \
    --collation-server=utf8mb4_unicode_ci "$@" >/dev/null 2>&1 &
  for _ in $(seq 1 60); do
    answers "$port" && return 0
    sleep 0.5
  done
  echo "mariadb-replica: $name did not answer on 127.0.0.1:$port within 30 s (see $DIR/$name.err)" >&2
  exit 1
}

start_primary() {
  start_server primary "$PRIMARY_PORT" 1 --log-bin=mariadb-bin --binlog-format=ROW
  sql "$PRIMARY_PORT" "CREATE USER IF NOT EXISTS 'repl'@'127.0.0.1' IDENTIFIED BY 'repl';
    GRANT REPLICATION SLAVE ON *.* TO 'repl'@'127.0.0.1';
    CREATE USER IF NOT EXISTS 'reader'@'127.0.0.1' IDENTIFIED BY 'reader';
    GRANT SELECT ON *.* TO 'reader'@'127.0.0.1';"
}

start_replica() {
  start_server replica "$REPLICA_PORT" 2 --read-only=1 --relay-log=relay-bin --log-slave-updates=0
  local configured
  configured="$(sql "$REPLICA_PORT" "SELECT COUNT(*) FROM mysql.user WHERE user = 'repl'" 2>/dev/null || echo 0)"
  if [ "$(sql "$REPLICA_PORT" "SHOW SLAVE STATUS" | wc -l)" = 0 ] || [ "$configured" = 0 ]; then
    # A fresh replica of a fresh primary: replay the primary's whole binary log from the start.
    sql "$REPLICA_PORT" "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL gtid_slave_pos = '';
      CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=$PRIMARY_PORT, MASTER_USER='repl',
      MASTER_PASSWORD='repl', MASTER_CONNECT_RETRY=1, MASTER_USE_GTID=slave_pos;"
  fi
  sql "$REPLICA_PORT" "START SLAVE"
  # Caught up when the replica has applied the primary's current GTID position.
  local pos
  pos="$(sql "$PRIMARY_PORT" "SELECT @@gtid_binlog_pos")"
  for _ in $(seq 1 60); do
    [ "$(sql "$REPLICA_PORT" "SELECT MASTER_GTID_WAIT('$pos', 0.5)")" = 0 ] && return 0
  done
  echo "mariadb-replica: the replica did not catch up with $pos (SHOW SLAVE STATUS on :$REPLICA_PORT)" >&2
  exit 1
}

stop_server() {  # stop_server NAME PORT
  answers "$2" || return 0
  mariadb-admin --protocol=tcp -h127.0.0.1 -P"$2" -uroot shutdown
  for _ in $(seq 1 60); do
    answers "$2" || return 0
    sleep 0.5
  done
}

case "${1:-start}" in
  start) start_primary && start_replica ;;
  start-replica) start_replica ;;
  stop-replica) stop_server replica "$REPLICA_PORT" ;;
  stop) stop_server replica "$REPLICA_PORT" && stop_server primary "$PRIMARY_PORT" ;;
  *) echo "usage: $0 [start|start-replica|stop-replica|stop]" >&2; exit 2 ;;
esac
