#!/usr/bin/env bash
# stop-local-pg.sh - stops the cluster start-local-pg.sh started (its data directory stays, so
# the next start is quick; remove $EMBEDFLEET_PG_DIR for a fresh one).
set -euo pipefail
# shellcheck source=../lib/err.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/err.sh"
DIR=${EMBEDFLEET_PG_DIR:-/var/tmp/embedfleet-pg}
if [ -f "$DIR/data/postmaster.pid" ]; then
  runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D "$DIR/data" -m fast -w stop >/dev/null
fi
