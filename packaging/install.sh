#!/bin/sh
# Installs fluksio-worker from the project's signed package repository:
#
#   curl -fsSL https://packages.fluksio.io/install.sh | sh
#
# What it does (a file is written only where it differs, and apt and dnf
# install only what is missing or older, so a second run changes nothing):
#   apt (Debian, Ubuntu): the repository's public key into
#     /etc/apt/keyrings/fluksio-worker.asc, the source into
#     /etc/apt/sources.list.d/fluksio-worker.list (signed-by= that key only),
#     apt-get update, apt-get install fluksio-worker;
#   dnf or yum (Fedora, RHEL and its rebuilds, Amazon Linux): the key into
#     /etc/pki/rpm-gpg/RPM-GPG-KEY-fluksio-worker, the repository into
#     /etc/yum.repos.d/fluksio-worker.repo (metadata and packages checked
#     against that key), dnf/yum install fluksio-worker.
# Then it prints the command that attaches this machine to an engine, the
# same one the package prints when it is first installed.
#
#   curl -fsSL https://packages.fluksio.io/install.sh | sh -s -- --remove
#
# undoes that: the apt source and its key, or the yum/dnf repository file,
# its key file and the key rpm imported from it. The package itself stays
# (apt or dnf removes it; the script says how), as does anything it keeps.
#
# The key is trusted only if it is the release key: its fingerprint is
# below (release_key), and README.md and docs/releasing.md publish the same.
# A key with another fingerprint stops the script before it writes anything,
# whatever server serves it; so does a key other than the one already
# installed here, unless FLUKSIO_ROTATE_KEY names the new key's fingerprint
# (a planned rotation, announced with the release: docs/releasing.md).
#
# FLUKSIO_REPO_URL names another copy of the repository (a mirror, a test's
# server); the default is below. What it downloads (the key) is only ever
# written to a file, never run.
#
# The manual equivalent, for apt and for dnf/yum: docs/releasing.md.
set -eu

repo=${FLUKSIO_REPO_URL:-https://packages.fluksio.io}
repo=${repo%/}
releases=https://github.com/fluksio/fluksio-worker/releases

# The fingerprint of the release key, the one key this script trusts. It is
# written here, not fetched, so that neither the repository's server nor a
# mirror can choose it. packaging/repository.sh refuses to sign with any
# other key, so a repository and the install.sh published with it always
# agree; the tests publish with keys of their own and so run a copy of this
# script with their key's fingerprint on this line (nothing the script
# reads at run time can change it). All zeros until the project's release
# key exists: that matches no key, so nothing installs and nothing is
# published (docs/releasing.md, "The release key").
release_key=0000000000000000000000000000000000000000

say() { printf '%s\n' "$*"; }
die() {
	printf 'install.sh: %s\n' "$*" >&2
	exit 1
}

# The whole script is read before any of it runs (a function called on
# the last line), so a download cut short runs nothing half-way; what it
# runs reads /dev/null, never the rest of a script piped into sh.
main() {
	case "$*" in
	"") set_up ;;
	--remove)
		need_root
		remove
		;;
	*) die "unknown argument: $*. install.sh takes none (install), or --remove (remove the repository and its key): curl -fsSL $repo/install.sh | sh -s -- --remove" ;;
	esac
}

set_up() {
	detect
	need_root
	tmp=$(mktemp -d)
	trap cleanup EXIT
	case $manager in
	apt) install_apt ;;
	dnf | yum) install_rpm ;;
	esac
	next_step
}

