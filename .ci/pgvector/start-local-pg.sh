#!/usr/bin/env bash
# start-local-pg.sh - a PostgreSQL 15 cluster of embedfleet's own, with pgvector, for the
# pgvector sink's tests (vectordb/tests/it/upload_pg.rs, tests/e2e/pgvector.rs) and
# benches/pgvector.sh. .ci/run calls it; safe to run by hand (as root).
#
#   - installs Debian's postgresql-15 and postgresql-server-dev-15 when missing;
#   - builds pgvector 0.8.6 from the tarball beside this file when the server has no
#     `vector` 0.8.6 (about a minute on 2 cores);
#   - `initdb` as the `postgres` user in $EMBEDFLEET_PG_DIR/data (outside the clone), listening on
#     127.0.0.1 only, port $EMBEDFLEET_PG_PORT; Debian's own cluster (5432) and OpenPBS's
#     datastore (15007) are never touched;
#   - a role `embedfleet` with a random password (scram-sha-256 over TCP), owner of the
#     database `embedfleet`, with the `vector` extension; the password goes only into the
#     pgpass file $EMBEDFLEET_PG_DIR/pgpass (mode 0600), never onto a command line;
#   - TLS with a CA of its own ($EMBEDFLEET_PG_DIR/ca.crt), plain connections allowed too.
#
# Prints the environment the tests read (EMBEDFLEET_PG_URL, PGPASSFILE, EMBEDFLEET_PG_CA). Idempotent: a cluster
# already running is kept. Stop it with stop-local-pg.sh (next to this file). Runs from / whatever
# the caller's working directory (initdb and pg_ctl, run as `postgres`, fail in one that is
# deleted or that `postgres` cannot read, such as /root).
set -euo pipefail
# shellcheck source=../lib/err.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/err.sh"

DIR=${EMBEDFLEET_PG_DIR:-/var/tmp/embedfleet-pg}
PORT=${EMBEDFLEET_PG_PORT:-55432}
PGVECTOR_VERSION=0.8.6
HERE=$(cd "$(dirname "$0")" && pwd)
cd /
PGBIN=/usr/lib/postgresql/15/bin
PG_CONFIG=$PGBIN/pg_config
export DEBIAN_FRONTEND=noninteractive

[ "$(id -u)" = 0 ] || { echo "start-local-pg.sh: run as root (it installs packages and runs initdb as postgres)" >&2; exit 1; }

if [ ! -x "$PGBIN/initdb" ] || [ ! -x "$PG_CONFIG" ]; then
  apt_log=/var/tmp/embedfleet-pg-apt.log
  apt-get -q -o DPkg::Lock::Timeout=600 install -y --no-install-recommends postgresql-15 postgresql-server-dev-15 >"$apt_log" 2>&1 </dev/null \
    || { apt-get -q -o DPkg::Lock::Timeout=600 update >>"$apt_log" 2>&1 </dev/null \
         && apt-get -q -o DPkg::Lock::Timeout=600 install -y --no-install-recommends postgresql-15 postgresql-server-dev-15 >>"$apt_log" 2>&1 </dev/null; } \
    || { echo "start-local-pg.sh: apt-get could not install postgresql-15 and postgresql-server-dev-15; the last lines of $apt_log:" >&2
         tail -n 20 "$apt_log" >&2; exit 1; }
fi

control="$($PG_CONFIG --sharedir)/extension/vector.control"
if ! grep -q "default_version = '$PGVECTOR_VERSION'" "$control" 2>/dev/null; then
  echo "building pgvector $PGVECTOR_VERSION (about a minute)"
  build=$(mktemp -d)
  tar xzf "$HERE/pgvector-$PGVECTOR_VERSION.tar.gz" -C "$build"
  nice -n 10 make -s -C "$build/pgvector-$PGVECTOR_VERSION" -j"$(nproc)" PG_CONFIG="$PG_CONFIG" >/dev/null
  make -s -C "$build/pgvector-$PGVECTOR_VERSION" install PG_CONFIG="$PG_CONFIG" >/dev/null
  rm -rf "$build"
fi

mkdir -p "$DIR"
chown postgres:postgres "$DIR"
chmod 0700 "$DIR"
as_pg() { runuser -u postgres -- "$@"; }

