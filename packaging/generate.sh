#!/bin/sh
# Writes what the packages and archives carry besides the binary and the
# checked-in files, into build/docs/ (GoReleaser's before hook runs it):
#
#   man/fluksio-worker.1.gz        the manual page, from `fluksio-worker man`
#   completions/fluksio-worker.bash, _fluksio-worker, fluksio-worker.fish
#                                  from `fluksio-worker completion SHELL`
#   changelog.yml                  this version's entry, in the chglog format
#                                  nFPM turns into the deb's changelog and the
#                                  rpm's %changelog
#
# The manual and completions come from a binary built for this machine,
# since the release targets may not run here.
#
# Usage: generate.sh VERSION
# The commit's time dates the manual and the changelog, so the same commit
# gives the same files; FLUKSIO_MAINTAINER (.goreleaser.yaml's env) signs
# the changelog. The commit, its time and the previous tag are asked of git
# here: GoReleaser's own (.FullCommit, .CommitTimestamp) are placeholders in
# a snapshot of a checkout without a remote, as CI's can be.
set -eu
VERSION=$1
MAINTAINER=$FLUKSIO_MAINTAINER
COMMIT=$(git rev-parse HEAD)
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct HEAD)
export SOURCE_DATE_EPOCH
# The release before this commit: for a tagged release, the tag before its
# own; for a snapshot, the latest. Empty when there is none.
PREVIOUS_TAG=$(git describe --tags --abbrev=0 HEAD^ 2>/dev/null || true)

out=build/docs
rm -rf "$out"
mkdir -p "$out/man" "$out/completions"

bin="$out/fluksio-worker"
CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=$VERSION" -o "$bin" .
# -n: no name or time in the gzip header; -9: lintian wants the best.
"$bin" man | gzip -9n >"$out/man/fluksio-worker.1.gz"
"$bin" completion bash >"$out/completions/fluksio-worker.bash"
"$bin" completion zsh >"$out/completions/_fluksio-worker"
"$bin" completion fish >"$out/completions/fluksio-worker.fish"
rm "$bin"

# The changelog: this version and the commits since the previous release.
# Its version carries the package release (-1), as the deb and rpm
# versions do, so the linters find it coherent.
date=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ 2>/dev/null ||
	date -u -r "$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
quote() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/''/g")"; }
changes=
if [ -n "$PREVIOUS_TAG" ]; then
	changes=$(git log --no-merges --format='%H %s' "$PREVIOUS_TAG..$COMMIT")
fi
[ -n "$changes" ] || changes="$COMMIT Packaged from commit $COMMIT."
{
	echo "- semver: $(quote "$VERSION-1")"
	echo "  date: $date"
	echo "  packager: $(quote "$MAINTAINER")"
	echo "  deb:"
	echo "    urgency: medium"
	echo "    distributions: [stable]"
	echo "  changes:"
	printf '%s\n' "$changes" | while read -r hash subject; do
		echo "    - commit: $hash"
		echo "      note: $(quote "$subject")"
	done
} >"$out/changelog.yml"
