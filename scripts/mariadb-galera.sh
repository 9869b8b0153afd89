#!/usr/bin/env bash
# A three-node MariaDB Galera cluster on loopback behind HAProxy, for the Galera failover test and the
# B13 bench (docs/reliability.md, *A Galera cluster behind HAProxy*). It never touches the shared server
# on 3306.
#
#   node 1..3   mariadbd on 127.0.0.1:3311/3312/3313, Galera (Debian's galera-4) group ports 4567/4577/4587
#               (IST 4568/4578/4588, rsync SST 4444/4454/4464), data under $GALERA_DIR/nodeN
#   check 1..3  a clustercheck on 127.0.0.1:9201/9202/9203: HTTP 200 while the node is Synced
#               (wsrep_local_state 4) and accepts queries, 503 otherwise (socat runs this script's
#               `clustercheck N` once per request; the documented Galera + HAProxy health check)
#   haproxy     127.0.0.1:3310: one writer at a time: node 1 while it is Synced, else the first of the
#               `backup` nodes that is; when node 1 is up again the backups' sessions are closed
#               (`on-marked-up shutdown-backup-sessions`), so two nodes never take writes for long
#
#   scripts/mariadb-galera.sh [start]        the three nodes Synced, the checks and the proxy up (idempotent)
#   scripts/mariadb-galera.sh kill-node N    SIGKILL node N's mariadbd (what the failover test does)
#   scripts/mariadb-galera.sh start-node N   node N started again: its position recovered, it rejoins by IST;
#                                            returns once it is Synced and up behind the proxy
#   scripts/mariadb-galera.sh status         each node's state and which one the proxy writes to
#   scripts/mariadb-galera.sh stop           everything stopped (the data directories kept)
#   scripts/mariadb-galera.sh start-single | stop-single   B13's baseline: one server with the nodes'
#                                            options and no Galera on 127.0.0.1:3314
#
# Account: root without a password on 127.0.0.1, as on 3306 (a local test cluster's, not a secret).
set -euo pipefail

DIR="${GALERA_DIR:-/tmp/diagnosis-galera}"
PROXY_PORT="${GALERA_PROXY_PORT:-3310}"
NODES=(1 2 3)
node_port() { echo $((3310 + $1)); }
group_port() { echo $((4557 + 10 * $1)); }
sst_port() { echo $((4434 + 10 * $1)); }
check_port() { echo $((9200 + $1)); }
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"

[ -x /usr/sbin/mariadbd ] || { echo "mariadb-galera: /usr/sbin/mariadbd is not installed" >&2; exit 2; }
[ -e /usr/lib/galera/libgalera_smm.so ] || { echo "mariadb-galera: galera-4 is not installed" >&2; exit 2; }

