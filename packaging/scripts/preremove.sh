#!/bin/sh
# Before removal (deb prerm, rpm %preun): stop and remove the service, but
# only when the package is going away, not when it is being upgraded
# (deb: $1 is "upgrade"; rpm: $1 is the count of versions left, 1).
set -e

unit=/etc/systemd/system/fluksio-worker.service

case "$1" in
remove | 0) ;;
*) exit 0 ;;
esac

[ -e "$unit" ] || exit 0
# uninstall's own advice for the config it keeps names a command this
# removal is taking away; the package says what works once it is gone.
if out=$(fluksio-worker uninstall); then
	printf '%s\n' "$out" | grep -v 'uninstall --purge' || true
	if [ -e /etc/fluksio-worker ] || [ -e /var/lib/fluksio-worker ]; then
		if [ "$1" = remove ]; then
			echo "fluksio-worker: kept the config (with the token) in /etc/fluksio-worker and the state in /var/lib/fluksio-worker; 'apt purge fluksio-worker' removes them."
		else
			echo "fluksio-worker: kept the config (with the token) in /etc/fluksio-worker and the state in /var/lib/fluksio-worker; no package command removes them, 'sudo rm -rf /etc/fluksio-worker /var/lib/fluksio-worker' does."
		fi
	fi
else
	printf '%s\n' "$out"
	# Never block a removal: the binary is about to go, so a unit left
	# behind would point at nothing. Take it down by hand.
	echo "fluksio-worker: uninstall failed; removing the unit directly" >&2
	if [ -d /run/systemd/system ]; then
		systemctl stop fluksio-worker.service || true
	fi
	systemctl disable fluksio-worker.service >/dev/null 2>&1 || true
	rm -f "$unit"
fi
exit 0
