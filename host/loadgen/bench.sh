#!/usr/bin/env bash
# Benchmarks the homeserver against a bare-hyper baseline on this machine and prints a
# markdown table (for docs/BENCHMARKS.md) on stdout; progress goes to stderr.
#
#   host/loadgen/bench.sh                 # everything, defaults below
#   BENCH_DURATION=3 BENCH_WARMUP=1 host/loadgen/bench.sh
#
# Steps: release build; baseline server answering `static` with a 1 KiB (then 1 MiB)
# body; then the homeserver on a throwaway data dir (SQLite + file blobs, unlimited quota,
# rate limits off) under every scenario. Every process started here is killed on exit.
# Client and servers share the machine's cores, as in every figure of the table.
#
# Environment (defaults in brackets):
#   BENCH_DURATION [10]         measured seconds per scenario
#   BENCH_WARMUP [2]            warm-up seconds per scenario (not measured)
#   BENCH_CONNECTIONS [32]      connections for the 1 KiB scenarios
#   BENCH_CONNECTIONS_1M [8]    connections for the 1 MiB scenarios
#   BENCH_THREADS []            hs-load worker threads (empty: one per core)
#   BENCH_SCENARIOS [put-1k get-1k public-get-1k session-get-1k put-1m get-1m public-get-1m]
#                               (also: put-10m get-10m, at BENCH_CONNECTIONS_1M)
#   BENCH_BASELINE_ONLY [0]     1: build and measure only the baseline
#   BENCH_SERVER_LOG [warn]     RUST_LOG for the homeserver
#   BENCH_HOMESERVER []         a homeserver binary to measure instead of building this
#                               checkout's (an A/B of two builds)
#   BENCH_KEEP_TMP [0]          1: keep the throwaway data dir (path printed)
#   BENCH_POLICIES_DIR [policies/]  guests copied into the throwaway policies dir
#   BENCH_BACKEND [sqlite]      postgres: PostgreSQL + S3 (moto), needs psql and moto
#   BENCH_POSTGRES_URL [postgres://postgres@127.0.0.1:5432/test]  where a database is made
#   BENCH_INSTANCES [1]         2: two instances on PostgreSQL + S3, load spread over both
#   BENCH_HOSTILE [0]           1: the capability policy is guests/testing/hostile (as
#                               the runtime's build script built it), which loops on
#                               paths containing `loop` and answers everything else
#   BENCH_HOSTILE_CONNECTIONS [0]  N > 0: during every row, N more connections hit that
#                               loop (hs-load session-get-loop: each call spins until
#                               the guest deadline); needs BENCH_HOSTILE=1
#   BENCH_WRK [auto]            1: also measure with wrk (an independent client; must be
#                               installed), 0: don't; auto: when wrk is on the PATH. Rows
#                               "wrk: ..." for the baseline and the 1 KiB scenarios
#                               (public-get-1k, get-1k, put-1k with pre-signed PUTs).
# put-1m writes a new 1 MiB value per request: expect a few GiB in the temp dir.
# Two columns come from /proc: the server's CPU time per request (user + system over the
# warm-up and the measured seconds, divided by the requests at the measured rate over
# both) and its VmRSS when the row ends (the sum over instances).

set -euo pipefail

DURATION=${BENCH_DURATION:-10}
WARMUP=${BENCH_WARMUP:-2}
CONNECTIONS=${BENCH_CONNECTIONS:-32}
CONNECTIONS_1M=${BENCH_CONNECTIONS_1M:-8}
THREADS=${BENCH_THREADS:-}
HOSTILE=${BENCH_HOSTILE:-0}
HOSTILE_CONNECTIONS=${BENCH_HOSTILE_CONNECTIONS:-0}
SCENARIOS=${BENCH_SCENARIOS:-put-1k get-1k public-get-1k session-get-1k put-1m get-1m public-get-1m}
BASELINE_ONLY=${BENCH_BASELINE_ONLY:-0}
BACKEND=${BENCH_BACKEND:-sqlite}
INSTANCES=${BENCH_INSTANCES:-1}
ALSO=()
BENCH_NAME=bench
# shellcheck source=bench-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"

# cpu_ticks PID...: user + system clock ticks the processes used so far.
cpu_ticks() {
    local total=0 pid t
    for pid in "$@"; do
        t=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
        total=$((total + t))
    done
    echo "$total"
}

# rss_mib PID...: their VmRSS summed, in MiB.
rss_mib() {
    local total=0 pid kb
    for pid in "$@"; do
        kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
        total=$((total + kb))
    done
    awk -v kb="$total" 'BEGIN { printf "%.1f", kb / 1024 }'
}

