# Developer recipes. `just` alone lists them. (Users need only cargo; see README.md.)

# List the recipes.
default:
    @just --list

# Run the homeserver on the embedded default (SQLite, local blobs, ./policies).
run:
    cargo run --release -p homeserver

# Run the whole test suite (what CI runs, minus lint).
test:
    scripts/test

# Formatting and lint checks, as in CI.
lint:
    cargo fmt --all --check
    cargo clippy --workspace --all-targets -- -D warnings

# Format everything.
fmt:
    cargo fmt --all

# Everything CI does.
ci:
    bash .ci/run

# Benchmarks: homeserver vs a raw-hyper baseline (figures for docs/BENCHMARKS.md).
bench:
    host/loadgen/bench.sh