if [ ! -f "$DIR/data/PG_VERSION" ]; then
  as_pg "$PGBIN/initdb" -D "$DIR/data" -U postgres --auth-local=peer --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C >/dev/null
  cat >>"$DIR/data/postgresql.conf" <<CONF
# embedfleet's test cluster: loopback only, its own port and socket directory.
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR'
max_connections = 100
shared_buffers = 512MB
maintenance_work_mem = 256MB
max_parallel_maintenance_workers = 2
fsync = on
CONF
fi

# TLS: a CA of the cluster's own ($DIR/ca.crt, for the tests of sslmode verify-ca and
# verify-full) and a server certificate for 127.0.0.1 only (so that `localhost` fails
# verify-full's host check and passes verify-ca). Plain connections stay allowed.
if [ ! -s "$DIR/ca.crt" ] || [ ! -s "$DIR/data/server.crt" ]; then
  tmp=$(mktemp -d)
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=embedfleet test CA" \
    -keyout "$tmp/ca.key" -out "$tmp/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$tmp/server.key" -out "$tmp/server.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\n' >"$tmp/ext"
  openssl x509 -req -in "$tmp/server.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" -CAcreateserial \
    -days 3650 -extfile "$tmp/ext" -out "$tmp/server.crt" 2>/dev/null
  install -o postgres -g postgres -m 0600 "$tmp/server.key" "$DIR/data/server.key"
  install -o postgres -g postgres -m 0644 "$tmp/server.crt" "$DIR/data/server.crt"
  install -m 0644 "$tmp/ca.crt" "$DIR/ca.crt"
  rm -rf "$tmp"
fi
grep -q '^ssl = on' "$DIR/data/postgresql.conf" || echo "ssl = on" >>"$DIR/data/postgresql.conf"

if ! as_pg "$PGBIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
  as_pg "$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 start >/dev/null || {
    echo "start-local-pg.sh: pg_ctl could not start the cluster in $DIR/data on port $PORT; the last lines of $DIR/server.log:" >&2
    tail -n 15 "$DIR/server.log" >&2; exit 1; }
else
  as_pg "$PGBIN/pg_ctl" -D "$DIR/data" reload >/dev/null
fi

psql_pg() { as_pg "$PGBIN/psql" -h "$DIR" -p "$PORT" -U postgres -v ON_ERROR_STOP=1 -qAt "$@"; }

# The password: made once, kept only in the pgpass file (the tests' PGPASSFILE).
# Any host name: the TLS tests reach the server as `localhost` too.
if [ ! -s "$DIR/pgpass" ] || ! grep -q '^\*:' "$DIR/pgpass"; then
  password=$(head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 24)
  umask 077
  printf '*:%s:*:embedfleet:%s\n' "$PORT" "$password" >"$DIR/pgpass.new"
  mv "$DIR/pgpass.new" "$DIR/pgpass"
fi
chmod 0600 "$DIR/pgpass"
password=$(cut -d: -f5 "$DIR/pgpass")
# The statement goes on psql's stdin, not its command line (ps would show it).
if [ "$(psql_pg -d postgres -c "SELECT 1 FROM pg_roles WHERE rolname = 'embedfleet'")" != 1 ]; then
  printf "CREATE ROLE embedfleet LOGIN CREATEDB PASSWORD '%s';\n" "$password" | psql_pg -d postgres
else
  printf "ALTER ROLE embedfleet PASSWORD '%s';\n" "$password" | psql_pg -d postgres
fi
if [ "$(psql_pg -d postgres -c "SELECT 1 FROM pg_database WHERE datname = 'embedfleet'")" != 1 ]; then
  psql_pg -d postgres -c "CREATE DATABASE embedfleet OWNER embedfleet"
fi
psql_pg -d embedfleet -c "SET client_min_messages = warning; CREATE EXTENSION IF NOT EXISTS vector; ALTER EXTENSION vector UPDATE"
echo "postgresql $(psql_pg -d embedfleet -c 'SHOW server_version') with pgvector $(psql_pg -d embedfleet -c "SELECT extversion FROM pg_extension WHERE extname = 'vector'") on 127.0.0.1:$PORT ($DIR)"
echo "export EMBEDFLEET_PG_URL=postgresql://embedfleet@127.0.0.1:$PORT/embedfleet PGPASSFILE=$DIR/pgpass EMBEDFLEET_PG_CA=$DIR/ca.crt"
