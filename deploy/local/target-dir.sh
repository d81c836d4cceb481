#!/usr/bin/env bash
# Prints the directory cargo builds into for this workspace: $CARGO_TARGET_DIR, a
# build.target-dir setting, or target/ (as `cargo metadata` reports it), so that scripts
# find the binaries where cargo put them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
