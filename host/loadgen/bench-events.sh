#!/usr/bin/env bash
# Event fan-out benchmark of the homeserver on this machine: write throughput with and
# without live /events-stream subscribers, delivery latency to every subscriber, and the
# server's memory per idle subscription. Prints a markdown table (for
# docs/BENCHMARKS.md) on stdout; progress goes to stderr.
#
#   host/loadgen/bench-events.sh                       # 0, 1,000 and 10,000 subscribers
#   BENCH_FANOUT_SUBSCRIBERS="0 200" BENCH_FANOUT_WRITES=200 host/loadgen/bench-events.sh
#
# Steps: release build; then for every subscriber count a fresh homeserver on a throwaway
# data dir (SQLite + file blobs, unlimited quota, rate limits off, metrics on a free
# port), `hs-load fanout` against it (sign-up, N live subscriptions opened at the connect
# rate, 2 s idle, W signed PUTs at R/s, wait for every delivery), then the server is
# stopped. A fresh server per row keeps the memory reading clean: "idle KiB/sub" is the
# growth of the server's VmRSS from before the subscriptions to after they were open and
# idle for 2 s, divided by the number open. Client and server share the machine's cores,
# as in every figure of the table. Every process started here is killed on exit.
#
# Environment (defaults in brackets):
#   BENCH_FANOUT_SUBSCRIBERS [0 1000 10000]  one row (and one fresh server) per count
#   BENCH_FANOUT_WRITES [2000]       signed PUTs per row
#   BENCH_FANOUT_RATE [200]          writes per second
#   BENCH_FANOUT_USERS [1]           writer users; subscriber i follows user i % users
#   BENCH_FANOUT_CONNECT_RATE [2000] subscriptions opened per second
#   BENCH_FANOUT_TIMEOUT [300]       seconds after which a row stops and reports what it
#                                    has (marked "timed out"; latencies then cover only
#                                    what arrived, and "missing" counts what had not yet)
#   BENCH_THREADS []                 hs-load worker threads (empty: one per core)
#   BENCH_SKIP_BUILD [0]             1: use the release binaries already built
#   BENCH_SERVER_LOG [warn]          RUST_LOG for the homeserver
#   BENCH_KEEP_TMP [0]               1: keep the throwaway data dirs (path printed)
#   BENCH_POLICIES_DIR [policies/]   guests copied into each throwaway policies dir
# 10,000 subscribers need 10,000 file descriptors in each process: the script raises its
# open-file limit (ulimit -n 65536, or the hard limit if lower) before starting anything.
# Scale: every write is delivered to every subscriber of its user, so a row costs
# subscribers x writes / users deliveries (10,000 x 2,000 = 20 million), each parsed by
# hs-load on the same cores; on a small machine the 10,000 row takes minutes and its write
# rate shows how much the fan-out slows writers down.

set -euo pipefail

SUBSCRIBER_COUNTS=${BENCH_FANOUT_SUBSCRIBERS:-0 1000 10000}
WRITES=${BENCH_FANOUT_WRITES:-2000}
RATE=${BENCH_FANOUT_RATE:-200}
USERS=${BENCH_FANOUT_USERS:-1}
CONNECT_RATE=${BENCH_FANOUT_CONNECT_RATE:-2000}
TIMEOUT=${BENCH_FANOUT_TIMEOUT:-300}
THREADS=${BENCH_THREADS:-}
SKIP_BUILD=${BENCH_SKIP_BUILD:-0}
BENCH_NAME=bench-events
# shellcheck source=bench-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"

# Starts a homeserver on a fresh data dir $1; sets SERVER_PID, SERVER_PORT, METRICS_PORT.
start_server() {
    local dir=$1 admin_port tls_port
    free_port
    SERVER_PORT=$PORT
    free_port
    admin_port=$PORT
    free_port
    METRICS_PORT=$PORT
    free_port
    tls_port=$PORT
    mkdir -p "$dir/policies" "$dir/blobs"
    # The guests the repository ships (a copy: the server may write next to them).
    if [[ -d $POLICIES_SRC ]]; then
        cp -R "$POLICIES_SRC/." "$dir/policies/"
    fi
    (
        cd "$dir"
        export RUST_LOG=$SERVER_LOG
        export HOMESERVER__HTTP__LISTEN=127.0.0.1:$SERVER_PORT
        # Its other listeners get free ports too, so parallel test servers don't collide.
        # The server refuses unknown config keys, so only sections its defaults have.
        if has_section admin; then
            export HOMESERVER__ADMIN__LISTEN=127.0.0.1:$admin_port
            export HOMESERVER__ADMIN__PASSWORD=bench-$RANDOM$RANDOM$RANDOM
        fi
        export HOMESERVER__METRICS__LISTEN=127.0.0.1:$METRICS_PORT
        if has_section tls; then
            export HOMESERVER__TLS__LISTEN=127.0.0.1:$tls_port
        fi
        export HOMESERVER__STORAGE__DATABASE_URL=sqlite://$dir/hs.db
        export HOMESERVER__STORAGE__BLOBS=file://$dir/blobs
        export HOMESERVER__STORAGE__QUOTA_BYTES=0
        export HOMESERVER__KEYS__SECRET_KEY_FILE=$dir/server.key
        export HOMESERVER__POLICIES__DIR=$dir/policies
        export HOMESERVER__SIGNUP__MODE=open
        if has_section rate_limit; then
            export HOMESERVER__RATE_LIMIT__ENABLED=false
        fi
        lift_per_ip_limits
        exec "$HOMESERVER"
    ) >"$dir/homeserver.log" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    wait_port "$SERVER_PID" "$SERVER_PORT" "$dir/homeserver.log"
    wait_port "$SERVER_PID" "$METRICS_PORT" "$dir/homeserver.log"
}

