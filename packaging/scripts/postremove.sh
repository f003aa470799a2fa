#!/bin/sh
# After removal (deb postrm, rpm %postun).
#
# deb purge: remove the config (it holds the token) and the state. A plain
# remove keeps both, so reinstalling and running `install` picks them up.
# rpm has no purge: `dnf remove` keeps them too; run
# `sudo fluksio-worker uninstall --purge` first to drop them.
# The system user stays, as Debian policy advises: files it owned may remain.
set -e

case "$1" in
purge)
	rm -f /etc/systemd/system/fluksio-worker.service
	rm -rf /etc/fluksio-worker /var/lib/fluksio-worker
	;;
esac
if [ -d /run/systemd/system ]; then
	case "$1" in
	remove | purge | 0) systemctl daemon-reload || true ;;
	esac
fi
exit 0
