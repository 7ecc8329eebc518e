#!/usr/bin/env bash
# Make PostgreSQL, Redis and RabbitMQ answer on 127.0.0.1 for the test suite: use them if they
# answer, start them if installed, install them (Debian packages) if missing; install Chromium
# and its driver (Debian packages) for the browser tests, and PgBouncer for the tests that run
# through it, if missing. Fails loudly otherwise: the suite never skips a real-service test.
# (RabbitMQ serves one test: the demo's scenarios through a worker on an amqp:// broker;
# everything else uses Redis. PgBouncer is only installed: each test that needs one starts its
# own, on a free port, in front of its own database.)
set -euo pipefail

PG_HOST=127.0.0.1
PG_PORT=${AGENT_ROUTER_TEST_PG_PORT:-5432}
REDIS_PORT=${AGENT_ROUTER_TEST_REDIS_PORT:-6379}
AMQP_PORT=${AGENT_ROUTER_TEST_AMQP_PORT:-5672}

have() { command -v "$1" >/dev/null 2>&1; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif have sudo; then sudo "$@"; else "$@"; fi; }

pg_up() { have pg_isready && pg_isready -q -h "$PG_HOST" -p "$PG_PORT"; }
redis_up() {
  if have redis-cli; then
    [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]
  else
    # No client: speak RESP over bash's /dev/tcp.
    { exec 3<>"/dev/tcp/127.0.0.1/$REDIS_PORT"; } 2>/dev/null || return 1
    printf 'PING\r\n' >&3
    local reply; read -r -t 2 reply <&3 || true; exec 3>&-
    [ "${reply%$'\r'}" = "+PONG" ]
  fi
}

amqp_up() {
  # The AMQP 0-9-1 handshake: a broker answers the protocol header with its Connection.Start.
  # (In braces, the 2>/dev/null covers the connect only; on a bare exec it would stay.)
  { exec 4<>"/dev/tcp/127.0.0.1/$AMQP_PORT"; } 2>/dev/null || return 1
  printf 'AMQP\x00\x00\x09\x01' >&4
  local reply; reply=$(timeout 2 head -c 1 <&4 | od -An -tx1 | tr -d ' ') || true; exec 4>&-
  [ "$reply" = 01 ]  # frame type 1: a method frame
}

apt_install() {
  echo "services: installing $* from Debian packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq
  as_root apt-get install -y -qq "$@" >/dev/null
}

wait_for() {
  local what=$1 check=$2
  for _ in $(seq 1 60); do
    if "$check"; then return 0; fi
    sleep 0.5
  done
  echo "services: $what did not come up" >&2
  return 1
}

start_pg() {
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    apt_install postgresql postgresql-client
  fi
  local version
  version=$(ls /etc/postgresql | sort -V | tail -1)
  local conf=/etc/postgresql/$version/main
  # Trust local TCP connections, as the development machines do.
  if ! grep -q '^host all all 127.0.0.1/32 trust' "$conf/pg_hba.conf"; then
    as_root sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$conf/pg_hba.conf"
  fi
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  wait_for PostgreSQL pg_up
  # Roles and database the suite connects with.
  as_root su postgres -c "psql -qtAc \"SELECT 1 FROM pg_roles WHERE rolname='root'\"" | grep -q 1 \
    || as_root su postgres -c "psql -qc 'CREATE ROLE root SUPERUSER LOGIN'"
  as_root su postgres -c "psql -qtAc \"SELECT 1 FROM pg_database WHERE datname='test'\"" | grep -q 1 \
    || as_root su postgres -c "psql -qc 'CREATE DATABASE test OWNER root'"
}

start_redis() {
  if ! have redis-server; then
    apt_install redis-server
  fi
  as_root mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for Redis redis_up
}

start_rabbitmq() {
  if ! have rabbitmq-server; then
    apt_install rabbitmq-server
  fi
  # The Debian package may have started it already (where services start on install).
  amqp_up || as_root rabbitmq-server -detached
  wait_for RabbitMQ amqp_up
}

install_pgbouncer() {
  apt_install pgbouncer
  # The package starts a system-wide PgBouncer on port 6432 where services start on install
  # (systemd, or sysvinit without a policy-rc.d that forbids it). The tests start their own, so
  # stop that one and keep it from starting at boot.
  if [ -d /run/systemd/system ]; then
    as_root systemctl disable --now pgbouncer.service >/dev/null 2>&1 || true
  else
    as_root /etc/init.d/pgbouncer stop >/dev/null 2>&1 || true
    as_root update-rc.d pgbouncer disable >/dev/null 2>&1 || true
  fi
}

pg_up || start_pg
redis_up || start_redis
amqp_up || start_rabbitmq
# The browser tests drive a real headless Chromium through its WebDriver.
if ! have chromium || ! have chromedriver; then
  apt_install chromium chromium-driver
fi
# The PgBouncer tests run Debian's pgbouncer (in /usr/sbin, which a user's PATH may lack).
[ -x /usr/sbin/pgbouncer ] || have pgbouncer || install_pgbouncer
echo "services: PostgreSQL on $PG_HOST:$PG_PORT, Redis on 127.0.0.1:$REDIS_PORT and RabbitMQ on" \
  "127.0.0.1:$AMQP_PORT answer" >&2
