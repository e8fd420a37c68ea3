#!/usr/bin/env bash
# Regenerates ofi-sys/src/bindings.rs from the installed libfabric headers, or with --check
# fails if the committed file differs from what they give (CI runs that where the headers are
# installed). Needs: apt-get install libfabric-dev libclang-dev pkg-config
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec cargo run --quiet --release --locked --manifest-path "$here/generate/Cargo.toml" -- "$@"
