# Shared by the scripts in this folder: privileges, Debian packages, build.
# shellcheck shell=bash

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_MAJOR=15
export PATH="/usr/lib/postgresql/$PG_MAJOR/bin:$PATH"

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Debian packages the build and every suite need.
PACKAGES=(
    make g++ git python3 python3-psycopg2 perl
    "postgresql-$PG_MAJOR" "postgresql-server-dev-$PG_MAJOR" "postgresql-$PG_MAJOR-pgtap"
    postgresql-common postgresql-client-common libkrb5-dev
    libtap-parser-sourcehandler-pgtap-perl libgtest-dev
    clang-format clang-tidy cmake procps
)

install_missing_packages() {
    local missing=()
    for pkg in "${PACKAGES[@]}" "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "Installing from Debian: ${missing[*]}"
        as_root apt-get update -q
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            "${missing[@]}"
    fi
}

build_and_install() {
    make -C "$ROOT" -s
    as_root make -C "$ROOT" -s install
}
