#!/bin/sh
# Publishes a release's packages into the signed apt and dnf/yum
# repositories that packaging/install.sh installs from.
#
#   FLUKSIO_SIGNING_KEY=FINGERPRINT sh packaging/repository.sh DIST REPO
#
# DIST is GoReleaser's dist/ (its *.deb and *.rpm are taken); REPO is the
# repository's tree, served as is over HTTPS. Run it on the tree already
# published (synced down first) to add a release: the packages of earlier
# releases stay, so `apt install fluksio-worker=VERSION` can go back. A
# package already published is never replaced by different bytes.
#
# What REPO holds afterwards:
#   fluksio-worker.asc     the public key (install.sh puts it where apt
#                          and dnf look); install.sh
#   deb/pool/main/f/fluksio-worker/*.deb
#   deb/dists/stable/main/binary-{amd64,arm64}/Packages{,.gz}
#   deb/dists/stable/{Release,InRelease,Release.gpg}  signed
#   rpm/packages/*.rpm     each signed (rpmsign)
#   rpm/repodata/repomd.xml, repomd.xml.asc           signed
#
# The key is gpg's (GNUPGHOME is honoured): FLUKSIO_SIGNING_KEY names it,
# by fingerprint. It must be the key the install.sh beside this script
# trusts (its release_key=): a repository signed with another would be
# refused by the install.sh published in it, so the script refuses first.
# Debian packages: apt-utils (apt-ftparchive), gnupg, createrepo-c, rpm
# (rpmsign).
#
# A release is published with packaging/publish.sh, which runs this on a
# copy of the published tree and uploads the result.
set -eu

die() {
	printf 'repository.sh: %s\n' "$*" >&2
	exit 1
}

