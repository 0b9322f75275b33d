#!/usr/bin/env bash
# Start-up time of the homeserver: process start to the first served request, with all
# three guests loaded, cold (empty compiled-guest cache) and warm (cache present).
# Prints a markdown table on stdout.
#
#   host/loadgen/bench-start.sh            # 5 runs each
#   BENCH_START_RUNS=10 host/loadgen/bench-start.sh
set -euo pipefail

RUNS=${BENCH_START_RUNS:-5}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
HOMESERVER=$TARGET_DIR/release/homeserver
[ "${BENCH_SKIP_BUILD:-0}" = 1 ] || (cd "$ROOT" && cargo build --release -q -p homeserver)

TMP=$(mktemp -d "${TMPDIR:-/tmp}/hs-start.XXXXXX")
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# One start: prints milliseconds from exec to the first 2xx/4xx answer.
one_start() {
    local dir=$1 port
    port=$(free_port)
    local start end
    start=$(date +%s%N)
    (cd "$dir" && HOMESERVER__HTTP__LISTEN=127.0.0.1:$port HOMESERVER__METRICS__LISTEN="" \
        HOMESERVER__RATE_LIMIT__ENABLED=false RUST_LOG=warn exec "$HOMESERVER" >/dev/null 2>&1) &
    PID=$!
    until curl -s -o /dev/null "http://127.0.0.1:$port/events/?limit=1"; do sleep 0.002; done
    end=$(date +%s%N)
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
    echo $(( (end - start) / 1000000 ))
}

stats() { sort -n | awk '{a[NR]=$1} END {printf "%d | %d | %d", a[1], a[int((NR+1)/2)], a[NR]}'; }

cold=() warm=()
for _ in $(seq "$RUNS"); do
    dir=$TMP/cold-$RANDOM; mkdir -p "$dir"
    cold+=("$(one_start "$dir")")          # no data/guest-cache yet: built-in guests precompiled (build.rs)
    warm+=("$(one_start "$dir")")          # same dir: the cache from the cold start
done

echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(rustc --version)"
echo
echo "| start | runs | min ms | median ms | max ms |"
echo "|---|---:|---:|---:|---:|"
echo "| cold (no compiled-guest cache) | $RUNS | $(printf '%s\n' "${cold[@]}" | stats) |"
echo "| warm (compiled-guest cache) | $RUNS | $(printf '%s\n' "${warm[@]}" | stats) |"
