#!/usr/bin/env bash
# warpsock's test command (README "Run the tests"). Installs what the tests need,
# then runs every check: format, lints, unit + integration tests, and each
# scripts/test-*.sh suite (fuzz smoke run, preload programs, interop, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

# tshark validates our wire bytes (crates/warpsock-proto/tests/tshark.rs).
# Everything the cargo tests themselves use (the script suites install their own):
# tshark (wire validation), the figures font, namespace tools.
scripts/ensure-pkgs.sh build-essential pkg-config tshark fonts-dejavu-core iproute2 nftables libibverbs-dev librdmacm-dev
# The CLI's apps case runs the apps suite's programs when they are installed:
# install all of them, so a machine never holds a partial set (GStreamer
# without its plugins fails the RTP cases).
. scripts/lib/apps-pkgs.sh
scripts/ensure-pkgs.sh "${APPS_PKGS[@]}"
export WARPSOCK_REQUIRE_RDMA_HEADERS=1
export WARPSOCK_REQUIRE_TSHARK=1
# The siw VM cases of test-verbs.sh fail (not skip) without the VM tool.
export WARPSOCK_REQUIRE_SIW=1

T0=$SECONDS
step() { printf '\n=== %s (at %ds) ===\n' "$*" "$((SECONDS - T0))"; }

step "rustfmt"
cargo fmt --all -- --check
step "clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
step "rustdoc (library crates; broken or private links are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --lib --no-deps --quiet
step "cargo test (workspace)"
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
cargo test --workspace --quiet 2>&1 | tee "$LOG"
for suite in scripts/test-*.sh; do
    [ -e "$suite" ] || continue
    step "$suite"
    bash "$suite"
done
step "all test suites passed in $((SECONDS - T0)) s"
# One closing line for the whole run: the Rust tests counted by cargo, plus
# one per script suite that passed.
suites=$(ls scripts/test-*.sh 2>/dev/null | wc -l)
awk -v suites="$suites" '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed\n", p + suites, f }' "$LOG"
