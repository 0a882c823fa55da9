#!/usr/bin/env bash
# stop-local-pbs.sh - stops the one-node OpenPBS of start-local-pbs.sh: its daemons and its
# datastore (by their own init script, inside the namespace), then whatever else runs in the
# namespace (qsub's per-user daemons). The install, the namespace and the server's state stay,
# so the next start takes seconds. Touches no other PostgreSQL cluster.
set -euo pipefail
# shellcheck source=../lib/err.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/err.sh"
exec bash "$(dirname "$0")/one-node-openpbs.sh" stop
