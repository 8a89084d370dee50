#!/usr/bin/env bash
# Sets everything up and shows pg_throttle at work on a throwaway local cluster:
# installs what is missing from Debian's packages, builds, installs, starts a
# temporary PostgreSQL 15 with pg_throttle preloaded, runs scripts/demo.sql, and
# removes the cluster again.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

install_missing_packages
build_and_install
cd "$ROOT"
pg_virtualenv -t -o shared_preload_libraries=pg_throttle \
    sh -c 'psql -qX -v ON_ERROR_STOP=1 -c "CREATE EXTENSION pg_throttle" &&
           psql -qX -v ON_ERROR_STOP=1 -f scripts/demo.sql'
