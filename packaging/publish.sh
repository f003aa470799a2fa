#!/bin/sh
# Publishes a release into the served package repository, keeping every
# version published before it:
#
#   goreleaser release --clean
#   FLUKSIO_SIGNING_KEY=FINGERPRINT sh packaging/publish.sh dist packages-host:/srv/packages
#
# DIST is the release's dist/; DEST is the served tree, as rsync names it
# (host:/path, or a local directory). The script
#   1. copies DEST down into a directory of its own (not under dist/, which
#      the next `goreleaser release --clean` empties);
#   2. adds DIST's packages and signs the indexes there (repository.sh),
#      which refuses a published version rebuilt with other bytes;
#   3. checks that the new indexes still list every package the published
#      ones listed, each present;
#   4. uploads: the packages first, then the indexes, then the signed files
#      that name them, so no client reads an index naming a file not yet
#      there. Nothing on DEST is deleted (old index files a client may be
#      reading stay; they are small).
# Nothing is uploaded unless every step before succeeded.
#
# The first release has nothing to copy down: say so with --first, which
# refuses a DEST that already holds a repository. Without it, a DEST with
# no repository is refused: a mistyped DEST would otherwise publish a
# repository listing one release.
#
# FLUKSIO_SIGNING_KEY and GNUPGHOME as for repository.sh. Debian packages:
# rsync, and repository.sh's.
set -eu

die() {
	printf 'publish.sh: %s\n' "$*" >&2
	exit 1
}

usage="usage: FLUKSIO_SIGNING_KEY=FINGERPRINT sh packaging/publish.sh [--first] DIST DEST"
first=
if [ "${1:-}" = --first ]; then
	first=1
	shift
fi
[ $# -eq 2 ] || die "$usage"
command -v rsync >/dev/null 2>&1 || die "rsync is missing (Debian: apt-get install rsync)"
here=$(cd "$(dirname "$0")" && pwd)
dist=$1
dest=${2%/}
[ -d "$dist" ] || die "no release directory $dist: run goreleaser release first"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/tree

# listed TREE prints, sorted, the package files TREE's indexes name
# (relative to TREE): apt's Packages of each architecture, dnf's primary
# metadata.
listed() {
	for packages in "$1"/deb/dists/stable/main/binary-*/Packages; do
		[ -e "$packages" ] || continue
		sed -n 's|^Filename: |deb/|p' "$packages"
	done >"$work/listed"
	if [ -e "$1/rpm/repodata/repomd.xml" ]; then
		primary=$(awk '/<data type="primary">/ { p = 1 }
			p && /<location href=/ { sub(/.*<location href="/, ""); sub(/".*/, ""); print; exit }' "$1/rpm/repodata/repomd.xml")
		case $primary in
		*.gz) ;;
		*) die "cannot read the primary metadata $1/rpm/repodata/repomd.xml names (${primary:-none}): only .gz is read here" ;;
		esac
		gzip -dc "$1/rpm/$primary" | grep -o '<location href="[^"]*"' | sed 's|^<location href="|rpm/|; s|"$||' >>"$work/listed"
	fi
	sort -u "$work/listed"
}

if rsync -a "$dest/" "$stage/" 2>"$work/err"; then
	pulled=1
else
	pulled=
fi
published=
[ -e "$stage/deb/dists/stable/Release" ] && published=1
if [ -n "$first" ]; then
	[ -z "$published" ] || die "$dest already holds a repository: --first is for the first release only; run again without it"
elif [ -z "$pulled" ]; then
	die "could not copy $dest down: $(cat "$work/err") (for the first release, pass --first)"
elif [ -z "$published" ]; then
	die "$dest holds no repository (no deb/dists/stable/Release): check DEST; for the first release, pass --first"
fi

before=$(listed "$stage")
sh "$here/repository.sh" "$dist" "$stage"
after=$(listed "$stage")

# Every package listed before is listed still, and every listed file is
# there to be fetched.
lost=$(printf '%s\n' "$before" | while read -r f; do
	[ -z "$f" ] || printf '%s\n' "$after" | grep -qxF "$f" || printf ' %s' "$f"
done)
[ -z "$lost" ] || die "the new indexes no longer list:$lost. Nothing was uploaded."
missing=$(printf '%s\n' "$after" | while read -r f; do
	[ -z "$f" ] || [ -e "$stage/$f" ] || printf ' %s' "$f"
done)
[ -z "$missing" ] || die "the new indexes name files that are not there:$missing. Nothing was uploaded."

# A package is never replaced (repository.sh refuses), so rsync's quick
# check, size and modification time, is right for the pool. It is not for
# the rest: an index rewritten within the second DEST's copy was written,
# at the same size (a Release naming a Packages.gz of 845 bytes where the
# old one named 645), looks unchanged to rsync, which compares whole
# seconds; DEST would keep the old signed Release over the new indexes,
# and apt would refuse them. So everything but the pool is compared by
# its contents (--checksum): a few small files.
pool="--exclude /deb/pool/ --exclude /rpm/packages/"
rsync -a --exclude /deb/dists/ --exclude /rpm/repodata/ "$stage/" "$dest/"
rsync -a --checksum $pool --exclude /deb/dists/stable/InRelease --exclude /deb/dists/stable/Release \
	--exclude /deb/dists/stable/Release.gpg --exclude /rpm/repodata/repomd.xml \
	--exclude /rpm/repodata/repomd.xml.asc "$stage/" "$dest/"
rsync -a --checksum $pool "$stage/" "$dest/"
printf 'publish.sh: %s lists %s packages\n' "$dest" "$(printf '%s\n' "$after" | grep -c .)"