# row STATUS LINE: a table row from an `hs-load fanout` line.
row() {
    awk -v status="$1" '{
        for (i = 1; i <= NF; i++) {
            n = index($i, "="); k = substr($i, 1, n - 1); v = substr($i, n + 1)
            sub(/ms$/, "", v); f[k] = v
        }
        if (f["deliveries"] == 0) f["p50"] = f["p90"] = f["p99"] = f["max"] = "-"
        kib = f["idle_bytes/sub"]
        if (kib != "-" && kib != "") kib = sprintf("%.1f", kib / 1024)
        sub(/s$/, "", f["server_cpu"]); sub(/s$/, "", f["loadgen_cpu"])
        printf "| %s | %s / %s | %s / %s | %s | %s | %s | %s / %s | %s | %s | %s | %s | %s / %s / %s / %s | %s | %s / %s | %s | %s |\n",
            f["subscribers"], f["open"], f["server_subscribers"], f["writes_ok"],
            f["writes"], f["write/s"], f["put_p50"], f["put_p99"], f["deliveries"],
            f["expected"], f["p50"], f["p90"], f["p99"], f["max"], f["missing"],
            f["duplicates"], f["out_of_order"], f["unexpected"], kib, f["server_cpu"],
            f["loadgen_cpu"], f["errors"], status
    }' <<<"$2"
}

# ---- file descriptors ----
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
log "open-file limit: $(ulimit -n)"

# ---- build ----
if [[ $SKIP_BUILD != 1 ]]; then
    log "building release binaries (-p hs-loadgen -p homeserver)"
    (cd "$ROOT" && cargo build --release -p hs-loadgen -p homeserver >&2)
fi
for bin in "$LOAD" "$HOMESERVER"; do
    [[ -x $bin ]] || {
        log "missing $bin"
        exit 1
    }
done

# ---- one fresh server per subscriber count ----
for n in $SUBSCRIBER_COUNTS; do
    dir=$TMP/run-$n
    mkdir -p "$dir"
    if [[ $(ulimit -n) =~ ^[0-9]+$ ]] && (($(ulimit -n) < n + 256)); then
        log "warning: $n subscribers with an open-file limit of $(ulimit -n)"
    fi
    start_server "$dir"
    log "$n subscribers, $WRITES writes at $RATE/s (homeserver pid $SERVER_PID on $SERVER_PORT)"
    args=(fanout --url "http://127.0.0.1:$SERVER_PORT" --subscribers "$n"
        --writes "$WRITES" --rate "$RATE" --users "$USERS" --connect-rate "$CONNECT_RATE"
        --timeout "$TIMEOUT" --server-pid "$SERVER_PID"
        --metrics-url "http://127.0.0.1:$METRICS_PORT")
    [[ -n $THREADS ]] && args+=(--threads "$THREADS")
    status=ok
    line=$("$LOAD" "${args[@]}") || status="not clean"
    [[ $line == *" timed_out=true"* ]] && status="timed out"
    if [[ $line == scenario=fanout* ]]; then
        log "  $line"
        ROWS+=("$(row "$status" "$line")")
    else
        log "  failed"
        ROWS+=("| $n | failed | | | | | | | | | | | | | | $status |")
    fi
    [[ $status == ok ]] || FAILED=1
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        log "homeserver died; log tail:"
        tail -n 30 "$dir/homeserver.log" >&2
        FAILED=1
    fi
    stop "$SERVER_PID"
    [[ $KEEP_TMP == 1 ]] || rm -rf "$dir"
done

# ---- report ----
cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')
mem=$(awk '/^MemTotal/ { printf "%.1f GiB RAM", $2 / 1048576 }' /proc/meminfo 2>/dev/null)
cat <<EOF
Machine: $(nproc) cores, ${cpu:-unknown CPU}, ${mem:-unknown RAM}, $(uname -sr); $(rustc -V)
Load: hs-load fanout on the same machine; $WRITES signed PUTs (64 B values) at $RATE/s \
over 16 connections, $USERS writer user(s), subscriptions opened at $CONNECT_RATE/s, \
a fresh homeserver (SQLite) per row; threads: ${THREADS:-one per core}; latencies in ms \
(PUT: request to answer; delivery: PUT sent to event received, over every \
(subscriber, event) pair); CPU: seconds used from the first write to the last delivery. Date: $(date -u +%Y-%m-%dT%H:%MZ).

| subscribers | open (loadgen / server) | writes ok | write/s | PUT p50 | PUT p99 | deliveries / expected | p50 | p90 | p99 | max | missing / dup / out of order / unexpected | idle KiB/sub | CPU s (server / loadgen) | errors | run |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|
EOF
printf '%s\n' "${ROWS[@]}"
exit "$FAILED"
