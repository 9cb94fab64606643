#!/bin/sh
# outpost postrm (deb) and %postun (rpm).
#   deb: $1 = remove, purge, upgrade, disappear, failed-upgrade, abort-*
#   rpm: $1 = 0 on a removal, 1 or more on an upgrade
set -e

case "$1" in
remove | purge | 0) ;;
*) exit 0 ;;
esac

# The store in /var/lib/outpost is the node's truth and is kept, even on
# purge; remove it by hand.
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
