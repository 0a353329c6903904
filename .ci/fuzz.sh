#!/usr/bin/env bash
# Coverage-guided fuzzing of every decoder of untrusted bytes (fuzz/, cargo-fuzz layout):
# frames, deltas, state chunks, causal contexts, dedup marks, JSON ops, HTTP request parsers,
# write-ahead log frames and redo records. Each target checks
# "decode(b) = v implies encode(v) = b", never panics, and the lattice laws on what it admits.
#
# Runs on the stable toolchain: `--sanitizer none` needs no nightly-only flag (the coverage
# instrumentation cargo-fuzz adds is stable `-C` / `-Cllvm-args`). Installs cargo-fuzz if missing.
#
#   bash .ci/fuzz.sh            # CI: each target for FUZZ_SECONDS (default 8 s; 6 targets < 90 s)
#   SOAK=1 bash .ci/fuzz.sh     # long runs: FUZZ_SECONDS defaults to 3600 per target
#   bash .ci/fuzz.sh delta      # only the named targets
#
# Starts from the committed seed corpus (fuzz/corpus/<target>/seed-*); new corpus entries found
# are kept in the working tree (fuzz/corpus/<target>/, git-ignored unless named seed-*); a crash
# leaves its input in fuzz/artifacts/<target>/ and fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

if [ "${SOAK:-0}" = "1" ]; then
  seconds="${FUZZ_SECONDS:-3600}"
else
  seconds="${FUZZ_SECONDS:-8}"
fi
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  targets=(frame delta chunk context marks json_ops http_requests wal)
fi

host="$(rustc -vV | sed -n 's/^host: //p')"
# The instrumented build is not shareable with normal builds: keep it in the fuzz crate's own
# target dir, whatever CARGO_TARGET_DIR the caller uses.
unset CARGO_TARGET_DIR

echo "== fuzz build"
cargo fuzz build --sanitizer none --target "$host"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for t in "${targets[@]}"; do
  echo "== fuzz $t (${seconds} s)"
  mkdir -p "fuzz/corpus/$t"
  extra=()
  # The HTTP parsers must cost a small multiple of their input: any single allocation over
  # 64 MiB (a thousand times the longest input) is a failure.
  if [ "$t" = "http_requests" ]; then extra=(-malloc_limit_mb=64); fi
  if ! cargo fuzz run --sanitizer none --target "$host" "$t" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 "${extra[@]}" \
    >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz target $t failed; the input is in fuzz/artifacts/$t/" >&2
    exit 1
  fi
  grep -E '^stat::(number_of_executed_units|peak_rss_mb)' "$log" || true
done
echo "== fuzz ok"
