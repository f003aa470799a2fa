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
# Then it prints the command that attaches this machine to an engine.
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

say() { printf '%s\n' "$*"; }
die() {
	printf 'install.sh: %s\n' "$*" >&2
	exit 1
}

# The whole script is read before any of it runs (a function called on
# the last line), so a download cut short runs nothing half-way; what it
# runs reads /dev/null, never the rest of a script piped into sh.
main() {
	detect
	need_root
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
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

install_apt() {
	fetch "$repo/fluksio-worker.asc" "$tmp/key"
	grep -q 'BEGIN PGP PUBLIC KEY BLOCK' "$tmp/key" || die "$repo/fluksio-worker.asc is not a PGP public key: is FLUKSIO_REPO_URL the repository's root?"
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
	fetch "$repo/fluksio-worker.asc" "$tmp/key"
	grep -q 'BEGIN PGP PUBLIC KEY BLOCK' "$tmp/key" || die "$repo/fluksio-worker.asc is not a PGP public key: is FLUKSIO_REPO_URL the repository's root?"
	$as_root mkdir -p -m 0755 /etc/pki/rpm-gpg /etc/yum.repos.d
	put "$tmp/key" /etc/pki/rpm-gpg/RPM-GPG-KEY-fluksio-worker || true
	cat >"$tmp/repo" <<EOF
[fluksio-worker]
name=fluksio-worker
baseurl=$repo/rpm
enabled=1
gpgcheck=1
repo_gpgcheck=1
gpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-fluksio-worker
EOF
	put "$tmp/repo" /etc/yum.repos.d/fluksio-worker.repo || say "the fluksio-worker repository was already set up"
	$as_root "$manager" install -y fluksio-worker </dev/null
}

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

main "$@"
