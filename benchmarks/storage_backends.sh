#!/usr/bin/env bash
# The same study through SQLite and through a PostgreSQL server on loopback, one worker per GPU
# (--gpus), each from an empty database, then `show` of both: the two should measure alike.
#
#   benchmarks/storage_backends.sh OUTDIR WORKLOAD TOKENS [GPUS] [study flags...]
#   e.g. benchmarks/storage_backends.sh out gpt3 256 0 --trials 150
#
# The server comes from .ci/postgres (the machine's PostgreSQL binaries, or any initdb on PATH,
# such as the one the pgserver wheel carries); needs the postgresql extra (psycopg).
set -uo pipefail
out=$1 workload=$2 tokens=$3 gpus=${4:-0}
shift $(( $# < 4 ? $# : 4 ))
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
pg=$(mktemp -d)
chmod 755 "$pg"
url=$("$here/.ci/postgres" start "$pg/server") || exit 1
trap '"$here/.ci/postgres" stop "$pg/server"; rm -rf "$pg"' EXIT
for storage in "sqlite:///$(realpath "$out")/$workload-$tokens.db" "$url"; do
    kind=${storage%%:*}
    t0=$SECONDS
    python3 -m tuner study "$workload" --tokens "$tokens" --no-warm-start --gpus "$gpus" --storage "$storage" "$@" \
        > "$out/$workload-$tokens.$kind.log" 2>&1
    echo "$kind: rc=$? $((SECONDS - t0)) s"
    grep -a "on NVIDIA\|workers:" "$out/$workload-$tokens.$kind.log" | cut -c1-300
    python3 -m tuner show "$workload" --storage "$storage" | cut -c1-250
done
