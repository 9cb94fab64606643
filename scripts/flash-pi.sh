#!/usr/bin/env bash
# Puts outpost into a Raspberry Pi OS image, so that a board boots into a
# working node with or without a network:
#
#   scripts/flash-pi.sh IMAGE --deb FILE --config FILE [--manifests DIR]
#       [--images DIR] [--hostname NAME] [--ssh-key FILE] [--force]
#
# IMAGE is a decompressed Raspberry Pi OS .img: an MBR partition table,
# partition 1 FAT (the firmware's, with cmdline.txt and config.txt),
# partition 2 ext4 (the root). It is changed in place; write it to the SD
# card afterwards. It writes the package's files, the config, the manifests
# (*.yaml, *.yml) and the image tarballs (*.tar) into the root, enables the
# unit, adds cgroup_enable=memory cgroup_memory=1 to cmdline.txt, and sets
# the host name and an SSH key. Running it again with the same arguments
# changes nothing. packaging/README.md ("Flashing a Raspberry Pi OS
# image") says what goes where and why.
#
#   --deb FILE       outpost_<version>-1_arm64.deb or _armhf.deb (make
#                    packages), the architecture of the image's userland
#   --config FILE    written to /etc/outpost/config.yaml; checked first with
#                    `outpost config check` when an outpost binary for this
#                    host is found ($OUTPOST, outpost in PATH, or bin/outpost
#                    of this checkout: make build)
#   --manifests DIR  its *.yaml and *.yml files go to the config's
#                    manifestDir, mode 0600
#   --images DIR     its *.tar files go to the config's imageDir (mode 0700),
#                    for a first boot with no registry in reach
#   --hostname NAME  /etc/hostname and the 127.0.1.1 line of /etc/hosts
#   --ssh-key FILE   OpenSSH public keys, added to the authorized_keys of
#                    the user with uid 1000 (root without one); enables sshd
#   --force          IMAGE may be a block device (an SD card): see below
#
# Exit status: 0 done, 1 failure (a check that fails changes nothing),
# 2 usage, 128+N on signal N. On every exit the root is unmounted and the
# loop device detached. Needs root (loop devices, mount), util-linux,
# fdisk (sfdisk), dpkg-deb and mtools. The FAT partition is edited with
# mtools, so the host needs no vfat kernel module.
set -euo pipefail
shopt -s inherit_errexit nullglob
umask 022
export LC_ALL=C
# Pi OS boot partitions can fail mtools' geometry sanity check.
export MTOOLS_SKIP_CHECK=1

prog=flash-pi.sh
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

die() {
	echo "$prog: $*" >&2
	exit 1
}
warn() { echo "$prog: warning: $*" >&2; }
usage() {
	[[ -z ${1:-} ]] || echo "$prog: $1" >&2
	echo "usage: $prog IMAGE --deb FILE --config FILE [--manifests DIR] [--images DIR] [--hostname NAME] [--ssh-key FILE] [--force]" >&2
	exit 2
}

image='' deb='' config='' manifests='' images='' hostname='' sshkey='' force=''
while (($#)); do
	opt=$1
	case $opt in
	--*=*) set -- "${opt%%=*}" "${opt#*=}" "${@:2}"; continue ;;
	--force) force=1; shift; continue ;;
	-h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
	--deb | --config | --manifests | --images | --hostname | --ssh-key)
		(($# >= 2)) || usage "$opt needs a value"
		[[ -n $2 ]] || usage "$opt needs a value" ;;
	-*) usage "unknown option $opt" ;;
	*)
		[[ -z $image ]] || usage "one IMAGE only (have $image and $opt)"
		image=$opt; shift; continue ;;
	esac
	case $opt in
	--deb) deb=$2 ;;
	--config) config=$2 ;;
	--manifests) manifests=$2 ;;
	--images) images=$2 ;;
	--hostname) hostname=$2 ;;
	--ssh-key) sshkey=$2 ;;
	esac
	shift 2
