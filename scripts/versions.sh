# The PostgreSQL versions the test command and `make bench-versions` cover,
# and where each runs: natively when this machine's Debian ships it (or it is
# installed), otherwise inside the Debian tree that ships it
# (scripts/debian_tree.sh). Sourced after scripts/lib.sh.
# shellcheck shell=bash

TESTED_PG_MAJORS=(15 17 18)

# parse_pg_flags USAGE ARGS...: sets the array `versions` from --pg VERSION
# flags (default: TESTED_PG_MAJORS), each once; exits 2 on anything else or
# on a version that can run neither here nor in a tree.
parse_pg_flags() {
    local usage=$1 v
    shift
    versions=()
    while [ $# -gt 0 ]; do
        case "$1" in
        --pg) versions+=("${2:?--pg VERSION}") && shift 2 ;;
        --pg=*) versions+=("${1#--pg=}") && shift ;;
        *) echo "usage: $usage" >&2 && exit 2 ;;
        esac
    done
    [ ${#versions[@]} -gt 0 ] || versions=("${TESTED_PG_MAJORS[@]}")
    mapfile -t versions < <(printf '%s\n' "${versions[@]}" | awk '!seen[$0]++')
    for v in "${versions[@]}"; do
        if ! runs_natively "$v" && ! debian_suite_for "$v" >/dev/null; then
            echo "PostgreSQL $v: not installed here, and no Debian release in reach ships it" >&2
            exit 2
        fi
    done
}

# Whether any of `versions` needs a Debian tree (and so debootstrap).
versions_need_a_tree() {
    local v
    for v in "${versions[@]}"; do
        runs_natively "$v" || return 0
    done
    return 1
}

# run_on_version V SCRIPT ARGS...: runs `bash SCRIPT ARGS...` (SCRIPT a path in
# the repository) with PG_MAJOR=V, natively, or inside V's tree on a fresh
# copy of the source, holding the tree's lock. Its output passes through;
# returns its exit status.
run_on_version() {
    local v=$1 script=$2 suite dir
    shift 2
    if runs_natively "$v"; then
        PG_MAJOR=$v bash "$ROOT/$script" "$@"
        return
    fi
    suite=$(debian_suite_for "$v")
    dir=$(tree_dir "$suite")
    (
        tree_lock "$suite" || exit 1
        tree_ensure "$suite" || exit 1
        tree_copy_source "$ROOT" "$dir" || exit 1
        tree_enter "$dir" env PG_MAJOR="$v" bash "/build/pg_throttle/$script" "$@"
    )
}
