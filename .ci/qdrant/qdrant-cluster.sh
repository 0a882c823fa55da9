#!/usr/bin/env bash
# A real N-peer Qdrant cluster on loopback (default 3 peers), each peer its own process with its
# own ports, storage and log, for the tests that need replication, peer failure and shard
# placement (`upload --mode snapshot` with custom sharding across peers). Same `qdrant` binary as
# qdrant-server.sh (`.ci/qdrant/unpack-qdrant.sh`, or build it with build-qdrant.sh); `.ci/run`
# starts it so:
#
#   eval "$(QDRANT_BIN=/path/to/qdrant .ci/qdrant/qdrant-cluster.sh start)"   # exports the env below
#   QDRANT_PEER_KILL_CMD="QDRANT_BIN=$QDRANT_BIN $PWD/.ci/qdrant/qdrant-cluster.sh kill-peer" \
#   QDRANT_PEER_START_CMD="QDRANT_BIN=$QDRANT_BIN $PWD/.ci/qdrant/qdrant-cluster.sh start-peer" \
#     cargo nextest run --workspace -E 'test(/cluster_/)'
#   .ci/qdrant/qdrant-cluster.sh stop
#
# Subcommands:
#   start         peer 1 bootstraps the cluster (--uri), peers 2..N join it (--bootstrap peer 1);
#                 returns once /cluster on peer 1 lists all N peers, and prints on stdout the
#                 lines a test needs (progress goes to stderr):
#                   export QDRANT_URL=http://127.0.0.1:6434        (gRPC of peer 1)
#                   export QDRANT_REST_URL=http://127.0.0.1:6433   (REST of peer 1)
#                   export QDRANT_PEER_REST_URLS=http://127.0.0.1:6433,http://127.0.0.1:6443,...
#                   export QDRANT_PEER_GRPC_URLS=http://127.0.0.1:6434,http://127.0.0.1:6444,...
#                   export QDRANT_PEER_IDS=<raft peer id of peer 1>,<of peer 2>,...  (the ids that
#                     a shard key's `placement` takes; same order as the URLs)
#   stop          stops all peers (SIGTERM, then SIGKILL after 10 s); storage stays (rm -r QDRANT_HOME
#                 for a fresh cluster: a restarted cluster keeps its peer ids and collections)
#   kill-peer I   SIGKILL peer I (1-based), keeping its storage: a crashed peer
#   start-peer I  restarts peer I on its storage; it rejoins the cluster (its raft state is on disk)
#   status        each peer: pid or down, its URLs, and the peer count in /cluster of peer 1
#
# Peer i uses ports base + 10*(i-1): REST QDRANT_BASE_PORT (6433), gRPC base+1 (6434), p2p base+2
# (6435), so peer 2 is 6443/6444/6445. These do not collide with qdrant-server.sh's 6333-6335.
# State under QDRANT_HOME (default /tmp/embedfleet-qdrant-cluster): peerI/{storage,snapshots},
# peerI/qdrant.log, peerI/qdrant.pid. QDRANT_PEERS (3) peers.
#
# Each peer is kept small on CPU: one search thread, one API worker, an optimizer CPU budget of 1
# (one optimization job at a time per peer). These only bound concurrency; no indexing setting
# (segment number, HNSW parameters, indexing threshold) is changed from Qdrant's defaults, and
# none of them is written into a collection's config. Any QDRANT__... variable set in the caller's
# environment wins over these.
set -euo pipefail
# shellcheck source=../lib/err.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/err.sh"
home=${QDRANT_HOME:-/tmp/embedfleet-qdrant-cluster}
peers=${QDRANT_PEERS:-3}
base=${QDRANT_BASE_PORT:-6433}

http_port() { echo $((base + 10 * ($1 - 1))); }
grpc_port() { echo $((base + 10 * ($1 - 1) + 1)); }
p2p_port() { echo $((base + 10 * ($1 - 1) + 2)); }
peer_dir() { echo "$home/peer$1"; }

check_peer() {
  case "${1:-}" in
    '' | *[!0-9]*) echo "peer must be a number 1..$peers" >&2; exit 2 ;;
  esac
  if [ "$1" -lt 1 ] || [ "$1" -gt "$peers" ]; then
    echo "peer must be a number 1..$peers" >&2
    exit 2
  fi
}

peer_pid() {
  local pidfile
  pidfile=$(peer_dir "$1")/qdrant.pid
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && cat "$pidfile"
}

