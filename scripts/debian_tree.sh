# Debian trees for the PostgreSQL versions this machine's Debian does not ship:
# a `debootstrap --variant=minbase` tree of the release that ships the
# version, entered with chroot. Sourced by scripts/test.sh, which runs
#   bash scripts/debian_tree.sh run DIR COMMAND...
# in a mount namespace of its own (unshare), so that the tree's mounts are
# never seen outside it and vanish with it, even when the run is killed.
#   bash scripts/debian_tree.sh remove SUITE
# deletes a cached tree safely.
#
# Trees are cached in $PG_THROTTLE_TREES (/var/cache/pg_throttle/trees), one
# folder per Debian suite, outside the repository. A tree is made from nothing
# when its folder is missing; a half-made one is never used. One run at a time
# uses a tree: it holds $PG_THROTTLE_TREES/SUITE.lock (flock).
# shellcheck shell=bash

PG_THROTTLE_TREES=$(realpath -m "${PG_THROTTLE_TREES:-/var/cache/pg_throttle/trees}")
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

# The Debian suite whose own packages hold PostgreSQL $1 (none for 16).
debian_suite_for() {
    case "$1" in
    15) echo bookworm ;;
    17) echo trixie ;;
    18) echo sid ;;
    *) return 1 ;;
    esac
}

# This machine's Debian suite, or nothing.
host_debian_suite() {
    (
        # shellcheck disable=SC1091
        . /etc/os-release 2>/dev/null || exit 0
        if [ "${ID:-}" = debian ]; then
            echo "${VERSION_CODENAME:-}"
        fi
    )
}

# Whether PostgreSQL $1 runs here without a tree: installed already, or
# shipped by this machine's Debian release.
runs_natively() {
    [ -x "/usr/lib/postgresql/$1/bin/postgres" ] && return 0
    [ "$(debian_suite_for "$1" 2>/dev/null)" = "$(host_debian_suite)" ]
}

tree_dir() { echo "$PG_THROTTLE_TREES/$1"; }

# Mount points under $1, deepest first.
mounts_under() {
    awk -v top="$1" '$2 == top || index($2, top "/") == 1 {print $2}' /proc/self/mounts | sort -r
}

