# Shared by scripts/tp_gpu.sh and scripts/pp_gpu.sh (sourced, with NAME set): build-gpu's loom,
# the fixtures, a scratch folder, mpirun with ranks sharing the GPU, and the table of checks.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=$ROOT/build-gpu
LOOM=$BUILD/loom
FIX=$ROOT/tests/fixtures
WORK=$(mktemp -d "/tmp/loom_${NAME}_XXXXXX")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
declare -a ROWS
failed=0
row() { ROWS+=("$(printf '| %-46s | %-60s |' "$1" "$2")"); }
losses() { grep '"loss"' "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
# worst RUN REF: the largest loss difference of metrics file RUN from REF's, and RUN's last loss
worst() { paste <(losses "$1") <(losses "$2") |
          awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > w) w = d; l = $1 } END { printf "max |loss - cpu fp32| %.4f, last loss %.4f", w, l }'; }
# The table of checks; removes the scratch folder and exits 1 when a check failed.
finish() {
    echo
    printf '| %-46s | %-60s |\n' "check" "result"
    printf '|%s|%s|\n' "$(printf -- '-%.0s' {1..48})" "$(printf -- '-%.0s' {1..62})"
    printf '%s\n' "${ROWS[@]}"
    rm -rf "$WORK"
    exit $failed
}
