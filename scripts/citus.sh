#!/usr/bin/env bash
# A Citus cluster on this machine, for development: Citus built from the source in vendor/ and
# installed into PostgreSQL 15, then a coordinator and two workers, each a data directory of its
# own under one private directory, on ports of their own.
#   scripts/citus.sh build    install the Debian build dependencies when missing, check the
#                             tarball's sha256, build Citus and install it into PostgreSQL 15
#                             (nothing to do when citus.so of this version is installed)
#   scripts/citus.sh start    build, then create the data directories when missing, start the
#                             three servers, and in each the database with the extension; make
#                             the coordinator know its own address and both workers (idempotent)
#   scripts/citus.sh stop     stop the three servers (the data directories stay)
#   scripts/citus.sh status   each server up or down, and the workers the coordinator uses
#   scripts/citus.sh url      the SQLAlchemy URL of the coordinator's database
# Environment: AGENT_ROUTER_CITUS_DIR (default /tmp/agent-router-citus) holds the data directories,
# their logs and the servers' sockets; AGENT_ROUTER_CITUS_PORT (default 9700) is the
# coordinator's port, the workers take the next two. The servers run as the `postgres` user
# (initdb refuses root), trust connections on 127.0.0.1 only, and keep the database `test`.
set -euo pipefail
cd "$(dirname "$0")/.."

CITUS_VERSION=13.0.5
CITUS_TARBALL=vendor/citus-$CITUS_VERSION.tar.gz
CITUS_SHA256=86b3d929f21ecae5bf07a44e09639f50a54eb5882ef17a3aafee39fed17b9a1a
PG_BIN=/usr/lib/postgresql/15/bin
PG_CONFIG=$PG_BIN/pg_config
BUILD_DEPS=(postgresql-server-dev-15 libcurl4-openssl-dev liblz4-dev libzstd-dev libkrb5-dev
  libssl-dev libxslt1-dev libpam0g-dev libreadline-dev libselinux1-dev build-essential)
CLUSTER_DIR=${AGENT_ROUTER_CITUS_DIR:-/tmp/agent-router-citus}
PORT=${AGENT_ROUTER_CITUS_PORT:-9700}
NODES=(coordinator worker1 worker2)
DB=test
SERVER_USER=postgres

have() { command -v "$1" >/dev/null 2>&1; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif have sudo; then sudo "$@"; else "$@"; fi; }
# Run a command as the servers' user, with the environment it needs spelled out.
as_server() {
  if [ "$(id -un)" = "$SERVER_USER" ]; then "$@"; else as_root su "$SERVER_USER" -s /bin/bash -c "$(printf '%q ' "$@")"; fi
}
node_port() { echo $((PORT + $1)); }
node_dir() { echo "$CLUSTER_DIR/${NODES[$1]}"; }
sql() {  # sql INDEX DATABASE STATEMENT: one statement on one node, unaligned output
  PGOPTIONS="-c client_min_messages=warning" "$PG_BIN/psql" -X -qtA -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$(node_port "$1")" \
    -U "$SERVER_USER" -d "$2" -c "$3"
}

installed() {
  # citus.so carries its release in its version string ("Citus 13.0.5 on ...").
  local so
  so="$("$PG_CONFIG" --pkglibdir 2>/dev/null)/citus.so" || return 1
  [ -f "$so" ] && grep -qaF "Citus $CITUS_VERSION " "$so"
}

build() {
  if [ -x "$PG_CONFIG" ] && installed; then
    echo "citus: Citus $CITUS_VERSION is installed in PostgreSQL 15" >&2
    return 0
  fi
  local missing=() pkg
  for pkg in "${BUILD_DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
      || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "citus: installing ${missing[*]} from Debian packages" >&2
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq
    as_root apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  echo "$CITUS_SHA256  $CITUS_TARBALL" | sha256sum --check --quiet - \
    || { echo "citus: $CITUS_TARBALL does not match its sha256" >&2; exit 1; }
  BUILD_DIR=$(mktemp -d)
  trap 'rm -rf "$BUILD_DIR"' EXIT
  tar xzf "$CITUS_TARBALL" -C "$BUILD_DIR"
  echo "citus: building Citus $CITUS_VERSION in $BUILD_DIR" >&2
  (
    cd "$BUILD_DIR/citus-$CITUS_VERSION"
    ./configure --quiet PG_CONFIG="$PG_CONFIG" >/dev/null
    make -s -j"$(nproc)" >/dev/null
    as_root make -s install >/dev/null
  )
  installed || { echo "citus: the build did not install citus.so $CITUS_VERSION" >&2; exit 1; }
  echo "citus: Citus $CITUS_VERSION installed in PostgreSQL 15" >&2
}

