#!/usr/bin/env bash
# Regenerates the store fixtures of a release: builds that release's
# csi-node from its commit, runs it on real loop devices (as root) to make
# volumes of every kind (test/releases), and writes the store it left into
# pkg/state/testdata/releases/<tag>/, which pkg/state's tests read with the
# current code (and the snapshot files' attributes, which pkg/devices'
# tests read). docs/releasing.md runs it for every release.
#
#   hack/store-fixtures.sh [<tag> [<commit>]]
#
# Without arguments it takes the release hack/previous-release names;
# with a tag alone, the commit the tag points at.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -eq 0 ]; then
  lines=$(grep -v -e '^#' -e '^[[:space:]]*$' "$root/hack/previous-release")
  if [ "$(printf '%s\n' "$lines" | wc -l)" != 1 ]; then
    echo "store-fixtures: hack/previous-release must name one release" >&2; exit 2
  fi
  read -r tag commit <<<"$lines"
else
  tag=$1
  commit=${2:-}
fi
# The tag names a directory and goes into the linker's flags, the commit
# into git's arguments: both are checked before either is used.
if ! [[ $tag =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "store-fixtures: $tag is not a release tag (vMAJOR.MINOR.PATCH)" >&2; exit 2
fi
if [ -z "$commit" ]; then
  commit=$(git -C "$root" rev-parse --verify --end-of-options "refs/tags/$tag^{commit}")
fi
if ! [[ $commit =~ ^[0-9a-f]{40}$ ]]; then
  echo "store-fixtures: $commit is not a full commit (40 lower-case hex digits)" >&2; exit 2
fi
# A release is cut from main: its commit is in this checkout's history.
if ! git -C "$root" merge-base --is-ancestor "$commit" HEAD; then
  echo "store-fixtures: $commit is not in the history of HEAD" >&2; exit 2
fi
if tagged=$(git -C "$root" rev-parse --verify -q "refs/tags/$tag^{commit}") && [ "$tagged" != "$commit" ]; then
  echo "store-fixtures: tag $tag is $tagged, not $commit" >&2; exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$root" archive "$commit" | tar -x -C "$work"
(cd "$work" && CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=$tag" -o "$work/csi-node" ./cmd/csi-node)
"$work/csi-node" --version
out=$root/pkg/state/testdata/releases/$tag
# A release's fixtures are what it wrote: made once, never replaced by
# accident (FORCE=1 replaces them, e.g. when the generator asks for more).
if [ -e "$out" ] && [ "${FORCE:-}" != 1 ]; then
  echo "store-fixtures: $out exists; FORCE=1 replaces it" >&2; exit 2
fi
new=$work/fixtures
mkdir -p "$new"
(cd "$root" && CONVERGE_BINARY="$work/csi-node" CONVERGE_FIXTURES_OUT="$new" CONVERGE_FIXTURES_RELEASE="$tag" \
  go test -count=1 -v -run '^TestWriteStoreFixtures$' ./test/releases)
cat >"$new/README.md" <<README
# Store fixtures of $tag

The state store (state.db and its log state.db-wal, gzipped) that csi-node
$tag, built from commit $commit, left in each directory named in
manifest.json, which also lists what it was asked to hold and the size and
extended attributes of each snapshot file it made. Made by
\`hack/store-fixtures.sh $tag $commit\` (as root: it uses loop devices and
mounts); test/releases says what it asks for. Do not edit: pkg/state's
TestReleaseFixtures and pkg/devices' TestReleaseSnapshotFixtures read them
with the current code.
README
rm -rf "$out"
mkdir -p "$(dirname "$out")"
cp -r "$new" "$out"
echo "store-fixtures: wrote $out"
