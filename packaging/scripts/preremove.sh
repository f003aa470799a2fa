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
if ! fluksio-worker uninstall; then
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