# detect sets manager (apt, dnf, yum) and arch, or refuses with what to do
# instead. Nothing is changed before this has passed.
detect() {
	manual="download the tar.gz for your architecture from $releases, put fluksio-worker on PATH, then run: sudo fluksio-worker install --url URL --token -"
	if command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1; then
		manager=apt
		arch=$(dpkg --print-architecture)
	elif command -v dnf >/dev/null 2>&1; then
		manager=dnf
		arch=$(uname -m)
	elif command -v yum >/dev/null 2>&1; then
		manager=yum
		arch=$(uname -m)
	elif command -v zypper >/dev/null 2>&1; then
		die "zypper (openSUSE, SLES) is not supported yet. Download the .rpm for your architecture from $releases and run: sudo zypper install ./fluksio-worker-*.rpm (or: $manual)"
	else
		die "found no apt-get, dnf or yum: this distribution has no fluksio-worker repository. Instead: $manual"
	fi
	case $arch in
	amd64 | arm64 | x86_64 | aarch64) ;;
	*) die "no fluksio-worker package for the $arch architecture (there are amd64/x86_64 and arm64/aarch64 ones). Build it from source: go install github.com/fluksio/fluksio-worker@latest (Go 1.26 or newer), then: sudo fluksio-worker install --url URL --token -" ;;
	esac
}

# need_root sets as_root: empty for root, else sudo.
need_root() {
	as_root=
	if [ "$(id -u)" != 0 ]; then
		command -v sudo >/dev/null 2>&1 || die "run this as root: it installs a package (no sudo found)"
		as_root=sudo
	fi
}

# fetch URL FILE downloads with curl or wget, or apt's own helper where
# neither is installed (a minimal Debian has apt but no curl).
fetch() {
	if command -v curl >/dev/null 2>&1; then
		curl -fsSL -o "$2" "$1"
	elif command -v wget >/dev/null 2>&1; then
		wget -q -O "$2" "$1"
	elif [ -x /usr/lib/apt/apt-helper ]; then
		# As root, into our private directory: apt's _apt user could not
		# write there (apt would say so, then do the same).
		/usr/lib/apt/apt-helper -o APT::Sandbox::User=root -q download-file "$1" "$2" >/dev/null
	else
		false
	fi || die "could not download $1: is $repo reachable from here? (FLUKSIO_REPO_URL names a mirror)"
}

# put FILE DEST writes FILE to DEST (mode 0644, owned by root) unless DEST
# already holds exactly that; it says whether it changed anything.
put() {
	if [ -f "$2" ] && cmp -s "$1" "$2"; then
		return 1
	fi
	$as_root install -m 0644 -o root -g root "$1" "$2" || die "could not write $2"
	say "wrote $2"
}

cleanup() {
	# gpg may have started a helper for its throwaway home (gpg 2.4's
	# keyboxd); it goes with the home.
	if [ -d "$tmp/gnupg" ] && command -v gpgconf >/dev/null 2>&1; then
		GNUPGHOME=$tmp/gnupg gpgconf --kill all >/dev/null 2>&1 || true
	fi
	rm -rf "$tmp"
}

# need_gpg makes sure gpg is there to read the key's fingerprint: a minimal
# Debian or a container image has only gpgv. It comes from the
# distribution's own signed repositories, like any package.
need_gpg() {
	command -v gpg >/dev/null 2>&1 && return
	say "installing gpg (from this distribution), to check the repository's key"
	case $manager in
	apt)
		$as_root apt-get update -q </dev/null &&
			$as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends gpg </dev/null
		;;
	*) $as_root "$manager" install -y gnupg2 </dev/null ;;
	esac || die "could not install gpg (above): install it (the gpg or gnupg2 package), then run this again"
	command -v gpg >/dev/null 2>&1 || die "gpg is still missing: install it (the gpg or gnupg2 package), then run this again"
}

# fingerprint FILE prints the fingerprint of the one primary key FILE
# holds; it fails for no key, or for several (apt and dnf would trust each).
# gpg only reads FILE: its home is a throwaway one, so no keyring of this
# machine's is read or written.
fingerprint() {
	mkdir -p -m 0700 "$tmp/gnupg"
	GNUPGHOME=$tmp/gnupg gpg --batch --no-tty --with-colons --show-keys "$1" 2>/dev/null |
		awk -F: '$1 == "pub" { n++; primary = 1; next }
			$1 == "fpr" && primary { fpr = $10; primary = 0 }
			$1 == "sub" { primary = 0 }
			END { if (n != 1 || fpr == "") exit 1; print fpr }'
}

