#!/usr/bin/env bash
# A local Qdrant server for the server test suite and the server benchmarks, from a `qdrant`
# binary (no package registry ships one: `.ci/qdrant/unpack-qdrant.sh` gives the one CI keeps
# beside the clone, build-qdrant.sh builds one from source). `.ci/run` starts it so; by hand:
#
#   export QDRANT_BIN=$(bash .ci/qdrant/unpack-qdrant.sh)
#   QDRANT_CLUSTER=1 .ci/qdrant/qdrant-server.sh start
#   QDRANT_URL=http://127.0.0.1:6334 \
#   QDRANT_RESTART_CMD="QDRANT_CLUSTER=1 QDRANT_BIN=$QDRANT_BIN $PWD/.ci/qdrant/qdrant-server.sh kill-restart" \
#     cargo nextest run --workspace -E 'test(/server/)'
#   .ci/qdrant/qdrant-server.sh stop
#
# `restart` stops the server as an operator would (SIGTERM); `kill-restart` as a crash does
# (SIGKILL), then starts it again on the same storage.
#
# QDRANT_CLUSTER=1 starts it in cluster mode (one peer, p2p port QDRANT_P2P_PORT, 6335): what
# `upload --mode snapshot` needs (custom sharding, shard snapshot recovery), and what the
# snapshot tests of the server suite run against (QDRANT_REST_URL, default port 6333).
#
# State and log under QDRANT_HOME (default /tmp/embedfleet-qdrant); ports QDRANT_GRPC_PORT
# (6334) and QDRANT_HTTP_PORT (6333); QDRANT_CPUS (e.g. 0) pins the server to those CPUs, so
# that a benchmark's client can have the others, as it would on its own machine. `restart` keeps the storage: a restarted server has the
# points it acknowledged.
set -euo pipefail
# shellcheck source=../lib/err.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/err.sh"
home=${QDRANT_HOME:-/tmp/embedfleet-qdrant}
grpc=${QDRANT_GRPC_PORT:-6334}
http=${QDRANT_HTTP_PORT:-6333}
p2p=${QDRANT_P2P_PORT:-6335}
pidfile=$home/qdrant.pid

start() {
  local bin=${QDRANT_BIN:?set QDRANT_BIN to the qdrant binary}
  mkdir -p "$home/storage" "$home/snapshots"
  local cluster=()
  if [ "${QDRANT_CLUSTER:-0}" = 1 ]; then
    # The first (here: only) peer of the cluster names its own address.
    cluster=(--uri "http://127.0.0.1:$p2p")
  fi
  QDRANT__STORAGE__STORAGE_PATH=$home/storage \
  QDRANT__STORAGE__SNAPSHOTS_PATH=$home/snapshots \
  QDRANT__SERVICE__GRPC_PORT=$grpc \
  QDRANT__SERVICE__HTTP_PORT=$http \
  QDRANT__SERVICE__HOST=127.0.0.1 \
  QDRANT__TELEMETRY_DISABLED=true \
  QDRANT__CLUSTER__ENABLED=$([ "${QDRANT_CLUSTER:-0}" = 1 ] && echo true || echo false) \
  QDRANT__CLUSTER__P2P__PORT=$p2p \
  QDRANT__LOG_LEVEL=WARN \
    setsid ${QDRANT_CPUS:+taskset -c "$QDRANT_CPUS"} "$bin" "${cluster[@]}" >>"$home/qdrant.log" 2>&1 < /dev/null &
  echo $! > "$pidfile"
  # Ready when the HTTP port answers (the gRPC port opens at the same time).
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$http") 2>/dev/null; then
      echo "qdrant up: grpc http://127.0.0.1:$grpc (pid $(cat "$pidfile"), log $home/qdrant.log)"
      return 0
    fi
    sleep 0.1
  done
  echo "qdrant did not open port $http within 30 s; see $home/qdrant.log" >&2
  return 1
}

stop() {
  [ -f "$pidfile" ] || return 0
  local pid
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

# SIGKILL, as a crash or the OOM killer ends it: nothing flushed that was not already.
crash() {
  [ -f "$pidfile" ] || return 0
  local pid
  pid=$(cat "$pidfile")
  kill -9 "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$pidfile"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  restart) stop; start ;;
  kill-restart) crash; start ;;
  *) echo "usage: $0 start|stop|restart|kill-restart" >&2; exit 2 ;;
esac
