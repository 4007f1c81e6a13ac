#!/usr/bin/env bash
# The project's test command: formatting, lints, every test (under nextest's
# per-test timeout, so a hung glommio test fails instead of stalling), doctests.
# Long soak/fuzz runs are opt-in: SPOOL_LONG=1 scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

profile=default
if [[ "${CI:-}" == "true" ]]; then profile=ci; fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== clippy of the failpoint build (spool-broker --features failpoints)"
cargo clippy --locked -p spool-broker --features failpoints --lib --bins -- -D warnings
echo "== build the binaries the end-to-end tests start (spoold, spool, spoold-failpoints)"
cargo build --locked -p spool-broker --bin spoold -p spool-client --bin spool
cargo build --locked -p spool-broker --features failpoints --bin spoold-failpoints
echo "== build the release binaries the README's commands run (tests/tests/readme.rs starts them)"
cargo build --locked --release -p spool-broker --bin spoold -p spool-client --bin spool
# The tests start exactly these binaries instead of running cargo again from
# inside the test processes (a nested cargo may see another toolchain path
# and rebuild everything, which once quadrupled the suite's time).
target_dir="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
export SPOOL_E2E_SPOOLD="${target_dir}/debug/spoold"
export SPOOL_E2E_SPOOL="${target_dir}/debug/spool"
export SPOOL_E2E_SPOOLD_FAILPOINTS="${target_dir}/debug/spoold-failpoints"
export SPOOL_E2E_RELEASE_DIR="${target_dir}/release"
echo "== cargo nextest"
cargo nextest run --workspace --locked --profile "$profile"
echo "== doctests"
cargo test --workspace --doc --locked
