# Shared set-up of the bench scripts (sourced, not run): paths of the release binaries,
# a throwaway directory, process bookkeeping with cleanup on exit, and port helpers.
# The sourcing script sets BENCH_NAME (log prefix, temp dir name) first.

SERVER_LOG=${BENCH_SERVER_LOG:-warn}
KEEP_TMP=${BENCH_KEEP_TMP:-0}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
LOAD=$TARGET_DIR/release/hs-load
# BENCH_HOMESERVER: a homeserver binary of your own instead of this checkout's release
# build (an A/B of two builds: copy one aside, change the code, run both). bench.sh only:
# the other scripts build and run the checkout's. The settings written for it are this
# checkout's (config.default.toml): a binary of another revision may refuse some.
HOMESERVER=${BENCH_HOMESERVER:-$TARGET_DIR/release/homeserver}
if [[ -n ${BENCH_HOMESERVER:-} ]]; then
    # The servers start in the temp dir: the path must not be relative to here.
    HOMESERVER=$(realpath -e -- "$BENCH_HOMESERVER") && [[ -x $HOMESERVER ]] ||
        { echo "BENCH_HOMESERVER=$BENCH_HOMESERVER is not an executable file" >&2; exit 2; }
fi
POLICIES_SRC=${BENCH_POLICIES_DIR:-$ROOT/policies}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/hs-$BENCH_NAME.XXXXXX")
PIDS=()
USED_PORTS=" "
PORT=
ROWS=()
FAILED=0

log() { echo "$BENCH_NAME: $*" >&2; }

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ $KEEP_TMP == 1 ]]; then
        log "kept $TMP"
    else
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Stops one process started here (by its id) and forgets it.
stop() {
    local pid=$1 keep=() p
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for p in "${PIDS[@]}"; do
        [[ $p == "$pid" ]] || keep+=("$p")
    done
    PIDS=("${keep[@]}")
}

# Whether the homeserver's embedded defaults have a `[NAME]` section.
has_section() { grep -q "^\[$1\]" "$ROOT/host/server/config.default.toml" 2>/dev/null; }
# Whether the server's defaults have the key $1 (any section), e.g. max_streams_per_ip.
has_key() { grep -q "^$1 = " "$ROOT/host/server/config.default.toml" 2>/dev/null; }
# Every load comes from loopback: lift the per-address connection and stream caps.
lift_per_ip_limits() {
    if has_key max_connections_per_ip; then export HOMESERVER__HTTP__MAX_CONNECTIONS_PER_IP=0; fi
    if has_key max_streams_per_ip; then export HOMESERVER__HTTP__MAX_STREAMS_PER_IP=0; fi
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Sets PORT to a loopback port nobody listens on and not handed out before by this
# script (a variable, not output: a $(...) subshell would forget USED_PORTS).
free_port() {
    local port
    for _ in $(seq 1 200); do
        port=$((20000 + RANDOM % 12000)) # below the usual ephemeral range (32768-)
        if [[ $USED_PORTS != *" $port "* ]] && ! port_open "$port"; then
            USED_PORTS+="$port "
            PORT=$port
            return 0
        fi
    done
    log "no free port found"
    return 1
}

# Waits until $2 accepts connections, failing early if process $1 died.
wait_port() {
    local pid=$1 port=$2 log_file=${3:-}
    for _ in $(seq 1 300); do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "process $pid exited before listening on $port"
            [[ -n $log_file ]] && tail -n 30 "$log_file" >&2
            return 1
        fi
        port_open "$port" && return 0
        sleep 0.1
    done
    log "nothing listens on $port after 30 s"
    [[ -n $log_file ]] && tail -n 30 "$log_file" >&2
    return 1
}
