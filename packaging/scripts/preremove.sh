#!/bin/sh
# outpost prerm (deb) and %preun (rpm). rpm runs %preun of the old
# package on an upgrade too, so only a removal stops the agent.
#   deb: $1 = remove, upgrade, deconfigure or failed-upgrade
#   rpm: $1 = 0 on a removal, 1 or more on an upgrade
set -e

case "$1" in
remove | 0) ;;
*) exit 0 ;; # an upgrade: postinst / %post restarts the new agent
esac

# Stops the agent only; the pods it ran keep running in containerd's
# "outpost" namespace (packaging/README.md says how to remove them).
if [ -d /run/systemd/system ]; then
	systemctl stop outpost.service || true
fi
systemctl disable outpost.service >/dev/null 2>&1 || true
exit 0