# measure SERVER_LABEL PORT SCENARIO CONNECTIONS PID...: runs hs-load against the
# servers PID..., appends a table row.
measure() {
    local label=$1 port=$2 scenario=$3 connections=$4 line
    shift 4
    local pids=("$@") before after
    before=$(cpu_ticks "${pids[@]}")
    local args=(run --url "http://127.0.0.1:$port" --scenario "$scenario"
        --connections "$connections" --duration "$DURATION" --warmup "$WARMUP" "${ALSO[@]}")
    [[ -n $THREADS ]] && args+=(--threads "$THREADS")
    log "$label: $scenario, $connections connections, ${WARMUP}+${DURATION} s"
    local hostile=
    if [[ $HOSTILE_CONNECTIONS -gt 0 ]]; then
        # One client thread: the hostile load should cost its side little CPU.
        "$LOAD" run --url "http://127.0.0.1:$port" --scenario session-get-loop \
            --connections "$HOSTILE_CONNECTIONS" --threads 1 --warmup 0 \
            --duration $((WARMUP + DURATION + 1)) >"$TMP/hostile.out" 2>"$TMP/hostile.log" &
        hostile=$!
        sleep 0.5
    fi
    if line=$("$LOAD" "${args[@]}"); then
        after=$(cpu_ticks "${pids[@]}")
        if [[ -n $hostile ]]; then
            wait "$hostile" || true
            log "  hostile load: $(cat "$TMP/hostile.out")"
        fi
        log "  $line"
        ROWS+=("$(awk -v server="$label" -v ticks=$((after - before)) -v hz="$(getconf CLK_TCK)" \
            -v secs=$((WARMUP + DURATION)) -v rss="$(rss_mib "${pids[@]}")" '{
            for (i = 1; i <= NF; i++) {
                n = index($i, "="); k = substr($i, 1, n - 1); v = substr($i, n + 1)
                sub(/ms$/, "", v); f[k] = v
            }
            cpu = f["req/s"] > 0 ? ticks / hz / (f["req/s"] * secs) * 1e6 : 0
            printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f | %s |\n", server,
                f["scenario"], f["connections"], f["requests"], f["errors"], f["req/s"],
                f["p50"], f["p90"], f["p99"], f["max"], cpu, rss
        }' <<<"$line")")
    else
        log "  $scenario failed"
        ROWS+=("| $label | $scenario | $connections | failed | | | | | | | | |")
        FAILED=1
    fi
}

