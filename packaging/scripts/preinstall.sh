#!/bin/sh
# Before install or upgrade (deb preinst, rpm %pre): make sure the system
# account the service runs as exists. Idempotent; never changes an account
# that is already there except to add the GPU groups.
#
# No skeleton, no login shell, no home created here: the unit's
# StateDirectory= creates /var/lib/fluksio-worker, owned by this user.
set -e

name=fluksio-worker
home=/var/lib/fluksio-worker

case "$1" in
abort-*) exit 0 ;; # deb: an upgrade being rolled back; nothing to undo
esac

nologin=/usr/sbin/nologin
[ -x "$nologin" ] || nologin=/sbin/nologin
[ -x "$nologin" ] || nologin=/bin/false

if ! getent group "$name" >/dev/null; then
	groupadd --system "$name"
fi
if ! getent passwd "$name" >/dev/null; then
	useradd --system --gid "$name" --home-dir "$home" --no-create-home \
		--shell "$nologin" --comment "Fluksio worker" "$name"
fi
# GPUs are device nodes owned by these groups where the drivers create them.
for group in video render; do
	if getent group "$group" >/dev/null; then
		usermod --append --groups "$group" "$name"
	fi
done
exit 0
