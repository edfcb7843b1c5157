#!/usr/bin/env bash
# Installs what is missing, builds, and runs the test suite (without the `slow` label;
# pass -L slow to run only those, or any other ctest arguments).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/build.sh"
build="${BUILD_DIR:-$root/build}"
if [ $# -eq 0 ]; then set -- -LE slow; fi
# Each test process would restart itself once to run OpenBLAS's kernels for this CPU
# (streambp::UseCpuBlasKernels, ~0.4 s of loading LibTorch again, 850 times): the server picks
# them once here and every test inherits the choice.
if [ -z "${OPENBLAS_CORETYPE+x}" ]; then
  blas=$("$build/server/streambp-server" --version | grep '^BLAS ' || true)
  if [[ "$blas" =~ \(([A-Za-z0-9_]+)\ kernels,\ not\ its\ own\ choice\ ([A-Za-z0-9_]+)\) ]]; then
    export OPENBLAS_CORETYPE="${BASH_REMATCH[1]}" STREAMBP_OPENBLAS_FALLBACK="${BASH_REMATCH[2]}"
    echo "OpenBLAS: ${OPENBLAS_CORETYPE} kernels for this CPU (OpenBLAS chose ${STREAMBP_OPENBLAS_FALLBACK})"
  fi
fi
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
