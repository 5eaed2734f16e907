#!/usr/bin/env bash
# Run HERE (a Debian machine with network), before a device call: downloads the Debian packages
# the build needs that the GPU machine's image lacks (it has no network) into .deps/, which the
# device call carries (run's carry: [".deps"]) and scripts/device_gpu.sh unpacks with dpkg -x.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(libopenblas0-openmp libopenblas-openmp-dev libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0
      libpcre2-posix3 libcjson-dev libcjson1 uthash-dev zlib1g-dev libgfortran5
      libprotobuf-c-dev libprotobuf-c1 protobuf-c-compiler libprotoc32 libprotobuf32 libisal-dev libisal2)
mkdir -p .deps
(cd .deps && apt-get download "${PKGS[@]}" 2>/dev/null)
echo "fetch_device_deps: $(ls .deps/*.deb | wc -l) packages, $(du -sh .deps | cut -f1) in .deps/"