# Starts peer $1 and waits until its REST port answers.
start_peer() {
  local i=$1 bin=${QDRANT_BIN:?set QDRANT_BIN to the qdrant binary}
  local dir http grpc p2p pid
  dir=$(peer_dir "$i")
  http=$(http_port "$i")
  grpc=$(grpc_port "$i")
  p2p=$(p2p_port "$i")
  if pid=$(peer_pid "$i"); then
    echo "peer $i already running (pid $pid)" >&2
    return 0
  fi
  mkdir -p "$dir/storage" "$dir/snapshots"
  # Every peer names its own address; peers 2..N join through peer 1. On a restart the raft state
  # in storage wins and --bootstrap is ignored.
  local args=(--uri "http://127.0.0.1:$p2p")
  if [ "$i" -gt 1 ]; then
    args+=(--bootstrap "http://127.0.0.1:$(p2p_port 1)")
  fi
  echo "=== $(date -u +%FT%TZ) start peer $i" >>"$dir/qdrant.log"
  QDRANT__STORAGE__STORAGE_PATH=$dir/storage \
  QDRANT__STORAGE__SNAPSHOTS_PATH=$dir/snapshots \
  QDRANT__STORAGE__PERFORMANCE__MAX_SEARCH_THREADS=${QDRANT__STORAGE__PERFORMANCE__MAX_SEARCH_THREADS:-1} \
  QDRANT__STORAGE__PERFORMANCE__OPTIMIZER_CPU_BUDGET=${QDRANT__STORAGE__PERFORMANCE__OPTIMIZER_CPU_BUDGET:-1} \
  QDRANT__SERVICE__MAX_WORKERS=${QDRANT__SERVICE__MAX_WORKERS:-1} \
  QDRANT__SERVICE__GRPC_PORT=$grpc \
  QDRANT__SERVICE__HTTP_PORT=$http \
  QDRANT__SERVICE__HOST=127.0.0.1 \
  QDRANT__TELEMETRY_DISABLED=true \
  QDRANT__CLUSTER__ENABLED=true \
  QDRANT__CLUSTER__P2P__PORT=$p2p \
  QDRANT__LOG_LEVEL=${QDRANT__LOG_LEVEL:-WARN} \
    setsid "$bin" "${args[@]}" >>"$dir/qdrant.log" 2>&1 </dev/null &
  echo $! >"$dir/qdrant.pid"
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$http") 2>/dev/null; then
      echo "peer $i up: rest http://127.0.0.1:$http grpc http://127.0.0.1:$grpc p2p $p2p (pid $(cat "$dir/qdrant.pid"), log $dir/qdrant.log)" >&2
      return 0
    fi
    kill -0 "$(cat "$dir/qdrant.pid")" 2>/dev/null || break
    sleep 0.1
  done
  echo "peer $i did not open port $http within 30 s (or exited); see $dir/qdrant.log" >&2
  tail -n 20 "$dir/qdrant.log" >&2 || true
  return 1
}

# Number of peers that /cluster of peer 1 lists (0 if it does not answer).
cluster_peer_count() {
  curl -fsS --max-time 2 "http://127.0.0.1:$(http_port 1)/cluster" 2>/dev/null |
    grep -o '"uri":' | wc -l || true
}

# Raft peer id of peer $1, from its own /cluster (empty if it does not answer).
peer_id() {
  curl -fsS --max-time 2 "http://127.0.0.1:$(http_port "$1")/cluster" 2>/dev/null |
    grep -o '"peer_id":[0-9]*' | head -n 1 | cut -d: -f2 || true
}

# Waits until /cluster on peer 1 lists at least $1 peers (60 s at most).
wait_for_peers() {
  local n=0
  for _ in $(seq 1 600); do
    n=$(cluster_peer_count)
    [ "$n" -ge "$1" ] && return 0
    sleep 0.1
  done
  echo "/cluster on peer 1 lists $n of $1 peers after 60 s; see $home/peer*/qdrant.log" >&2
  return 1
}

start() {
  local i
  start_peer 1
  wait_for_peers 1
  # One join at a time: raft changes its membership one peer at a time.
  for i in $(seq 2 "$peers"); do
    start_peer "$i"
    wait_for_peers "$i"
  done
  echo "cluster up: $peers peers" >&2
  local rest=() grpc=() ids=()
  for i in $(seq 1 "$peers"); do
    rest+=("http://127.0.0.1:$(http_port "$i")")
    grpc+=("http://127.0.0.1:$(grpc_port "$i")")
    ids+=("$(peer_id "$i")")
  done
  echo "export QDRANT_URL=${grpc[0]}"
  echo "export QDRANT_REST_URL=${rest[0]}"
  echo "export QDRANT_PEER_REST_URLS=$(IFS=,; echo "${rest[*]}")"
  echo "export QDRANT_PEER_GRPC_URLS=$(IFS=,; echo "${grpc[*]}")"
  echo "export QDRANT_PEER_IDS=$(IFS=,; echo "${ids[*]}")"
}

stop_peer() {
  local i=$1 pidfile pid
  pidfile=$(peer_dir "$i")/qdrant.pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

stop() {
  local i
  # Joined peers first, the bootstrap peer last.
  for i in $(seq "$peers" -1 1); do stop_peer "$i"; done
}

kill_peer() {
  local i=$1 pidfile pid
  pidfile=$(peer_dir "$i")/qdrant.pid
  if ! pid=$(peer_pid "$i"); then
    echo "peer $i is not running" >&2
    rm -f "$pidfile"
    return 0
  fi
  kill -9 "$pid"
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$pidfile"
  echo "peer $i killed (pid $pid); storage kept in $(peer_dir "$i")" >&2
}

status() {
  local i pid state
  for i in $(seq 1 "$peers"); do
    if pid=$(peer_pid "$i"); then state="pid $pid"; else state=down; fi
    [ "$state" = down ] || state="$state id $(peer_id "$i")"
    echo "peer $i: $state rest http://127.0.0.1:$(http_port "$i") grpc http://127.0.0.1:$(grpc_port "$i") p2p $(p2p_port "$i")"
  done
  echo "/cluster on peer 1 lists $(cluster_peer_count) peers"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  kill-peer) check_peer "${2:-}"; kill_peer "$2" ;;
  start-peer) check_peer "${2:-}"; start_peer "$2" ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status|kill-peer I|start-peer I" >&2; exit 2 ;;
esac