# Stops every process whose root is inside tree $1 (servers a test left).
tree_kill_processes() {
    local dir=$1 proc root
    for proc in /proc/[0-9]*; do
        root=$(readlink "$proc/root" 2>/dev/null) || continue
        case "$root" in
        "$dir" | "$dir"/*) kill -KILL "${proc#/proc/}" 2>/dev/null ;;
        esac
    done
}

# Undoes the mounts of tree $1. Fails, loudly, when one stays.
tree_unmount() {
    local dir=$1 point left
    tree_kill_processes "$dir"
    for point in $(mounts_under "$dir"); do
        umount "$point" 2>/dev/null || { sleep 1 && umount "$point"; } ||
            umount -l "$point"
    done
    left=$(mounts_under "$dir")
    if [ -n "$left" ]; then
        echo "still mounted under $dir: $left" >&2
        return 1
    fi
}

# Deletes folder $1, which holds a tree: never through a mount (a delete
# through a bound /dev deletes the machine's devices).
tree_delete() {
    local dir=$1
    [ -e "$dir" ] || return 0
    tree_unmount "$dir" || return 1
    rm -rf --one-file-system "$dir"
}

# Mounts what a server and the test clients need inside tree $1. Run it in a
# mount namespace of its own (tree_enter), never in the machine's.
tree_mount() {
    local dir=$1
    mount -t proc proc "$dir/proc" || return 1
    mount --bind /dev "$dir/dev" || return 1
    mount --make-private "$dir/dev" || return 1
    mount --bind /dev/pts "$dir/dev/pts" || return 1
    mount -t tmpfs -o mode=1777 shm "$dir/dev/shm" || return 1
    rm -f "$dir/etc/resolv.conf"
    cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
    # The machine's own trust anchors (a TLS proxy's CA, say): the tree shares
    # its network, so npm in the tree reaches the registry the way the machine
    # does. Installed as the tree's local CAs; ca-certificates, when the tree
    # has it or installs it later, adds them to the tree's bundle.
    if [ -d /usr/local/share/ca-certificates ] &&
        ! diff -r /usr/local/share/ca-certificates "$dir/usr/local/share/ca-certificates" \
            >/dev/null 2>&1; then
        mkdir -p "$dir/usr/local/share/ca-certificates"
        cp -a /usr/local/share/ca-certificates/. "$dir/usr/local/share/ca-certificates/"
        if [ -x "$dir/usr/sbin/update-ca-certificates" ]; then
            chroot "$dir" /usr/sbin/update-ca-certificates >/dev/null 2>&1 || true
        fi
    fi
}

# Runs COMMAND... as root inside tree $1, in a mount namespace of its own;
# stops whatever it left running inside the tree. Returns its exit status.
tree_enter() {
    local dir=$1 rc=0
    shift
    unshare --mount --propagation private -- bash "${BASH_SOURCE[0]}" run "$dir" "$@" || rc=$?
    tree_kill_processes "$dir"
    return $rc
}

# Holds the lock of tree $1 (a Debian suite) on file descriptor 9.
tree_lock() {
    mkdir -p "$PG_THROTTLE_TREES"
    exec 9>"$PG_THROTTLE_TREES/$1.lock"
    flock -w 3600 9 || {
        echo "the $1 tree is busy: another run has held it for an hour" >&2
        return 1
    }
}

# Makes tree $1 (a Debian suite) unless it is there and whole.
tree_ensure() {
    local suite=$1 dir new
    dir=$(tree_dir "$suite")
    new="$dir.new"
    [ -e "$dir/.pg_throttle-tree" ] && return 0
    tree_delete "$dir" || return 1
    tree_delete "$new" || return 1
    mkdir -p "$PG_THROTTLE_TREES"
    echo "Making a Debian $suite tree in $dir (debootstrap)"
    debootstrap --variant=minbase "$suite" "$new" "$DEBIAN_MIRROR" >"$PG_THROTTLE_TREES/$suite.log" 2>&1 || {
        tail -20 "$PG_THROTTLE_TREES/$suite.log" >&2
        tree_delete "$new"
        return 1
    }
    # No service starts inside the tree when its package is installed.
    printf '#!/bin/sh\nexit 101\n' >"$new/usr/sbin/policy-rc.d"
    chmod 755 "$new/usr/sbin/policy-rc.d"
    # sid's Release file can be past its Valid-Until date on a mirror.
    echo 'Acquire::Check-Valid-Until "false";' >"$new/etc/apt/apt.conf.d/90pg-throttle"
    echo 'APT::Install-Recommends "false";' >>"$new/etc/apt/apt.conf.d/90pg-throttle"
    touch "$new/.pg_throttle-tree"
    mv "$new" "$dir"
}

# Copies the source tree at $1 into tree $2's /build/pg_throttle (tracked
# and untracked files; no build products, no .git).
tree_copy_source() {
    local src=$1 dir=$2
    rm -rf --one-file-system "$dir/build/pg_throttle"
    mkdir -p "$dir/build/pg_throttle"
    if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
        (cd "$src" && { git ls-files -z --cached --others --exclude-standard; } |
            xargs -0 -r tar --ignore-failed-read -cf - 2>/dev/null) |
            tar -C "$dir/build/pg_throttle" -xf -
        # The released versions' sources, for the upgrade test: the tree's
        # copy has no git history.
        mkdir -p "$dir/build/pg_throttle/build/releases"
        grep -v '^#' "$src/test/releases" | while read -r version commit; do
            git -C "$src" archive -o "$dir/build/pg_throttle/build/releases/$version.tar" "$commit"
        done
    else
        tar -C "$src" --exclude=.git --exclude='*.o' --exclude='*.so' --exclude='*.d' \
            --exclude=./build --exclude=./results -cf - . | tar -C "$dir/build/pg_throttle" -xf -
    fi
}

# Runs a command inside tree $1 as root, with a clean environment.
tree_run() {
    local dir=$1 name
    shift
    local env=(HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}"
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
    for name in CI SOAK_CYCLES SOAK_SEED SOAK_PORT; do
        [ -n "${!name:-}" ] && env+=("$name=${!name}")
    done
    chroot "$dir" /usr/bin/env -i "${env[@]}" "$@"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    case "${1:-}" in
    run)  # inside tree_enter's mount namespace
        dir=${2:?run DIR COMMAND...}
        shift 2
        tree_mount "$dir"
        tree_run "$dir" "$@" 9>&-
        ;;
    remove)
        suite=${2:?remove SUITE: bookworm, trixie or sid}
        tree_lock "$suite"
        tree_kill_processes "$(tree_dir "$suite")"
        tree_delete "$(tree_dir "$suite")"
        tree_delete "$(tree_dir "$suite").new"
        ;;
    *)
        echo "usage: bash scripts/debian_tree.sh remove SUITE" >&2
        exit 2
        ;;
    esac
fi
