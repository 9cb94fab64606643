#!/usr/bin/env bash
# Installs, as root on Debian or Ubuntu, the packages the demo, the
# end-to-end tests, make test-arm (qemu-user-static) and the package tests
# (lintian, rpm; shellcheck and mmdebstrap for scripts/install.sh's;
# fdisk, dosfstools, mtools and e2fsprogs for scripts/flash-pi.sh's) use,
# and fetches the arm64 busybox for the multi-arch test image. Safe to run
# again: it installs only what is missing.
set -euo pipefail

TOOLS=${OUTPOST_TOOLS:-/var/cache/outpost-testenv}
PKGS=(containerd runc crun mosquitto mosquitto-clients busybox-static nftables iproute2 ca-certificates python3 jq qemu-user-static qemu-user-static lintian rpm shellcheck mmdebstrap fdisk dosfstools mtools e2fsprogs openssl curl)
# Commands that say a package is there. The package manager is asked only
# when one is missing, so a second run costs nothing. "a|b" is either.
# qemu-user-static (make test-arm) names its emulators qemu-aarch64-static
# on Debian 12 and Ubuntu, plain qemu-aarch64 from Debian 13 on.
CMDS=(containerd runc crun mosquitto mosquitto_pub busybox nft ip update-ca-certificates python3 jq
	"qemu-aarch64-static|qemu-aarch64" "qemu-arm-static|qemu-arm" lintian rpm shellcheck mmdebstrap sfdisk mkfs.vfat mcopy mkfs.ext4 openssl curl)

if [[ $(id -u) != 0 ]]; then
	echo "install.sh: must run as root (apt-get install)" >&2
	exit 1
fi
if ! command -v apt-get >/dev/null; then
	echo "install.sh: needs apt-get (Debian or Ubuntu); install these yourself: ${PKGS[*]}" >&2
	exit 1
fi

have() {
	local c
	for c in ${1//|/ }; do command -v "$c" >/dev/null && return 0; done
	return 1
}
missing=()
for i in "${!CMDS[@]}"; do
	have "${CMDS[$i]}" || [[ " ${missing[*]} " == *" ${PKGS[$i]} "* ]] || missing+=("${PKGS[$i]}")
done
if ((${#missing[@]})); then
	echo "testenv: installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# busybox for the test image, per architecture.
mkdir -p "$TOOLS/busybox/amd64" "$TOOLS/busybox/arm64"
if [[ $(dpkg --print-architecture) == amd64 ]]; then
	install -m 0755 /bin/busybox "$TOOLS/busybox/amd64/busybox"
fi
if [[ ! -x $TOOLS/busybox/arm64/busybox ]]; then
	echo "testenv: fetching busybox-static for arm64"
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	# Name arm64 for this one download only; dpkg's architectures are left alone.
	A=(-o "APT::Architectures::=$(dpkg --print-architecture)" -o "APT::Architectures::=arm64")
	apt-get "${A[@]}" update -qq
	(cd "$tmp" && chown _apt "$tmp" 2>/dev/null; apt-get "${A[@]}" download -qq busybox-static:arm64)
	dpkg-deb -x "$tmp"/busybox-static_*_arm64.deb "$tmp/root"
	install -m 0755 "$tmp/root/bin/busybox" "$TOOLS/busybox/arm64/busybox"
fi
echo "testenv: packages ready; busybox in $TOOLS/busybox"
