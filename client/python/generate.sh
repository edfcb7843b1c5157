#!/usr/bin/env bash
# Regenerates the protobuf and gRPC modules that ship in the package (streambp/v1/:
# trainer_pb2.py, trainer_pb2.pyi, trainer_pb2_grpc.py) from proto/streambp/v1/trainer.proto,
# with protoc and gRPC's grpc_python_plugin (Debian: protobuf-compiler, protobuf-compiler-grpc).
# The modules are committed: users install the package without protoc.
#
#   client/python/generate.sh            regenerate in place (commit the result)
#   client/python/generate.sh --check    regenerate into a temporary folder and fail when the
#                                        committed modules differ (the test python.stubs_drift)
#
# PROTOC and GRPC_PYTHON_PLUGIN override the tools found on PATH.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
protoc="${PROTOC:-$(command -v protoc || true)}"
plugin="${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || true)}"
[ -n "$protoc" ] || { echo "protoc not found (Debian package protobuf-compiler)" >&2; exit 2; }
[ -n "$plugin" ] || { echo "grpc_python_plugin not found (Debian package protobuf-compiler-grpc)" >&2; exit 2; }
files=(trainer_pb2.py trainer_pb2.pyi trainer_pb2_grpc.py)

generate() {  # generate OUT: writes OUT/streambp/v1/<files>
  "$protoc" --proto_path="$root/proto" --python_out="$1" --pyi_out="$1" --grpc_out="$1" \
    --plugin=protoc-gen-grpc="$plugin" streambp/v1/trainer.proto
}

if [ "${1:-}" = "--check" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  generate "$tmp"
  drift=0
  for f in "${files[@]}"; do
    if ! cmp -s "$tmp/streambp/v1/$f" "$here/streambp/v1/$f"; then
      echo "DRIFT: client/python/streambp/v1/$f differs from what $("$protoc" --version) generates from proto/:" >&2
      diff -u "$here/streambp/v1/$f" "$tmp/streambp/v1/$f" | head -20 >&2 || true
      drift=1
    fi
  done
  if [ "$drift" = 1 ]; then
    echo "fix: bash client/python/generate.sh && git add client/python/streambp/v1" >&2
    exit 1
  fi
  echo "the generated modules in client/python/streambp/v1 match proto/ ($("$protoc" --version))"
  exit 0
fi

[ $# -eq 0 ] || { echo "usage: generate.sh [--check]" >&2; exit 2; }
generate "$here"
echo "regenerated ${files[*]} in client/python/streambp/v1 ($("$protoc" --version))"
