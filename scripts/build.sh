#!/usr/bin/env bash
# Installs missing Debian packages, then configures and builds the project into
# ${BUILD_DIR:-build} with Ninja (and ccache when present). Extra arguments go to cmake.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install-deps.sh"
build="${BUILD_DIR:-$root/build}"
extra=()
if [ "${CI:-}" = "true" ]; then extra+=(-DSTREAMBP_WERROR=ON); fi
if [ ! -f "$build/build.ninja" ] || [ $# -gt 0 ] || [ ${#extra[@]} -gt 0 ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${extra[@]}" "$@" >/dev/null
fi
# ccache caches no compile that reads a precompiled header unless told these are safe to
# ignore (a PCH's defines and its file times); then a rebuild in the same directory after a
# clean hits (one file with its PCH: 60 s -> 3 s). A clone at another path still misses: its PCH
# differs.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
jobs="${BUILD_JOBS:-$(nproc)}"
echo "build: compiling in $build with $jobs jobs (first build takes a few minutes: LibTorch headers are heavy)"
cmake --build "$build" -j "$jobs"
