#!/usr/bin/env bash
# Writes the upgrade fixtures of store format 5 into tests/fixtures/format5/ with the code of
# the current checkout (issue 21, "upgrades without data loss"):
#   data/            a node's data directory (every key kind, events with dedup marks, synced
#                    with a peer), closed cleanly
#   snapshot.tmsnap  Node::snapshot of that state
#   frames/*.bin     one encoded protocol message of each kind (codec::encode of proto::Message)
#   WRITTEN_BY       the commit and store format that wrote them
# The writer is the ignored test `write_format5_fixtures` of tests/node/upgrade.rs; the checks
# (`cargo test --test node upgrade`) are in the same file, with every expected value written down.
#
# The committed fixtures were written by src/ at commit 0c81513 (store format 5; the writer
# itself is in the commit that added this script). They are the record of what format 5 IS:
# do not rewrite them after the storage format changed — a new format gets a new directory
# (and a copy of this script pointing at a build of that format).
#
# Usage: scripts/make-fixtures.sh            (from anywhere inside the repository)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "${root}"
dest="tests/fixtures/format5"

# The store format of this checkout must be the one the directory is named after.
format="$(sed -n 's/^pub(crate) const STORE_FORMAT: u32 = \([0-9]*\);$/\1/p' src/store/tables.rs)"
if [[ "${format}" != "5" ]]; then
  echo "make-fixtures: this checkout writes store format '${format}', not 5; refusing to overwrite ${dest}" >&2
  exit 1
fi

scratch="$(mktemp -d)"
trap 'rm -rf "${scratch}"' EXIT
out="${scratch}/format5"

TIDEMARK_WRITE_FIXTURES="${out}" cargo test --quiet --test node -- --ignored --exact upgrade::write_format5_fixtures

for f in data/tidemark.redb snapshot.tmsnap frames/hello.bin; do
  if [[ ! -s "${out}/${f}" ]]; then
    echo "make-fixtures: the writer did not write ${f}" >&2
    exit 1
  fi
done

commit="$(git rev-parse HEAD)"
if [[ -n "$(git status --porcelain -- src crdts Cargo.toml Cargo.lock)" ]]; then
  commit="${commit} (with uncommitted changes under src/, crdts/ or the manifests)"
fi
printf 'commit %s\nstore format %s\n' "${commit}" "${format}" > "${out}/WRITTEN_BY"

rm -rf "${dest}"
mkdir -p "$(dirname "${dest}")"
cp -R "${out}" "${dest}"
echo "make-fixtures: wrote ${dest}:"
find "${dest}" -type f -printf '%10s  %p\n' | sort -k2
