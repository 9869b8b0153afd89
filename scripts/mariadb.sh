#!/usr/bin/env bash
# Make sure a MariaDB server answers on 127.0.0.1:3306 (root, no password), installing and starting it
# if needed. Debian's mariadbd refuses to run as root without --user=mysql.
set -euo pipefail

answers() { mariadb-admin --protocol=tcp -h127.0.0.1 -P3306 -uroot ping >/dev/null 2>&1; }

answers && exit 0
if ! [ -x /usr/sbin/mariadbd ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq mariadb-server >/dev/null
fi
command -v mariadb-admin >/dev/null || apt-get install -y -qq mariadb-client >/dev/null
mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
# --pidfile: a mariadbd of the replica tests' pair (scripts/mariadb-replica.sh) is not this server.
start-stop-daemon --start --oknodo --background --pidfile /run/mysqld/mysqld.pid \
  --exec /usr/sbin/mariadbd -- --user=mysql
for _ in $(seq 1 60); do
  answers && exit 0
  sleep 1
done
echo "mariadb: the server did not answer on 127.0.0.1:3306 within 60 s" >&2
exit 1
