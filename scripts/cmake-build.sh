#!/usr/bin/env bash
# Builds the module and the unit tests with CMake and runs the unit tests
# through ctest: the CMake build must keep building what the Makefile builds.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build/cmake -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/cmake -j2 -- -s
test -f build/cmake/pg_throttle.so
(cd build/cmake && ctest -L unit --output-on-failure)
