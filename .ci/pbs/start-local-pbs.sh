#!/usr/bin/env bash
# start-local-pbs.sh - a real one-node OpenPBS 23.06.06 for embedfleet's PBS tests (.ci/run
# calls this script): /opt/pbs restored from its cache tarball outside the clone, or built from
# the source beside this script (about 3.5 min on 2 cores) and cached; then configured, started
# in the network namespace `embedfleet-pbs` (server `pbshost`) and checked with a smoke job.
# Idempotent; as root. Stop it with stop-local-pbs.sh. Settings: one-node-openpbs.sh's header.
set -euo pipefail
# shellcheck source=../lib/err.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/err.sh"
exec bash "$(dirname "$0")/one-node-openpbs.sh" ci
