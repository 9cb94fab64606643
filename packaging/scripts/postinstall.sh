#!/bin/sh
# outpost postinst (deb) and %post (rpm). packaging/README.md has the rules.
#   deb: $1 = configure, $2 = the version replaced (empty on a first install)
#   rpm: $1 = 1 on a first install, 2 or more on an upgrade
set -e

unit=outpost.service
case "$1" in
configure)
	if [ -n "$2" ]; then action=upgrade; else action=install; fi ;;
1) action=install ;;
[2-9] | [1-9][0-9]*) action=upgrade ;;
*) exit 0 ;; # abort-upgrade, abort-remove, abort-deconfigure: nothing to do
esac

# configured reports whether the agent has something to do: the config
# file differs from the shipped default, or the manifest directory holds a
# manifest.
configured() {
	if ! cmp -s /etc/outpost/config.yaml /usr/share/outpost/config.yaml; then
		return 0
	fi
	for f in /etc/outpost/manifests/*.yaml /etc/outpost/manifests/*.yml; do
		[ -f "$f" ] && return 0
	done
	return 1
}

booted=no
[ -d /run/systemd/system ] && booted=yes
[ "$booted" = yes ] && systemctl daemon-reload >/dev/null 2>&1 || true

case "$action" in
install)
	# Enabled on every first install, so it runs from the next boot on.
	systemctl enable "$unit" >/dev/null 2>&1 || true
	if [ "$booted" = yes ]; then
		if configured; then
			systemctl start "$unit" || true
		else
			echo "outpost: not started: put manifests in /etc/outpost/manifests or edit"
			echo "outpost: /etc/outpost/config.yaml, then run: systemctl start outpost"
		fi
	fi
	;;
upgrade)
	# Restarts the agent only, and only if it runs: KillMode=process
	# leaves every container running.
	[ "$booted" = yes ] && systemctl try-restart "$unit" || true
	;;
esac
exit 0
