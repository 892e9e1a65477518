#!/usr/bin/env bash
# The GPU tests on a cold kernel cache: every kernel compiled on this host (NVRTC, all cores),
# then run; the wall time, and the slowest tests. GPU only.
#
#   benchmarks/gpu_tests_cold.sh OUTDIR [pytest args...]
#
# Writes OUTDIR/gpu_tests.log; the cache is a fresh folder under $TMPDIR, so nothing carried or
# cached before is used.
set -uo pipefail
out=$1
shift
mkdir -p "$out"
export TUNER_CACHE
TUNER_CACHE=$(mktemp -d "${TMPDIR:-/tmp}/tuner-cold-cache.XXXX")
unset TUNER_CARRIED_CACHE
start=$SECONDS
python3 -m pytest -m gpu -q -p no:cacheprovider --durations=20 "$@" > "$out/gpu_tests.log" 2>&1
rc=$?
echo "pytest -m gpu: rc=$rc, $((SECONDS - start)) s on a cold cache ($(nproc) cores), $(find "$TUNER_CACHE" -name '*.cubin' | wc -l) kernels compiled"
grep -E "passed|failed" "$out/gpu_tests.log" | tail -1
grep -A22 "slowest" "$out/gpu_tests.log"
exit $rc