done
[[ -n $image ]] || usage "no IMAGE"
[[ -n $deb ]] || usage "--deb is required"
[[ -n $config ]] || usage "--config is required"
# A Kubernetes node name defaults to the host name: an RFC 1123 label.
if [[ -n $hostname && ! $hostname =~ ^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$ ]]; then
	usage "--hostname $hostname: want 1-63 lower-case letters, digits and '-', not starting or ending with '-' (it becomes the node name)"
fi

[[ $(id -u) == 0 ]] || die "must run as root (loop devices, mount)"
for c in losetup:util-linux partx:util-linux blkid:util-linux mount:mount lsblk:util-linux flock:util-linux \
	mountpoint:util-linux sfdisk:fdisk dpkg-deb:dpkg mtype:mtools mcopy:mtools mdir:mtools; do
	command -v "${c%%:*}" >/dev/null || die "needs ${c%%:*} (Debian package ${c#*:})"
done

# Everything below the trap is undone by cleanup on every exit path.
tmp='' mnt='' mounted='' attached='' lockfd=''
cleanup() {
	local rc=$? i left=''
	# Not to be cut short by a second signal.
	trap - EXIT
	trap '' HUP INT TERM
	set +e
	if [[ -n $mounted ]]; then
		umount "$mnt" || { sleep 1 && umount "$mnt"; } || umount --lazy "$mnt"
	fi
	if [[ -n $attached ]]; then
		# Every loop device of IMAGE is ours: there was none at the start,
		# and the lock keeps another flash-pi.sh out.
		for i in $(losetup -n -O NAME -j "$image"); do losetup -d "$i"; done
		# A device still in use is only marked for removal: wait for it.
		for ((i = 0; i < 50; i++)); do
			left=$(losetup -n -O NAME -j "$image")
			[[ -n $left ]] || break
			sleep 0.1
		done
		if [[ -n $left ]]; then
			echo "$prog: $image is still attached to $left: detach it with losetup -d" >&2
			((rc)) || rc=1
		fi
		sync "$image"
	fi
	# --one-file-system: never into the image's root, should it still be
	# mounted.
	if [[ -n $tmp ]] && ! mountpoint -q "$mnt"; then rm -rf --one-file-system "$tmp"; fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
tmp=$(mktemp -d "${TMPDIR:-/tmp}/flash-pi.XXXXXX")
mnt=$tmp/root
mkdir "$mnt"

# --- Check the inputs ---------------------------------------------------

[[ -f $deb && -r $deb ]] || die "$deb: no such file"
pkg=$(dpkg-deb -f "$deb" Package 2>/dev/null) || die "$deb: not a .deb package"
[[ $pkg == outpost ]] || die "$deb: package $pkg, not outpost"
deb_arch=$(dpkg-deb -f "$deb" Architecture)
deb_version=$(dpkg-deb -f "$deb" Version)
case $deb_arch in
arm64 | armhf) ;;
*) die "$deb: architecture $deb_arch; a Raspberry Pi OS image needs the arm64 or armhf package" ;;
esac
payload=$tmp/deb
dpkg-deb -x "$deb" "$payload" || die "$deb: cannot unpack"
[[ -f $payload/usr/bin/outpost ]] || die "$deb: has no /usr/bin/outpost"
unit=
for u in /lib/systemd/system/outpost.service /usr/lib/systemd/system/outpost.service; do
	[[ -f $payload$u ]] && unit=$u
done
[[ -n $unit ]] || die "$deb: has no outpost.service unit"

[[ -f $config && -r $config ]] || die "$config: no such file"
bin=${OUTPOST:-$(command -v outpost || true)}
[[ -n $bin || ! -x $repo/bin/outpost ]] || bin=$repo/bin/outpost
effective=$config
if [[ -n $bin ]]; then
	if ! "$bin" config check --config "$config" >"$tmp/config" 2>"$tmp/config.err"; then
		die "$config: rejected by $bin config check: $(cat "$tmp/config.err")"
	fi
	effective=$tmp/config
else
	warn "no outpost binary for this host (set OUTPOST=, or make build): $config is not checked"
