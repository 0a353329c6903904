#!/usr/bin/env bash
# Checks a rolling upgrade from the build before the write-ahead log (commit 0c81513, store
# format 5) to this checkout: builds 0c81513's `tidemark` binary once into a cache directory,
# then runs the daemon test `rolling_upgrade` with TIDEMARK_OLD_BIN pointing at it. The test
# starts three daemons (QUIC + mTLS on loopback) on the old binary, writes through HTTP the
# whole time, replaces the nodes one at a time with this checkout's binary on the same data
# directories (a clean stop, a SIGKILL under writes, a clean stop of the seed) and checks that
# every acknowledged write is on every node, the values converged, every node kept its replica
# id and its data, and every data directory is store format 6.
#
# The old build takes several minutes the first time (15 on a loaded 2-core machine; it is
# cached afterwards), which is why CI does not run this; the test skips itself without
# TIDEMARK_OLD_BIN.
#
# Usage: scripts/rolling-upgrade.sh          (from anywhere inside the repository)
# Environment: OLD_COMMIT (default 0c81513), OLD_CACHE (default target/old-<commit>),
#              CARGO_TARGET_DIR (as for cargo; the old build uses a target dir of its own).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "${root}"
commit="${OLD_COMMIT:-0c81513}"
cache="${OLD_CACHE:-${root}/target/old-${commit}}"
bin="${cache}/tidemark"

if [[ ! -x "${bin}" ]]; then
  if ! git cat-file -e "${commit}^{commit}" 2>/dev/null; then
    echo "rolling-upgrade: commit ${commit} is not in this repository (a shallow clone? git fetch --unshallow)" >&2
    exit 1
  fi
  mkdir -p "${cache}"
  src="${cache}/src"
  rm -rf "${src}"
  mkdir -p "${src}"
  echo "rolling-upgrade: building tidemark at ${commit} into ${cache} (once; several minutes)" >&2
  git archive "${commit}" | tar -x -C "${src}"
  (cd "${src}" && CARGO_TARGET_DIR="${cache}/target" cargo build --locked --release --bin tidemark)
  cp "${cache}/target/release/tidemark" "${bin}.tmp"
  mv "${bin}.tmp" "${bin}"
  rm -rf "${src}"
fi
echo "rolling-upgrade: old binary ${bin} ($("${bin}" --version))" >&2

TIDEMARK_OLD_BIN="${bin}" cargo test --test daemon -- --exact \
  rolling_upgrade::a_rolling_upgrade_from_format_5_keeps_every_write_and_every_node --nocapture
