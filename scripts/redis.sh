#!/usr/bin/env bash
# Make sure a Redis server answers on 127.0.0.1:6379 (installing and starting it if needed). Used by the
# multi-process chat tests; it keeps nothing on disk.
set -euo pipefail
answers() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
answers && exit 0
if ! command -v redis-server >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
fi
mkdir -p /var/lib/redis /var/log/redis
redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
  --dir /var/lib/redis --logfile /var/log/redis/ci.log
for _ in $(seq 1 30); do
  answers && exit 0
  sleep 1
done
echo "redis: the server did not answer on 127.0.0.1:6379 within 30 s" >&2
exit 1
