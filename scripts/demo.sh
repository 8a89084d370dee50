#!/usr/bin/env bash
# Sets everything up and shows pg_throttle at work on a throwaway local cluster:
# installs what is missing from Debian's packages, builds, installs, starts a
# temporary PostgreSQL with pg_throttle preloaded, runs scripts/demo.sql, and
# removes the cluster again. The version is the machine's own (the newest of
# 15 to 18 installed, else the one its Debian ships: 15 on Debian 12, 17 on
# Debian 13, 18 on sid); PG_MAJOR=17 bash scripts/demo.sh picks one.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

echo "Checking the Debian packages the build needs"
install_missing_packages
build_and_install
cd "$ROOT"
echo "Starting a throwaway PostgreSQL $PG_MAJOR cluster with pg_throttle preloaded (pg_virtualenv), running scripts/demo.sql in it"
pg_virtualenv -v "$PG_MAJOR" -t -o shared_preload_libraries=pg_throttle \
    sh -c 'psql -qX -v ON_ERROR_STOP=1 -c "CREATE EXTENSION pg_throttle" &&
           psql -qX -v ON_ERROR_STOP=1 -f scripts/demo.sql'