fi
# yaml_dir prints the top-level KEY of the config, DEFAULT when unset.
yaml_dir() {
	local v
	v=$(sed -n "s/^$1:[[:space:]]*//p" "$effective" | tail -n 1 |
		sed -e 's/[[:space:]]\{1,\}#.*$//' -e 's/[[:space:]]*$//' -e 's/^"\(.*\)"$/\1/' -e "s/^'\\(.*\\)'\$/\\1/")
	v=${v:-$2}
	[[ $v == /* ]] || die "$config: $1 $v is not an absolute path"
	printf '%s\n' "${v%/}"
}
manifest_dir=$(yaml_dir manifestDir /etc/outpost/manifests)
image_dir=$(yaml_dir imageDir /var/lib/outpost/images)

manifest_files=()
if [[ -n $manifests ]]; then
	[[ -d $manifests ]] || die "$manifests: not a directory"
	for f in "$manifests"/*.yaml "$manifests"/*.yml; do
		[[ -f $f ]] && manifest_files+=("$f")
	done
	((${#manifest_files[@]})) || die "$manifests: no *.yaml or *.yml file (the agent reads no other)"
fi
image_files=()
if [[ -n $images ]]; then
	[[ -d $images ]] || die "$images: not a directory"
	for f in "$images"/*.tar; do
		[[ -f $f ]] && image_files+=("$f")
	done
	((${#image_files[@]})) || die "$images: no *.tar image tarball (the agent imports no other)"
fi

keys=()
if [[ -n $sshkey ]]; then
	[[ -f $sshkey && -r $sshkey ]] || die "$sshkey: no such file"
	! grep -q 'PRIVATE KEY' "$sshkey" || die "$sshkey: a private key; pass the public one (${sshkey%.pub}.pub)"
	n=0
	while IFS= read -r line || [[ -n $line ]]; do
		n=$((n + 1))
		line=${line%$'\r'}
		[[ -n ${line//[[:space:]]/} && $line != \#* ]] || continue
		if [[ ! $line =~ ^(ssh-(rsa|dss|ed25519)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com)\ [A-Za-z0-9+/]+=*(\ .*)?$ ]]; then
			die "$sshkey: line $n is not an OpenSSH public key (type base64 [comment])"
		fi
		keys+=("$line")
	done <"$sshkey"
	((${#keys[@]})) || die "$sshkey: no public key"
fi

# --- Check the image ----------------------------------------------------

[[ -e $image ]] || die "$image: no such file"
if [[ -b $image ]]; then
	if [[ -z $force ]]; then
		die "$image is a block device (a disk or an SD card?): $prog edits an image file that you then write to the card. Writing to the wrong device destroys it; pass --force to edit $image in place, and only if you are sure it is the card"
	fi
	busy=$(lsblk -nro MOUNTPOINT "$image" | grep . || true)
	[[ -z $busy ]] || die "$image: mounted at $(echo "$busy" | tr '\n' ' ')- unmount it first"
elif [[ ! -f $image ]]; then
	die "$image: not a regular file"
fi
[[ -w $image ]] || die "$image: not writable"
image=$(realpath "$image")

exec {lockfd}<"$image"
flock -n "$lockfd" || die "$image: in use by another $prog"
inuse=$(losetup -n -O NAME -j "$image")
[[ -z $inuse ]] || die "$image: attached to $inuse already (mounted?): unmount it and losetup -d it first"

if ! sfdisk --dump "$image" >"$tmp/table" 2>/dev/null; then
	case $(od -An -tx1 -N4 "$image" | tr -d ' \n') in
	fd377a58) die "$image: xz-compressed: decompress it first (xz -d)" ;;
	1f8b*) die "$image: gzip-compressed: decompress it first (gunzip)" ;;
	504b0304) die "$image: a zip archive: unzip it first" ;;
	esac
	die "$image: no partition table: not a Raspberry Pi OS image"
fi
label=$(sed -n 's/^label: //p' "$tmp/table")
[[ $label == dos ]] || die "$image: a $label partition table: a Raspberry Pi OS image has an MBR (dos) one"
type1=$(sfdisk --part-type "$image" 1 2>/dev/null) || die "$image: no partition 1 (the FAT boot partition)"
type2=$(sfdisk --part-type "$image" 2 2>/dev/null) || die "$image: no partition 2 (the ext4 root): not a Raspberry Pi OS image"
type1=${type1//[[:space:]]/} type2=${type2//[[:space:]]/}
case $type1 in
1 | 4 | 6 | b | c | e) ;;
*) die "$image: partition 1 has type $type1, not FAT (c): not a Raspberry Pi OS image" ;;
esac
[[ $type2 == 83 ]] || die "$image: partition 2 has type $type2, not Linux (83): not a Raspberry Pi OS image"

attached=1
loop=$(losetup --find --show --partscan "$image")
boot=${loop}p1 rootdev=${loop}p2
# Some kernels do not scan a loop device for partitions; partx asks them to.
if [[ ! -b $rootdev ]] && command -v udevadm >/dev/null; then udevadm settle --timeout=5 || true; fi
if [[ ! -b $rootdev ]]; then partx --add "$loop" 2>/dev/null || true; fi
for ((i = 0; i < 50; i++)); do
	[[ -b $boot && -b $rootdev ]] && break
	sleep 0.1
done
[[ -b $boot && -b $rootdev ]] || die "$image: no partition devices ${boot} and ${rootdev} appeared for $loop"

# mt runs an mtools command on the boot partition, its complaints kept
# in $mt_err: on a partition device mtools also says, each time, that it
# cannot get a geometry it does not need.
mt_err=
mt() {
	local rc=0
	"$@" 2>"$tmp/mtools.err" || rc=$?
	mt_err=$(sed 's/Could not get geometry of device ([^)]*)//g' "$tmp/mtools.err")
	return "$rc"
}

fstype=$(blkid -p -o value -s TYPE "$boot" 2>/dev/null || true)
[[ $fstype == vfat ]] || die "$image: partition 1 is ${fstype:-unformatted}, not FAT: not a Raspberry Pi OS image"
mt mtype -i "$boot" ::/cmdline.txt >"$tmp/cmdline.txt" ||
	die "$image: partition 1 has no cmdline.txt: not a Raspberry Pi OS boot partition"
mt mdir -i "$boot" ::/config.txt >/dev/null ||
	die "$image: partition 1 has no config.txt: not a Raspberry Pi OS boot partition"
lines=$(grep -c '[^[:space:]]' "$tmp/cmdline.txt" || true)
[[ $lines == 1 ]] || die "$image: cmdline.txt has $lines lines of text; the firmware reads one, so $prog will not guess"
cmdline=$(grep '[^[:space:]]' "$tmp/cmdline.txt" | tr -d '\r')
cmdline=${cmdline%"${cmdline##*[![:space:]]}"}

fstype=$(blkid -p -o value -s TYPE "$rootdev" 2>/dev/null || true)
[[ $fstype == ext4 ]] || die "$image: partition 2 is ${fstype:-unformatted}, not ext4: not a Raspberry Pi OS image"
# Read-only until every check passed.
mount -t ext4 -o ro "$rootdev" "$mnt" || die "$image: cannot mount partition 2"
mounted=1

# rp prints the image's absolute PATH as a host path under $mnt, following
# the image's symlinks inside the image: with lib -> usr/lib, /lib/x is
# $mnt/usr/lib/x, and an absolute link never leads out of the image.
rp() {
	local -a todo more
	local out='' part link hops=0
	IFS=/ read -r -a todo <<<"$1"
	while ((${#todo[@]})); do
		part=${todo[0]}
		todo=("${todo[@]:1}")
		case $part in
		'' | .) continue ;;
		..) out=${out%/*}; continue ;;
		esac
		if [[ -L $mnt$out/$part ]]; then
			((++hops <= 40)) || die "$image: $1: too many levels of symlinks"
			link=$(readlink "$mnt$out/$part")
			[[ $link != /* ]] || out=
			IFS=/ read -r -a more <<<"$link"
			todo=("${more[@]}" "${todo[@]}")
		else
			out=$out/$part
		fi
	done
	printf '%s\n' "$mnt$out"
}

osr=$(rp /etc/os-release)
[[ -f $osr ]] || die "$image: partition 2 has no /etc/os-release: not a Raspberry Pi OS root"
osfield() { sed -n "s/^$1=//p" "$osr" | head -n 1 | sed -e 's/^"\(.*\)"$/\1/'; }
os_id=$(osfield ID) os_like=$(osfield ID_LIKE) os_name=$(osfield PRETTY_NAME)
[[ " $os_id $os_like " == *" debian "* ]] ||
	die "$image: /etc/os-release says ID=$os_id: not Debian-based, so not Raspberry Pi OS (the package needs dpkg)"

# The userland's architecture, from an ELF header: e_ident class and
# data, then e_machine (183 aarch64, 40 arm).
elf=
for p in /usr/bin/ls /bin/ls /usr/bin/dpkg; do
	f=$(rp "$p")
	if [[ -f $f ]]; then elf=$f elf_path=$p; break; fi
done
[[ -n $elf ]] || die "$image: partition 2 has no /usr/bin/ls to tell its architecture by"
read -r -a h <<<"$(od -An -tu1 -N20 "$elf" | tr '\n' ' ')"
[[ ${#h[@]} == 20 && ${h[0]} == 127 && ${h[1]} == 69 && ${h[2]} == 76 && ${h[3]} == 70 ]] ||
	die "$image: $elf_path is not an ELF binary"
machine=$((h[18] + 256 * h[19]))
case ${h[4]}:${h[5]}:$machine in
2:1:183) image_arch=arm64 elf_desc="64-bit ARM (aarch64)" ;;
1:1:40) image_arch=armhf elf_desc="32-bit ARM" ;;
*:62) die "$image: $elf_path is an x86-64 binary: not a Raspberry Pi OS image" ;;
*) die "$image: $elf_path is an ELF binary for machine $machine, class ${h[4]}: not ARM, so not a Raspberry Pi OS image" ;;
esac
[[ $deb_arch == "$image_arch" ]] ||
	die "$deb is for $deb_arch, but $image's userland is $image_arch ($elf_path is $elf_desc): use outpost_${deb_version}_$image_arch.deb"

passwd=$(rp /etc/passwd)
[[ -f $passwd ]] || die "$image: partition 2 has no /etc/passwd"

# Room for what is written, before anything is: a Pi OS image's root has
# little free space until the first boot grows it to fill the card.
needed=$((1 << 20))
need() {
	local dst old=0 new
	dst=$(rp "$2")
	new=$(stat -c %s "$1")
	[[ ! -f $dst ]] || old=$(stat -c %s "$dst")
	if ((new > old)); then needed=$((needed + new - old + 4096)); fi
}
while IFS= read -r -d '' f; do
	[[ $f == ./etc/outpost/config.yaml ]] || need "$payload/$f" "${f#.}"
done < <(cd "$payload" && find . -type f -print0)
need "$config" /etc/outpost/config.yaml
need "$deb" /var/cache/outpost/outpost.deb
for f in "${manifest_files[@]}"; do need "$f" "$manifest_dir/${f##*/}"; done
for f in "${image_files[@]}"; do need "$f" "$image_dir/${f##*/}"; done
avail=$(df --output=avail -B1 "$mnt" | tail -n 1)
if ((needed > avail)); then
	die "$image: its root file system has $(numfmt --to=iec "$avail") free and needs $(numfmt --to=iec "$needed"): grow the image first (packaging/README.md, \"Flashing a Raspberry Pi OS image\")"
fi

echo "$prog: $image: ${os_name:-$os_id} ($image_arch); installing outpost $deb_version"
mount -o remount,rw "$mnt" || die "$image: cannot mount partition 2 read-write"

# --- Write ----------------------------------------------------------------

changed=0
wrote() {
	changed=$((changed + 1))
	echo "  $*"
}
# put SRC PATH MODE [UID:GID] writes SRC to PATH in the image unless it
# holds the same bytes already, then sets the mode and (numeric) owner.
put() {
	local dst own=${4:-0:0}
	dst=$(rp "$2")
	[[ ! -d $dst ]] || die "$image: $2 is a directory"
	mkdir -p "${dst%/*}"
	if ! cmp -s -- "$1" "$dst"; then
		cp -f -- "$1" "$dst"
		wrote "$2"
	fi
	chown "+${own%:*}:+${own#*:}" "$dst"
	chmod "$3" "$dst"
}
# mkd PATH MODE [UID:GID] makes the directory PATH in the image and sets
# its mode and owner; missing parents are made root's, 0755.
mkd() {
	local dst own=${3:-0:0}
	dst=$(rp "$1")
	[[ ! -e $dst || -d $dst ]] || die "$image: $1 is not a directory"
	if [[ ! -d $dst ]]; then
		mkdir -p "$dst"
		wrote "$1/"
	fi
	chown "+${own%:*}:+${own#*:}" "$dst"
	chmod "$2" "$dst"
}
# lnk TARGET PATH makes PATH in the image a symlink to TARGET.
lnk() {
	local dst
	dst=$(rp "${2%/*}")
	dst=$dst/${2##*/}
	[[ ! -d $dst || -L $dst ]] || die "$image: $2 is a directory"
	mkdir -p "${dst%/*}"
	if [[ $(readlink "$dst" || true) != "$1" ]]; then
		ln -sfn -- "$1" "$dst"
		wrote "$2 -> $1"
	fi
}

# The package's files, through the image's symlinks (/lib -> usr/lib).
# Directories the image has already keep their mode, except the
# package's own (named outpost); its conffile is --config, below.
while IFS= read -r -d '' entry; do
	kind=${entry%% *} entry=${entry#* }
	mode=${entry%% *} path=${entry#* }
	path=${path#.}
	case $kind in
	d)
		d=$(rp "$path")
		if [[ ! -d $d || $path == */outpost || $path == */outpost/* ]]; then mkd "$path" "$mode"; fi ;;
	f) [[ $path == /etc/outpost/config.yaml ]] || put "$payload$path" "$path" "$mode" ;;
	l) lnk "$(readlink "$payload$path")" "$path" ;;
	*) die "$deb: $path: a file of type $kind" ;;
	esac
done < <(cd "$payload" && find . -mindepth 1 -printf '%y %m %p\0')

put "$config" /etc/outpost/config.yaml 0644
if ((${#manifest_files[@]})); then
	mkd "$manifest_dir" 0755
	for f in "${manifest_files[@]}"; do put "$f" "$manifest_dir/${f##*/}" 0600; done
fi
if ((${#image_files[@]})); then
	mkd "$image_dir" 0700
	for f in "${image_files[@]}"; do put "$f" "$image_dir/${f##*/}" 0600; done
fi

# Enabled as `systemctl enable` would, and registered with dpkg on the
# first boot by a unit that then removes itself.
wants=/etc/systemd/system/multi-user.target.wants
lnk "$unit" "$wants/outpost.service"
put "$deb" /var/cache/outpost/outpost.deb 0644
cat >"$tmp/firstboot" <<'EOF'
# Written by outpost's scripts/flash-pi.sh, which unpacked the outpost
# package into this image: registers the package with dpkg, then removes
# itself. While containerd or runc is missing dpkg fails and this runs
# again at the next boot: `apt-get -f install` (with a network) fixes it.
[Unit]
Description=Register the outpost package with dpkg (first boot)
ConditionPathExists=/var/cache/outpost/outpost.deb
# After the agent, not before: the package's postinst starts the agent
# and waits for it, which would never end if the agent waited for this.
After=outpost.service local-fs.target

[Service]
Type=oneshot
Environment=DEBIAN_FRONTEND=noninteractive
# Keeps the config flash-pi.sh wrote, which dpkg has not seen yet.
ExecStart=/usr/bin/dpkg --install --force-confdef --force-confold /var/cache/outpost/outpost.deb
ExecStartPost=/bin/rm -f /var/cache/outpost/outpost.deb /etc/systemd/system/multi-user.target.wants/outpost-firstboot.service /etc/systemd/system/outpost-firstboot.service

[Install]
WantedBy=multi-user.target
EOF
put "$tmp/firstboot" /etc/systemd/system/outpost-firstboot.service 0644
lnk /etc/systemd/system/outpost-firstboot.service "$wants/outpost-firstboot.service"

# has_pkg reports whether the image's dpkg database has NAME installed.
has_pkg() {
	local status
	status=$(rp /var/lib/dpkg/status)
	[[ -f $status ]] && awk -v p="Package: $1" '
		BEGIN { RS = "" }
		{ n = split($0, l, "\n"); pk = st = 0
		  for (i = 1; i <= n; i++) { if (l[i] == p) pk = 1; if (l[i] == "Status: install ok installed") st = 1 }
		  if (pk && st) found = 1 }
		END { exit !found }' "$status"
}
if ! has_pkg containerd.io && ! { has_pkg containerd && has_pkg runc; }; then
	warn "$image has no containerd and runc packages, which outpost needs: until they are installed (apt-get -f install, with a network) the agent runs no pods and outpost-firstboot.service fails at each boot"
fi

if [[ -n $hostname ]]; then
	printf '%s\n' "$hostname" >"$tmp/hostname"
	put "$tmp/hostname" /etc/hostname 0644
	hosts=$(rp /etc/hosts)
	if [[ -f $hosts ]]; then cp "$hosts" "$tmp/hosts.old"; else printf '127.0.0.1\tlocalhost\n' >"$tmp/hosts.old"; fi
	awk -v h="$hostname" '
		$1 == "127.0.1.1" { if (!done) print "127.0.1.1\t" h; done = 1; next }
		{ print }
		END { if (!done) print "127.0.1.1\t" h }' "$tmp/hosts.old" >"$tmp/hosts"
	put "$tmp/hosts" /etc/hosts 0644
fi

if ((${#keys[@]})); then
	# The first user (Pi OS: pi, or the one the first-boot wizard renames
	# it to), else root.
	IFS=: read -r user uid gid home < <(awk -F: '$3 == 1000 { print $1 ":" $3 ":" $4 ":" $6; exit }' "$passwd") || true
	if [[ -z ${user:-} ]]; then
		IFS=: read -r user uid gid home < <(awk -F: '$3 == 0 { print $1 ":" $3 ":" $4 ":" $6; exit }' "$passwd") || true
		user=${user:-root} uid=0 gid=0 home=${home:-/root}
	fi
	[[ $home == /* && $uid =~ ^[0-9]+$ && $gid =~ ^[0-9]+$ ]] || die "$image: /etc/passwd entry of $user is malformed"
	[[ -d $(rp "$home") ]] || mkd "$home" 0700 "$uid:$gid"
	mkd "$home/.ssh" 0700 "$uid:$gid"
	ak=$(rp "$home/.ssh/authorized_keys")
	if [[ -f $ak ]]; then cp "$ak" "$tmp/authorized_keys"; else : >"$tmp/authorized_keys"; fi
	if [[ -s $tmp/authorized_keys && -n $(tail -c 1 "$tmp/authorized_keys") ]]; then echo >>"$tmp/authorized_keys"; fi
	for k in "${keys[@]}"; do
		grep -qxF -- "$k" "$tmp/authorized_keys" || printf '%s\n' "$k" >>"$tmp/authorized_keys"
	done
	put "$tmp/authorized_keys" "$home/.ssh/authorized_keys" 0600 "$uid:$gid"
	# Pi OS enables sshd at boot when the boot partition has a file ssh.
	if ! mt mdir -i "$boot" ::/ssh >/dev/null; then
		: >"$tmp/ssh"
		mt mcopy -i "$boot" "$tmp/ssh" ::/ssh || die "$image: cannot write ssh to partition 1: $mt_err"
		wrote "boot: ssh"
	fi
fi

# The memory cgroup controller, off by default in the Pi kernel: only
# the parameters missing are added; everything else is kept.
add=
read -r -a words <<<"$cmdline"
for want in cgroup_enable=memory cgroup_memory=1; do
	[[ " ${words[*]} " == *" $want "* ]] || add+=" $want"
done
if [[ -n $add ]]; then
	printf '%s%s\n' "$cmdline" "$add" >"$tmp/cmdline.new"
	mt mcopy -D o -i "$boot" "$tmp/cmdline.new" ::/cmdline.txt || die "$image: cannot write cmdline.txt to partition 1: $mt_err"
	wrote "boot: cmdline.txt +$add"
fi

if ((changed)); then
	echo "$prog: $image: $changed changes; write it to the SD card"
else
	echo "$prog: $image: up to date, nothing changed"
fi
