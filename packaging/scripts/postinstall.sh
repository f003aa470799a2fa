#!/bin/sh
# After install or upgrade (deb postinst, rpm %post).
#
# Fresh install: say what to run next; the package never starts a worker,
# because only `install` knows the engine and the token. The command is the
# one packaging/install.sh prints after installing the package (one
# command, whichever way the package came): --token - reads the token from
# stdin, pasted when asked or piped in, so it is on no command line and in
# no shell history.
# Upgrade with the service installed: rewrite its unit from the new binary
# (a newer unit template may fix things), then, only if it is running,
# reload it: the worker lets its running calls finish (a training run may
# take days) and then executes the new binary in place. A stopped service
# stays stopped. A worker from before reloads existed (its old unit has no
# ExecReload=) would die of the reload's SIGHUP, so it is restarted, as
# before.
#
# Whether the service is installed is read off the unit file, not off the
# arguments: after `apt remove` and a later reinstall dpkg passes the old
# version, yet there is no service to refresh.
set -e

unit=/etc/systemd/system/fluksio-worker.service

case "$1" in
abort-*) exit 0 ;; # deb: rolling back a failed upgrade or removal
esac

if [ ! -e "$unit" ]; then
	cat <<'MSG'

fluksio-worker is installed. Attach this machine to your engine (paste the
token when asked):

  sudo fluksio-worker install --url wss://ENGINE/api/v1/workers/attach --token -

Then: systemctl status fluksio-worker (or: fluksio-worker status)
Example settings: /usr/share/doc/fluksio-worker/config.example.toml

MSG
	exit 0
fi

reloads=
if grep -q '^ExecReload=' "$unit"; then
	reloads=yes
fi
if ! fluksio-worker install --refresh-unit; then
	# Keep the package installed and the old unit working; say so loudly.
	echo "fluksio-worker: could not refresh $unit from the new version; the old unit stays. Run: sudo fluksio-worker install --refresh-unit" >&2
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
	if [ -z "$reloads" ]; then
		systemctl try-restart fluksio-worker.service || true
	elif systemctl is-active --quiet fluksio-worker.service; then
		systemctl reload fluksio-worker.service || true
	fi
fi
exit 0
