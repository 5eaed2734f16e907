#!/usr/bin/env bash
# Every CUDA kernel of the backend begins with cuda_pdl_begin(): cuda_launch launches each with
# programmatic dependent launch, so a kernel without it would start before the one ahead of it
# in the stream has finished, and race with it (cuda_ops.h). Reads the sources under DIR (default
# src/backend/cuda); prints each kernel whose body starts otherwise and exits 1, or the count.
set -euo pipefail
dir=${1:-src/backend/cuda}
awk '
    # the first statement of a kernel body, text: is it cuda_pdl_begin();?
    function first(text) {
        if (text !~ /^[[:space:]]*cuda_pdl_begin\(\);/) {
            print FILENAME ":" FNR ": " name " starts with: " text
            bad++
        }
        body = 0
    }
    FNR == 1 { seek = 0; body = 0 }
    { line = $0; sub(/\/\/.*/, "", line) } # code only, not comments
    body && line ~ /[^[:space:]]/ { first(line) }
    line ~ /__global__/ {
        seek = 1; kernels++
        name = line; sub(/\(.*/, "", name); sub(/.*[[:space:]*&]/, "", name)
    }
    seek && index(line, "{") {
        seek = 0; body = 1
        rest = substr(line, index(line, "{") + 1)
        if (rest ~ /[^[:space:]]/) first(rest)
    }
    END {
        if (bad) {
            print bad " of " kernels " kernels do not begin with cuda_pdl_begin(); (hint: make it their first line)"
            exit 1
        }
        if (!kernels) { print "no __global__ kernels found: wrong directory?"; exit 1 }
        print kernels " kernels, each beginning with cuda_pdl_begin();"
    }
' "$dir"/*.cu "$dir"/*.cuh