[ $# -eq 2 ] || die "usage: FLUKSIO_SIGNING_KEY=FINGERPRINT sh packaging/repository.sh DIST REPO"
key=${FLUKSIO_SIGNING_KEY:-}
[ -n "$key" ] || die "FLUKSIO_SIGNING_KEY is not set: name the signing key by its fingerprint (gpg --list-secret-keys)"
for tool in apt-ftparchive:apt-utils gpg:gnupg createrepo_c:createrepo-c rpmsign:rpm gzip:gzip; do
	command -v "${tool%%:*}" >/dev/null 2>&1 || die "${tool%%:*} is missing (Debian: apt-get install ${tool#*:})"
done
here=$(cd "$(dirname "$0")" && pwd)
dist=$(cd "$1" && pwd) || die "no release directory $1"
gpg --batch --list-secret-keys "$key" >/dev/null 2>&1 || die "gpg has no secret key $key (GNUPGHOME=${GNUPGHOME:-~/.gnupg})"
signing=$(gpg --batch --with-colons --list-secret-keys "$key" | awk -F: '$1 == "sec" { n++; primary = 1; next }
	$1 == "fpr" && primary { fpr = $10; primary = 0 }
	END { if (n == 1) print fpr }')
[ -n "$signing" ] || die "FLUKSIO_SIGNING_KEY=$key names more than one key: name the release key by its whole fingerprint"
trusted=$(sed -n 's/^release_key=\([0-9A-F]\{40\}\)$/\1/p' "$here/install.sh")
[ -n "$trusted" ] || die "$here/install.sh has no release_key=FINGERPRINT line (40 upper-case hex digits)"
[ "$signing" = "$trusted" ] || die "the signing key is $signing, but $here/install.sh trusts only $trusted: the install.sh published with this repository would refuse it. Sign with the release key, or, for a new release key, put its fingerprint in install.sh's release_key=, README.md and docs/releasing.md first (docs/releasing.md, \"Rotating the release key\")"
mkdir -p "$2"
repo=$(cd "$2" && pwd)

# publish FILE DIR [COMMAND...] copies a package in (COMMAND, if any, is
# run on the copy before it takes its place), unless it is already there.
publish() {
	dest=$2/$(basename "$1")
	if [ -e "$dest" ]; then
		return 1
	fi
	mkdir -p "$2"
	cp "$1" "$dest.tmp"
	src=$1
	shift 2
	if [ $# -gt 0 ]; then
		"$@" "$dest.tmp" >/dev/null || die "$* $(basename "$src") failed"
	fi
	mv "$dest.tmp" "$dest"
}

sign() { # sign OUT ARGS... FILE
	out=$1
	shift
	gpg --batch --yes --quiet --local-user "$key" --digest-algo SHA512 --output "$out" "$@"
}

found=
for deb in "$dist"/*.deb; do
	[ -e "$deb" ] || continue
	found=1
	pool=$repo/deb/pool/main/f/fluksio-worker
	if ! publish "$deb" "$pool"; then
		cmp -s "$deb" "$pool/$(basename "$deb")" ||
			die "$(basename "$deb") is already published with other contents: a version is never rebuilt; release a new one"
	fi
done
for rpm in "$dist"/*.rpm; do
	[ -e "$rpm" ] || continue
	found=1
	# The rpm is signed in the repository (its bytes change), so a copy
	# already there is compared by its unsigned header+payload digest.
	packages=$repo/rpm/packages
	if publish "$rpm" "$packages" rpmsign --addsign --define "_gpg_name $key" \
		--define "_gpg_path ${GNUPGHOME:-$HOME/.gnupg}" --define "__gpg $(command -v gpg)"; then
		:
	elif [ "$(rpm -qp --qf '%{SHA256HEADER}' "$rpm" 2>/dev/null)" != "$(rpm -qp --qf '%{SHA256HEADER}' "$packages/$(basename "$rpm")" 2>/dev/null)" ]; then
		die "$(basename "$rpm") is already published with other contents: a version is never rebuilt; release a new one"
	fi
done
[ -n "$found" ] || die "no .deb or .rpm in $dist: run goreleaser release first"

# apt: one Packages per architecture, a Release listing their sums, and
# the Release signed twice (InRelease inline, Release.gpg detached, for old
# apt).
cd "$repo/deb"
for arch in amd64 arm64; do
	dir=dists/stable/main/binary-$arch
	mkdir -p "$dir"
	apt-ftparchive --arch "$arch" packages pool >"$dir/Packages"
	gzip -9nf -k "$dir/Packages"
done
# The old Release and its signatures go first, or the new one would list them.
rm -f dists/stable/Release dists/stable/InRelease dists/stable/Release.gpg
apt-ftparchive \
	-o APT::FTPArchive::Release::Origin=fluksio-worker \
	-o APT::FTPArchive::Release::Label=fluksio-worker \
	-o APT::FTPArchive::Release::Suite=stable \
	-o APT::FTPArchive::Release::Codename=stable \
	-o APT::FTPArchive::Release::Architectures="amd64 arm64" \
	-o APT::FTPArchive::Release::Components=main \
	-o APT::FTPArchive::Release::Description="fluksio-worker packages" \
	release dists/stable >"$repo/Release.tmp"
mv "$repo/Release.tmp" dists/stable/Release
sign dists/stable/InRelease --clearsign dists/stable/Release
sign dists/stable/Release.gpg --armor --detach-sign dists/stable/Release

# dnf/yum: the metadata of every package, repomd.xml signed.
if [ -d "$repo/rpm/packages" ]; then
	createrepo_c --quiet --update "$repo/rpm"
	sign "$repo/rpm/repodata/repomd.xml.asc" --armor --detach-sign "$repo/rpm/repodata/repomd.xml"
fi

gpg --batch --armor --export "$key" >"$repo/fluksio-worker.asc.tmp"
mv "$repo/fluksio-worker.asc.tmp" "$repo/fluksio-worker.asc"
cp "$here/install.sh" "$repo/install.sh.tmp"
mv "$repo/install.sh.tmp" "$repo/install.sh"
printf 'repository.sh: %s signed with %s\n' "$repo" "$key"