running() { as_server "$PG_BIN/pg_ctl" status -D "$(node_dir "$1")" >/dev/null 2>&1; }

init_node() {
  local i=$1 dir
  dir=$(node_dir "$i")
  [ -f "$dir/PG_VERSION" ] && return 0
  as_server "$PG_BIN/initdb" -D "$dir" -U "$SERVER_USER" --auth=trust --encoding=UTF8 \
    --no-locale >/dev/null
  cat >>"$dir/postgresql.conf" <<EOF
# scripts/citus.sh
port = $(node_port "$i")
listen_addresses = '127.0.0.1'
unix_socket_directories = '$CLUSTER_DIR/run'
shared_preload_libraries = 'citus'
max_connections = 200
fsync = off
EOF
  # Local sockets and 127.0.0.1 only (initdb also trusts ::1; listen_addresses leaves it unused).
}

start_node() {
  local i=$1
  running "$i" && return 0
  as_server "$PG_BIN/pg_ctl" start -w -t 120 -D "$(node_dir "$i")" \
    -l "$CLUSTER_DIR/${NODES[$i]}.log" >/dev/null
}

start() {
  build
  as_root mkdir -p "$CLUSTER_DIR/run"
  as_root chown "$SERVER_USER" "$CLUSTER_DIR" "$CLUSTER_DIR/run"
  local i
  for i in "${!NODES[@]}"; do init_node "$i"; done
  for i in "${!NODES[@]}"; do start_node "$i"; done
  for i in "${!NODES[@]}"; do
    [ "$(sql "$i" postgres "SELECT count(*) FROM pg_database WHERE datname = '$DB'")" = 1 ] \
      || sql "$i" postgres "CREATE DATABASE $DB"
    sql "$i" "$DB" "CREATE EXTENSION IF NOT EXISTS citus"
  done
  sql 0 "$DB" "SELECT citus_set_coordinator_host('127.0.0.1', $(node_port 0))" >/dev/null
  for i in 1 2; do
    [ "$(sql 0 "$DB" "SELECT count(*) FROM pg_dist_node
                      WHERE nodename = '127.0.0.1' AND nodeport = $(node_port "$i")")" = 1 ] \
      || sql 0 "$DB" "SELECT citus_add_node('127.0.0.1', $(node_port "$i"))" >/dev/null
  done
  echo "citus: coordinator on 127.0.0.1:$(node_port 0), workers on $(node_port 1) and" \
    "$(node_port 2); data in $CLUSTER_DIR" >&2
}

stop() {
  local i
  for i in "${!NODES[@]}"; do
    if [ -f "$(node_dir "$i")/PG_VERSION" ] && running "$i"; then
      as_server "$PG_BIN/pg_ctl" stop -w -m fast -D "$(node_dir "$i")" >/dev/null
    fi
  done
  echo "citus: stopped" >&2
}

status() {
  local i up=0
  for i in "${!NODES[@]}"; do
    if [ -f "$(node_dir "$i")/PG_VERSION" ] && running "$i"; then
      echo "${NODES[$i]}: up on 127.0.0.1:$(node_port "$i")"
      up=$((up + 1))
    else
      echo "${NODES[$i]}: down"
    fi
  done
  if running 0; then
    echo "workers the coordinator uses:"
    sql 0 "$DB" "SELECT node_name || ':' || node_port FROM citus_get_active_worker_nodes()
                 ORDER BY node_port" | sed 's/^/  /'
  fi
  [ "$up" = "${#NODES[@]}" ]
}

url() { echo "postgresql+psycopg://$SERVER_USER@127.0.0.1:$(node_port 0)/$DB"; }

case "${1:-}" in
  build) build ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  url) url ;;
  *)
    echo "usage: scripts/citus.sh build|start|stop|status|url" >&2
    exit 2
    ;;
esac
