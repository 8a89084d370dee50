# Shared by the scripts in this folder: privileges, Debian packages, build.
# shellcheck shell=bash

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Which Debian release ships which version, and the trees for the others.
source "$ROOT/scripts/debian_tree.sh"

# The PostgreSQL major versions pg_throttle builds for (src/pg/server/compat.hpp).
SUPPORTED_PG_MAJORS=(15 16 17 18)

# The version to build and test for when PG_MAJOR does not say: the newest
# supported server installed here, else the one this Debian release ships
# (debian_suite_for).
default_pg_major() {
    local v
    for v in $(printf '%s\n' "${SUPPORTED_PG_MAJORS[@]}" | sort -rn); do
        if [ -x "/usr/lib/postgresql/$v/bin/pg_config" ] && [ -x "/usr/lib/postgresql/$v/bin/postgres" ]; then
            echo "$v"
            return
        fi
    done
    v=$(apt-cache depends postgresql 2>/dev/null | sed -n 's/^ *Depends: postgresql-\([0-9][0-9]*\)$/\1/p' | head -1)
    if [ -n "$v" ]; then
        echo "$v"
        return
    fi
    for v in "${SUPPORTED_PG_MAJORS[@]}"; do  # no package lists yet: the release's own
        if [ "$(debian_suite_for "$v")" = "$(host_debian_suite)" ]; then
            echo "$v"
            return
        fi
    done
    echo 15
}

is_supported_pg_major() {
    local v
    for v in "${SUPPORTED_PG_MAJORS[@]}"; do
        [ "$v" = "$1" ] && return 0
    done
    return 1
}

PG_MAJOR=${PG_MAJOR:-$(default_pg_major)}
if ! is_supported_pg_major "$PG_MAJOR"; then
    echo "PostgreSQL $PG_MAJOR is not supported: pg_throttle builds for ${SUPPORTED_PG_MAJORS[*]}" >&2
    exit 2
fi
export PG_MAJOR
export PATH="/usr/lib/postgresql/$PG_MAJOR/bin:$PATH"

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Debian packages the build and every suite of one version need.
PACKAGES=(
    make g++ git python3 python3-psycopg2 perl
    "postgresql-$PG_MAJOR" "postgresql-server-dev-$PG_MAJOR" "postgresql-$PG_MAJOR-pgtap"
    postgresql-common postgresql-client-common libkrb5-dev
    libtap-parser-sourcehandler-pgtap-perl libgtest-dev
    cmake procps
)
# And the lint that scripts/test.sh runs once, on this machine.
LINT_PACKAGES=(clang-format clang-tidy)
# The real components the suites of one version run pg_throttle with: a
# connection pooler, the Prometheus exporter, and the clients of examples/
# and the client packages of clients/ (psycopg 3 and pytest, and what pip needs to install
# the Python package into a virtual environment; Node.js with npm, unless the machine has them
# already; Chromium, for the dashboard's browser test).
CLIENT_PACKAGES=(pgbouncer prometheus-postgres-exporter python3-psycopg python3-psycopg-pool
    python3-pytest python3-venv python3-pip python3-setuptools chromium)

package_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

install_missing_packages() {
    local missing=() pkg
    for pkg in "${PACKAGES[@]}" "$@"; do
        package_installed "$pkg" || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "Installing from Debian: ${missing[*]}"
        as_root apt-get update -q
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            "${missing[@]}"
    fi
}

# The packages of CLIENT_PACKAGES, and Node.js with npm when there is no npm.
# Debian starts the services of pgbouncer and prometheus-postgres-exporter
# (the exporter listening on every address) when systemd runs: the suites
# start their own, on loopback, so the services of packages installed here
# are stopped and disabled.
install_client_packages() {
    local wanted=("${CLIENT_PACKAGES[@]}") new_services=() pkg
    command -v npm >/dev/null || wanted+=(nodejs npm)
    for pkg in pgbouncer prometheus-postgres-exporter; do
        package_installed "$pkg" || new_services+=("$pkg")
    done
    install_missing_packages "${wanted[@]}"
    if [ -d /run/systemd/system ]; then
        for pkg in "${new_services[@]}"; do
            as_root systemctl disable --now "$pkg" >/dev/null 2>&1 || true
        done
    fi
}

# Builds for $PG_MAJOR; objects built for another version are cleaned first.
build_and_install() {
    local stamp="$ROOT/build/pg-major"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$PG_MAJOR" ]; then
        make -C "$ROOT" -s clean >/dev/null
        rm -rf "$ROOT/build/cmake"
        mkdir -p "$ROOT/build"
        echo "$PG_MAJOR" >"$stamp"
    fi
    echo "Building pg_throttle for PostgreSQL $PG_MAJOR (make; about a minute on two cores the first time)"
    make -C "$ROOT" -s
    echo "Installing it into $(pg_config --pkglibdir) and $(pg_config --sharedir)/extension"
    as_root make -C "$ROOT" -s install
}