sql() {  # sql PORT STATEMENTS...
  local port="$1"
  shift
  mariadb --protocol=tcp -h127.0.0.1 -P"$port" -uroot -N -B --connect-timeout=2 -e "$*"
}
state() {  # the node's wsrep_local_state (4 = Synced), or nothing when it does not answer
  sql "$(node_port "$1")" "SHOW GLOBAL STATUS LIKE 'wsrep_local_state'" 2>/dev/null | cut -f2
}
synced() { [ "$(state "$1")" = 4 ]; }
pid_of() { cat "$DIR/node$1.pid" 2>/dev/null || true; }
alive() { local pid; pid="$(pid_of "$1")"; [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }

cluster_address() {
  local addrs=() n
  for n in "${NODES[@]}"; do addrs+=("127.0.0.1:$(group_port "$n")"); done
  (IFS=,; echo "gcomm://${addrs[*]}")
}

common_options() {  # common_options NAME PORT SERVER_ID: what a node and the single server share
  printf '%s\n' --no-defaults --user=mysql --datadir="$DIR/$1" --port="$2" \
    --bind-address=127.0.0.1 --socket="$DIR/$1.sock" --pid-file="$DIR/$1.pid" \
    --log-error="$DIR/$1.err" --server-id="$3" --innodb-buffer-pool-size=64M \
    --innodb-log-file-size=48M --skip-name-resolve --character-set-server=utf8mb4 \
    --collation-server=utf8mb4_unicode_ci --binlog-format=ROW --default-storage-engine=InnoDB \
    --innodb-autoinc-lock-mode=2 --innodb-flush-log-at-trx-commit=1
}

start_single() {  # B13's baseline: one server with the nodes' options but no Galera, on 127.0.0.1:3314
  local data="$DIR/single" port=3314
  mariadb-admin --protocol=tcp -h127.0.0.1 -P"$port" -uroot ping >/dev/null 2>&1 && return 0
  mkdir -p "$DIR" && chown mysql:mysql "$DIR" && chmod 755 "$DIR"
  if ! [ -d "$data/mysql" ]; then
    mkdir -p "$data" && chown mysql:mysql "$data"
    mariadb-install-db --user=mysql --datadir="$data" --auth-root-authentication-method=normal \
      --skip-test-db >"$DIR/single-install.log" 2>&1
  fi
  local options
  mapfile -t options < <(common_options single "$port" 9)
  /usr/sbin/mariadbd "${options[@]}" >/dev/null 2>&1 &
  for _ in $(seq 1 120); do
    mariadb-admin --protocol=tcp -h127.0.0.1 -P"$port" -uroot ping >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  echo "mariadb-galera: the single server did not answer on 127.0.0.1:$port (see $DIR/single.err)" >&2
  exit 1
}

server_options() {  # server_options N: the options every start of node N takes
  local n="$1" gp
  gp="$(group_port "$n")"
  # Small buffers (three servers on a 2-core machine shared with the rest). Failure detection in a few
  # seconds instead of Galera's defaults (suspect 5 s, inactive 15 s): on loopback a silent peer is dead.
  local provider="base_port=$gp;ist.recv_addr=127.0.0.1:$((gp + 1));gcache.size=64M"
  provider+=";evs.keepalive_period=PT0.5S;evs.inactive_check_period=PT0.5S;evs.suspect_timeout=PT2S"
  provider+=";evs.inactive_timeout=PT4S;evs.install_timeout=PT4S;gmcast.listen_addr=tcp://127.0.0.1:$gp"
  common_options "node$n" "$(node_port "$n")" "$n"
  printf '%s\n' --wsrep-on=ON --wsrep-provider=/usr/lib/galera/libgalera_smm.so \
    --wsrep-cluster-name=diagnosis-galera --wsrep-cluster-address="$(cluster_address)" \
    --wsrep-node-name="node$n" --wsrep-node-address="127.0.0.1:$gp" \
    --wsrep-sst-method=rsync --wsrep-sst-receive-address="127.0.0.1:$(sst_port "$n")" \
    --wsrep-slave-threads=1 --wsrep-provider-options="$provider"
}

recovered_position() {  # the last committed position of a node that did not stop cleanly (uuid:seqno)
  local n="$1" log="$DIR/node$n-recover.log"
  local options
  mapfile -t options < <(server_options "$n")
  /usr/sbin/mariadbd "${options[@]}" --log-error="$log" --wsrep-recover >/dev/null 2>&1 || true
  sed -n 's/.*WSREP: Recovered position: *\([0-9a-f-]*:-\{0,1\}[0-9]*\).*/\1/p' "$log" | tail -1
}

start_node() {  # start_node N [bootstrap]
  local n="$1" how="${2:-join}" data="$DIR/node$1"
  synced "$n" && return 0
  alive "$n" || {
    mkdir -p "$data" && chown mysql:mysql "$DIR" "$data" && chmod 755 "$DIR"
    local extra=()
    if [ "$how" = bootstrap ]; then
      if ! [ -d "$data/mysql" ]; then
        mariadb-install-db --user=mysql --datadir="$data" --auth-root-authentication-method=normal \
          --skip-test-db >"$DIR/node$n-install.log" 2>&1
      fi
      # This node starts the cluster (no other node runs): it may, whatever it recorded last.
      [ -f "$data/grastate.dat" ] && sed -i 's/^safe_to_bootstrap:.*/safe_to_bootstrap: 1/' "$data/grastate.dat"
      extra+=(--wsrep-new-cluster)
    fi
    if [ -f "$data/grastate.dat" ] && grep -q '^seqno: *-1' "$data/grastate.dat"; then
      # Killed (or never stopped cleanly): recover its position from InnoDB, so it rejoins by IST (only
      # the write-sets it missed, from a donor's gcache) instead of copying the whole data directory.
      local position
      position="$(recovered_position "$n")"
      [ -n "$position" ] && extra+=(--wsrep-start-position="$position")
    fi
    local options
    mapfile -t options < <(server_options "$n")
    /usr/sbin/mariadbd "${options[@]}" "${extra[@]}" >/dev/null 2>&1 &
  }
  for _ in $(seq 1 240); do
    synced "$n" && break
    sleep 0.25
  done
  synced "$n" || { echo "mariadb-galera: node $n was not Synced within 60 s (see $DIR/node$n.err)" >&2; exit 1; }
  # ... and back in the proxy's rotation (its check passed `rise` times).
  for _ in $(seq 1 60); do
    proxy_up "$n" && return 0
    sleep 0.25
  done
  echo "mariadb-galera: the proxy did not mark node $n up within 15 s" >&2
  exit 1
}

kill_node() {
  local n="$1" pid
  pid="$(pid_of "$n")"
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do
    alive "$n" || return 0
    sleep 0.05
  done
}

stop_node() {
  local n="$1" pid
  alive "$n" || return 0
  pid="$(pid_of "$n")"
  kill -TERM "$pid"
  for _ in $(seq 1 120); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.25
  done
  kill -9 "$pid" 2>/dev/null || true
}

clustercheck() {  # one HTTP answer on stdin/stdout for node N (run by socat per connection)
  local n="$1" body code
  # The request line and headers are read, not used: any request asks the same question.
  read -r -t 1 _ || true
  # One client call: Synced (wsrep_local_state 4) and accepting queries (wsrep_ready ON).
  local answer
  answer="$(sql "$(node_port "$n")" "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_local_state', 'wsrep_ready')" \
    2>/dev/null | sort | cut -f2 | tr '\n' ' ')"
  if [ "$answer" = "4 ON " ]; then
    code="200 OK" body="Galera node $n is Synced."
  else
    code="503 Service Unavailable" body="Galera node $n is not Synced."
  fi
  printf 'HTTP/1.1 %s\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s\r\n' \
    "$code" $((${#body} + 2)) "$body"
}

start_checks() {
  local n pidfile
  for n in "${NODES[@]}"; do
    pidfile="$DIR/check$n.pid"
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then continue; fi
    socat "TCP-LISTEN:$(check_port "$n"),bind=127.0.0.1,reuseaddr,fork" \
      "EXEC:$SELF clustercheck $n" >/dev/null 2>&1 &
    echo $! >"$pidfile"
  done
}

haproxy_config() {
  local n
  cat <<EOF
# Written by scripts/mariadb-galera.sh: one writer at a time in front of the three Galera nodes.
global
    maxconn 2000
    stats socket $DIR/haproxy.sock mode 600 level admin
defaults
    mode tcp
    timeout connect 2s
    # Pooled connections idle for long (the runtime's pool pings them before use).
    timeout client 1h
    timeout server 1h
    # A connection refused by a node that just died is tried on the next one at once.
    retries 3
    option redispatch 1
frontend galera
    bind 127.0.0.1:$PROXY_PORT
    default_backend galera
backend galera
    # Health: the node's clustercheck (HTTP 200 only while Synced); a refused connection to the node
    # marks it down at once (observe layer4), and its open sessions are closed when it goes down.
    option httpchk GET /
    http-check expect status 200
    default-server inter 2s fastinter 250ms downinter 1s fall 2 rise 2 on-marked-down shutdown-sessions observe layer4 error-limit 1 on-error mark-down
    # Single writer: node 1 while it is up, else the first backup that is (no allbackups). When node 1
    # is up again the backups' sessions are closed, so the writes come back to one node at once.
EOF
  for n in "${NODES[@]}"; do
    local role=" on-marked-up shutdown-backup-sessions"
    [ "$n" = 1 ] || role=" backup"
    echo "    server node$n 127.0.0.1:$(node_port "$n") check port $(check_port "$n")$role"
  done
}

proxy_up() {  # whether HAProxy's check has marked node N up (its stats socket; true without a proxy)
  [ -S "$DIR/haproxy.sock" ] && [ -f "$DIR/haproxy.pid" ] && kill -0 "$(cat "$DIR/haproxy.pid")" 2>/dev/null ||
    return 0
  echo "show servers state galera" | socat - "UNIX-CONNECT:$DIR/haproxy.sock" 2>/dev/null |
    awk -v name="node$1" '$4 == name && $6 == 2 { found = 1 } END { exit !found }'
}

start_proxy() {
  command -v haproxy >/dev/null || { echo "mariadb-galera: haproxy is not installed (scripts/setup.sh dev)" >&2; exit 2; }
  haproxy_config >"$DIR/haproxy.cfg.new"
  if [ -f "$DIR/haproxy.pid" ] && kill -0 "$(cat "$DIR/haproxy.pid")" 2>/dev/null; then
    if cmp -s "$DIR/haproxy.cfg.new" "$DIR/haproxy.cfg"; then rm -f "$DIR/haproxy.cfg.new"; return 0; fi
    kill "$(cat "$DIR/haproxy.pid")" 2>/dev/null || true
    sleep 0.2
  fi
  mv "$DIR/haproxy.cfg.new" "$DIR/haproxy.cfg"
  haproxy -q -D -f "$DIR/haproxy.cfg" -p "$DIR/haproxy.pid"
}

proxied() {  # the node the proxy sends a new connection to (its @@port), once one is Synced behind it
  for _ in $(seq 1 80); do
    local port
    port="$(sql "$PROXY_PORT" "SELECT @@port" 2>/dev/null || true)"
    [ -n "$port" ] && { echo "$port"; return 0; }
    sleep 0.25
  done
  echo "mariadb-galera: the proxy on 127.0.0.1:$PROXY_PORT reaches no node within 20 s" >&2
  return 1
}

start_all() {
  mkdir -p "$DIR"
  local n running=""
  for n in "${NODES[@]}"; do alive "$n" && running="$n"; done
  if [ -z "$running" ]; then
    start_node 1 bootstrap
    running=1
  fi
  for n in "${NODES[@]}"; do [ "$n" = "$running" ] || start_node "$n"; done
  start_node "$running"
  start_checks
  start_proxy
  for n in "${NODES[@]}"; do start_node "$n"; done  # each Synced and up behind the proxy
  proxied >/dev/null
}

status() {
  local n
  for n in "${NODES[@]}"; do
    printf 'node%s 127.0.0.1:%s state=%s\n' "$n" "$(node_port "$n")" "$(state "$n" || true)"
  done
  printf 'proxy 127.0.0.1:%s -> %s\n' "$PROXY_PORT" "$(sql "$PROXY_PORT" "SELECT @@port" 2>/dev/null || echo none)"
}

stop_all() {
  local n f
  for f in "$DIR/haproxy.pid" "$DIR"/check*.pid; do
    [ -f "$f" ] && { kill "$(cat "$f")" 2>/dev/null || true; rm -f "$f"; }
  done
  # The last node to stop is the one safe to bootstrap from (Galera records it in its grastate.dat).
  for n in 3 2 1; do stop_node "$n"; done
}

case "${1:-start}" in
  start) start_all ;;
  stop) stop_all ;;
  kill-node) kill_node "${2:?node number}" ;;
  start-node) start_node "${2:?node number}" ;;
  status) status ;;
  start-single) start_single ;;
  stop-single) [ -f "$DIR/single.pid" ] && kill "$(cat "$DIR/single.pid")" 2>/dev/null || true ;;
  clustercheck) clustercheck "${2:?node number}" ;;
  *) echo "usage: $0 [start|stop|kill-node N|start-node N|status]" >&2; exit 2 ;;
esac