# trust_key DEST fetches the repository's key into $tmp/key and stops,
# before anything is written, unless it is the release key and DEST (where
# the key is installed) holds the same key or none. Another key at DEST is
# replaced only when FLUKSIO_ROTATE_KEY names the new key's fingerprint.
trust_key() {
	need_gpg
	fetch "$repo/fluksio-worker.asc" "$tmp/key"
	new=$(fingerprint "$tmp/key") || die "$repo/fluksio-worker.asc is not one OpenPGP public key: is FLUKSIO_REPO_URL the repository's root?"
	[ "$new" = "$release_key" ] || die "the key $repo serves is not the fluksio-worker release key: its fingerprint is $new, the release key's is $release_key. Nothing was changed. This is not the fluksio-worker repository, or not as the project signed it: check FLUKSIO_REPO_URL."
	say "the repository's key is the fluksio-worker release key, $release_key"
	[ -e "$1" ] || return 0
	old=$(fingerprint "$1") || old="none (the file holds no single key)"
	[ "$old" != "$new" ] || return 0
	rotate=$(printf '%s' "${FLUKSIO_ROTATE_KEY:-}" | tr -d ' ' | tr abcdef ABCDEF)
	if [ -z "$rotate" ]; then
		die "$1 holds another key than the repository's: $old here, $new there. Nothing was changed. If the project announced that its release key changes to $new, run this again with FLUKSIO_ROTATE_KEY=$new; otherwise keep the key you have (docs/releasing.md, \"Rotating the release key\")."
	fi
	[ "$rotate" = "$new" ] || die "FLUKSIO_ROTATE_KEY is $rotate, but the repository's key is $new. Nothing was changed."
	say "replacing the key $old in $1 with $new (FLUKSIO_ROTATE_KEY)"
}

install_apt() {
	trust_key /etc/apt/keyrings/fluksio-worker.asc
	$as_root mkdir -p -m 0755 /etc/apt/keyrings
	changed=
	put "$tmp/key" /etc/apt/keyrings/fluksio-worker.asc && changed=1
	say "deb [signed-by=/etc/apt/keyrings/fluksio-worker.asc] $repo/deb stable main" >"$tmp/list"
	put "$tmp/list" /etc/apt/sources.list.d/fluksio-worker.list && changed=1
	# apt-get update every time (not only on a change): the package list
	# may be older than the newest release.
	$as_root apt-get update -q </dev/null || die "apt-get update failed (above): fix the source it names, then run this again"
	[ -n "$changed" ] || say "the fluksio-worker apt source was already set up"
	$as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q fluksio-worker </dev/null
}

install_rpm() {
	trust_key /etc/pki/rpm-gpg/RPM-GPG-KEY-fluksio-worker
	$as_root mkdir -p -m 0755 /etc/pki/rpm-gpg /etc/yum.repos.d
	put "$tmp/key" /etc/pki/rpm-gpg/RPM-GPG-KEY-fluksio-worker || true
	# The repository names the key by its local file, the one just checked,
	# never by a URL whose answer could change; dnf checks the metadata
	# (repo_gpgcheck) and each package (gpgcheck) against it, and the -y
	# below imports only that file's key into rpm's database.
	# metadata_expire: dnf's default is 48 hours, so a `dnf upgrade` the
	# day a release is announced would say "Nothing to do". The metadata
	# changes only with a release, and checking it costs one small
	# repomd.xml; after an hour at most, a plain `dnf upgrade` sees a new
	# release (`dnf upgrade --refresh` at once).
	cat >"$tmp/repo" <<EOF
[fluksio-worker]
name=fluksio-worker
baseurl=$repo/rpm
enabled=1
gpgcheck=1
repo_gpgcheck=1
gpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-fluksio-worker
metadata_expire=1h
EOF
	put "$tmp/repo" /etc/yum.repos.d/fluksio-worker.repo || say "the fluksio-worker repository was already set up"
	$as_root "$manager" install -y fluksio-worker </dev/null
}

