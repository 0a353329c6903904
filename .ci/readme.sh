#!/usr/bin/env bash
# Follow README.md top to bottom, as one reader in one sitting, and check what it shows:
#   bash .ci/readme.sh [TIDEMARK_BIN]     (or env TIDEMARK_BIN; default target/debug/tidemark)
# Runs every ```sh block in order in one fresh scratch directory with `tidemark` on PATH being the
# given binary; `cargo run [--release] -- serve ...` runs that binary (`tidemark serve ...`);
# `cargo test`, `cargo run --example` and `cargo install` are skipped (CI runs them elsewhere).
# Nodes, `tidemark watch` and `curl -N` run in the background and are stopped (SIGINT, as Ctrl-C)
# at a "# Stop ... (Ctrl-C)" step, at the end of their block (watchers) or at the end; a comment
# line directly below a command is its shown output and is compared (JSON-aware, `…` = anything).
# The full rules are in the header of .ci/readme_check.py. Exit status 1 on any failure.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-${TIDEMARK_BIN:-target/debug/tidemark}}"
if ! command -v python3 >/dev/null 2>&1; then
  echo "readme: python3 is needed" >&2
  exit 2
fi
# A hard stop around the runner's own deadline; the runner stops what it started on SIGTERM.
exec timeout --signal=TERM --kill-after=20 180 python3 "$here/readme_check.py" "$bin"