# measure_wrk LABEL PORT SCENARIO CONNECTIONS PID...: the same load from wrk (2 threads,
# --latency), on a user `hs-load wrk-script` prepared; appends a table row.
measure_wrk() {
    local label=$1 port=$2 scenario=$3 connections=$4 out script=() before after
    shift 4
    local pids=("$@")
    if [[ $scenario != static ]]; then
        "$LOAD" wrk-script --url "http://127.0.0.1:$port" --scenario "$scenario" \
            --requests 200000 --wrk-threads 2 >"$TMP/wrk-$scenario.lua"
        script=(--script "$TMP/wrk-$scenario.lua")
    fi
    log "wrk: $label: $scenario, $connections connections, ${DURATION} s"
    before=$(cpu_ticks "${pids[@]}")
    out=$(wrk --threads 2 --connections "$connections" --duration "${DURATION}s" --latency \
        "${script[@]}" "http://127.0.0.1:$port/" 2>&1) || true
    after=$(cpu_ticks "${pids[@]}")
    log "$(sed 's/^/  /' <<<"$out")"
    ROWS+=("$(awk -v server="wrk: $label" -v scenario="$scenario" -v c="$connections" \
        -v ticks=$((after - before)) -v hz="$(getconf CLK_TCK)" -v secs="$DURATION" \
        -v rss="$(rss_mib "${pids[@]}")" '
        function ms(v) {
            if (v ~ /us$/) { sub(/us$/, "", v); return v / 1000 }
            if (v ~ /ms$/) { sub(/ms$/, "", v); return v + 0 }
            if (v ~ /s$/) { sub(/s$/, "", v); return v * 1000 }
            return v
        }
        / 50% / { p50 = ms($2) } / 90% / { p90 = ms($2) } / 99% / { p99 = ms($2) }
        /Latency/ && NF >= 4 && !max { max = ms($4) }
        /requests in/ { requests = $1 }
        /Non-2xx/ { errors += $NF }
        /Socket errors/ { for (i = 3; i <= NF; i++) if ($i ~ /^[0-9]+,?$/) errors += $i }
        /Requests\/sec/ { rps = $2 }
        END {
            cpu = rps > 0 ? ticks / hz / (rps * secs) * 1e6 : 0
            printf "| %s | %s | %s | %s | %d | %s | %.3f | %.3f | %.3f | %.3f | %.1f | %s |\n",
                server, scenario, c, requests, errors, rps, p50, p90, p99, max, cpu, rss
        }' <<<"$out")")
}

WRK=${BENCH_WRK:-auto}
if [[ $WRK == auto ]]; then
    if command -v wrk >/dev/null; then WRK=1; else WRK=0; fi
fi
if [[ $WRK == 1 ]] && ! command -v wrk >/dev/null; then
    log "BENCH_WRK=1 but wrk is not installed (Debian: apt install wrk)"
    exit 2
fi

# ---- build ----
packages=(-p hs-loadgen)
[[ $BASELINE_ONLY == 1 || -n ${BENCH_HOMESERVER:-} ]] || packages+=(-p homeserver)
log "building release binaries (${packages[*]})"
(cd "$ROOT" && cargo build --release "${packages[@]}" >&2)

# ---- baseline ----
for body in 1024 1048576; do
    free_port
    port=$PORT
    "$LOAD" baseline --listen "127.0.0.1:$port" --body-bytes "$body" 2>"$TMP/baseline.log" &
    pid=$!
    PIDS+=("$pid")
    wait_port "$pid" "$port" "$TMP/baseline.log"
    if [[ $body == 1024 ]]; then
        measure "baseline (1 KiB body)" "$port" static "$CONNECTIONS" "$pid"
        [[ $WRK == 1 ]] && measure_wrk "baseline (1 KiB body)" "$port" static "$CONNECTIONS" "$pid"
    else
        measure "baseline (1 MiB body)" "$port" static "$CONNECTIONS_1M" "$pid"
    fi
    stop "$pid"
done

# ---- backends ----
# BENCH_BACKEND=postgres: a fresh database on $BENCH_POSTGRES_URL's server and a bucket
# on a moto_server started here (target/tools/moto, as .ci/run installs it).
DB_URL=sqlite://$TMP/hs.db
BLOBS_URL=file://$TMP/blobs
S3_ENV=()
if [[ $BACKEND == postgres ]]; then
    pg_admin=${BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}
    db=hs_bench_$$
    psql "$pg_admin" -qc "CREATE DATABASE $db" >&2
    trap 'psql "$pg_admin" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1; cleanup' EXIT
    DB_URL=${pg_admin%/*}/$db
    moto=${BENCH_MOTO:-$ROOT/target/tools/moto/bin/moto_server}
    free_port
    s3_port=$PORT
    "$moto" -H 127.0.0.1 -p "$s3_port" >"$TMP/moto.log" 2>&1 &
    PIDS+=("$!")
    wait_port "$!" "$s3_port" "$TMP/moto.log"
    curl -fsS -X PUT "http://127.0.0.1:$s3_port/hs-bench" >/dev/null
    BLOBS_URL=s3://hs-bench
    S3_ENV=(HOMESERVER__S3__ENDPOINT=http://127.0.0.1:$s3_port HOMESERVER__S3__REGION=us-east-1
        HOMESERVER__S3__PATH_STYLE=true HOMESERVER__S3__ALLOW_HTTP=true
        HOMESERVER__S3__ACCESS_KEY_ID=bench HOMESERVER__S3__SECRET_ACCESS_KEY=bench)
    log "PostgreSQL database $db, moto on 127.0.0.1:$s3_port"
elif [[ $INSTANCES != 1 ]]; then
    log "BENCH_INSTANCES=$INSTANCES needs BENCH_BACKEND=postgres (SQLite is one process's)"
    exit 2
fi

# start_homeserver N: instance N on a free port (sets PORT to it).
start_homeserver() {
    local n=$1 port admin_port metrics_port pid
    free_port; port=$PORT
    free_port; admin_port=$PORT
    free_port; metrics_port=$PORT
    log "homeserver $n on 127.0.0.1:$port ($DB_URL, $BLOBS_URL), data in $TMP"
    (
        cd "$TMP"
        export RUST_LOG=$SERVER_LOG
        export HOMESERVER__HTTP__LISTEN=127.0.0.1:$port
        # Its other listeners get free ports too, so parallel test servers don't collide.
        # The server refuses unknown config keys, so only sections its defaults have.
        if has_section admin; then
            export HOMESERVER__ADMIN__LISTEN=127.0.0.1:$admin_port
            export HOMESERVER__ADMIN__PASSWORD=bench-$RANDOM$RANDOM$RANDOM
        fi
        if has_section metrics; then
            export HOMESERVER__METRICS__LISTEN=127.0.0.1:$metrics_port
        fi
        export HOMESERVER__STORAGE__DATABASE_URL=$DB_URL
        export HOMESERVER__STORAGE__BLOBS=$BLOBS_URL
        export HOMESERVER__STORAGE__QUOTA_BYTES=0
        export HOMESERVER__KEYS__SECRET_KEY_FILE=$TMP/server.key
        export HOMESERVER__POLICIES__DIR=$TMP/policies
        export HOMESERVER__SIGNUP__MODE=open
        if has_section rate_limit; then
            export HOMESERVER__RATE_LIMIT__ENABLED=false
        fi
        lift_per_ip_limits
        [[ ${#S3_ENV[@]} -eq 0 ]] || export "${S3_ENV[@]}"
        exec "$HOMESERVER"
    ) >"$TMP/homeserver-$n.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_port "$pid" "$port" "$TMP/homeserver-$n.log"
    PORT=$port
    LAST_PID=$pid
}

# ---- homeserver ----
if [[ $BASELINE_ONLY != 1 ]]; then
    mkdir -p "$TMP/policies" "$TMP/blobs"
    # The guests the repository ships (a copy: the server may write next to them).
    if [[ -d $POLICIES_SRC ]]; then
        cp -R "$POLICIES_SRC/." "$TMP/policies/"
    fi
    if [[ $HOSTILE == 1 ]]; then
        cp "$TARGET_DIR/wasm-guests/wasm32-wasip2/release/hostile.wasm" "$TMP/policies/"
        sed -i 's/^module = "capability-policy.wasm"/module = "hostile.wasm"/' "$TMP/policies/policies.toml"
        grep -q '^module = "hostile.wasm"' "$TMP/policies/policies.toml" ||
            { log "could not make hostile.wasm the capability policy"; exit 2; }
        label_extra=", hostile policy"
        [[ $HOSTILE_CONNECTIONS -gt 0 ]] && label_extra+=" + $HOSTILE_CONNECTIONS looping connections"
    fi
    server_pids=()
    ALSO=()
    for n in $(seq 1 "$INSTANCES"); do
        start_homeserver "$n"
        server_pids+=("$LAST_PID")
        if [[ $n == 1 ]]; then port=$PORT; else ALSO+=(--also-url "http://127.0.0.1:$PORT"); fi
    done
    label="homeserver ($BACKEND"
    [[ $BACKEND == postgres ]] && label+=" + S3 (moto)"
    [[ $INSTANCES != 1 ]] && label+=", $INSTANCES instances"
    label+="${label_extra:-})"
    for scenario in $SCENARIOS; do
        if [[ $scenario == *-1m || $scenario == *-10m ]]; then
            measure "$label" "$port" "$scenario" "$CONNECTIONS_1M" "${server_pids[@]}"
        else
            measure "$label" "$port" "$scenario" "$CONNECTIONS" "${server_pids[@]}"
        fi
        for pid in "${server_pids[@]}"; do
            if ! kill -0 "$pid" 2>/dev/null; then
                log "a homeserver died; log tails:"
                tail -n 30 "$TMP"/homeserver-*.log >&2
                FAILED=1
                break 2
            fi
        done
    done
    if [[ $WRK == 1 && $INSTANCES == 1 ]]; then
        for scenario in public-get-1k get-1k put-1k; do
            [[ " $SCENARIOS " == *" $scenario "* ]] || continue
            measure_wrk "$label" "$port" "$scenario" "$CONNECTIONS" "${server_pids[@]}"
        done
    fi
    for pid in "${server_pids[@]}"; do stop "$pid"; done
fi

# ---- report ----
cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')
cat <<EOF
Machine: $(nproc) cores, ${cpu:-unknown CPU}, $(uname -sr); $(rustc -V)
Load: hs-load on the same machine, ${WARMUP} s warm-up then ${DURATION} s measured per row; \
threads: ${THREADS:-one per core}; latencies in ms. Date: $(date -u +%Y-%m-%dT%H:%MZ).

| server | scenario | connections | requests | errors | req/s | p50 | p90 | p99 | max | server CPU µs/req | server RSS MiB |
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
EOF
printf '%s\n' "${ROWS[@]}"
exit "$FAILED"