# next_step says what to run next. On a first install the package's own
# message (packaging/scripts/postinstall.sh) said the same above, in the
# package manager's output: the two name one command, --token - (the token
# pasted when asked or piped in, so it is on no command line and in no
# shell history).
next_step() {
	say ""
	if [ -e /etc/systemd/system/fluksio-worker.service ]; then
		say "$(fluksio-worker --version) is installed and already set up as a service: fluksio-worker status says how it is."
		return
	fi
	say "$(fluksio-worker --version) is installed. Attach this machine to your engine (paste the token when asked):"
	say ""
	say "  sudo fluksio-worker install --url wss://ENGINE/api/v1/workers/attach --token -"
}

# remove takes out what an install added to the package manager's
# configuration, and says each thing it removed: the apt source and its
# key, or the repository file, its key file and the key rpm imported from
# it (rpm names an imported key gpg-pubkey-ID, ID the fingerprint's last 8
# hex digits, or in rpm 6 the whole fingerprint: the installed file's key
# where gpg can read it, and the release key). Run again it finds nothing
# and says so. The package stays:
# removing it is apt's or dnf's, and the script prints the command.
remove() {
	removed=
	rpmkey=/etc/pki/rpm-gpg/RPM-GPG-KEY-fluksio-worker
	ids=$(rpm_ids "$release_key")
	if [ -f "$rpmkey" ] && command -v gpg >/dev/null 2>&1; then
		tmp=$(mktemp -d)
		trap cleanup EXIT
		if fpr=$(fingerprint "$rpmkey"); then
			ids="$ids $(rpm_ids "$fpr")"
		fi
	fi
	for f in /etc/apt/sources.list.d/fluksio-worker.list /etc/apt/keyrings/fluksio-worker.asc /etc/yum.repos.d/fluksio-worker.repo "$rpmkey"; do
		[ -e "$f" ] || continue
		$as_root rm -f "$f" || die "could not remove $f"
		say "removed $f"
		removed=1
	done
	if command -v rpm >/dev/null 2>&1; then
		for id in $ids; do
			rpm -q "gpg-pubkey-$id" >/dev/null 2>&1 || continue
			$as_root rpm -e --allmatches "gpg-pubkey-$id" || die "could not remove the key gpg-pubkey-$id from rpm's database"
			say "removed the key gpg-pubkey-$id from rpm's database"
			removed=1
		done
	fi
	if [ -z "$removed" ]; then
		say "found no fluksio-worker repository or key to remove: nothing was changed"
	fi
	status=
	if command -v dpkg-query >/dev/null 2>&1; then
		status=$(dpkg-query -W -f '${Status}' fluksio-worker 2>/dev/null) || status=
	fi
	case $status in
	*" installed")
		say "The fluksio-worker package stays installed: sudo apt purge fluksio-worker removes it with its config and state (apt remove keeps those)."
		return
		;;
	*" config-files")
		say "The fluksio-worker package left its config and state: sudo apt purge fluksio-worker removes them."
		return
		;;
	esac
	if command -v rpm >/dev/null 2>&1 && rpm -q fluksio-worker >/dev/null 2>&1; then
		say "The package stays installed: sudo fluksio-worker uninstall --purge && sudo dnf remove fluksio-worker removes it with its config and state."
	fi
}

# rpm_ids FINGERPRINT prints the ids rpm may name the key by, lower case:
# the last 8 hex digits, and the whole fingerprint.
rpm_ids() {
	printf '%s %s' "$(printf '%s' "$1" | tail -c 8)" "$1" | tr ABCDEF abcdef
}

main "$@"
