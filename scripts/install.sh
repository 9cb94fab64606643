#!/usr/bin/env bash
# Installs the outpost package that fits this machine: the .deb (apt-get)
# or .rpm (dnf, yum or zypper) built for its architecture, with the
# dependencies it names (containerd, runc). Run it as root on the board,
# with the packages `make packages` built copied next to it:
#
#   install.sh [--dry-run] [DIR|FILE...]
#
# DIR is searched for outpost_*.deb and outpost-*.rpm; a FILE is taken as
# it is. Default: the checkout's dist/ when the script is run from a
# checkout, else the current directory. Of the packages whose format and
# architecture (read from the package, not its name) fit this machine, the
# newest version is installed; the reasons the others do not fit are
# printed when none does. --dry-run prints the machine, the chosen package
# and the commands, and changes nothing (it needs no root).
#
# Architectures: arm64/aarch64 (64-bit ARM), armhf/armv7hl (ARMv7 and later
# with a 32-bit userland, as Raspberry Pi OS 32-bit on a Pi 2, 3, 4 or 5)
# and amd64/x86_64. ARMv6 boards (Pi 1, Zero, Zero W) are refused: the
# binary is built for ARMv7, even though Raspberry Pi OS calls their
# userland armhf too.
#
# Exit status: 0 installed, already installed, or dry run; 1 cannot
# install (the reason is printed); 2 usage error or not root.
#
# For test/packaging/install_test.go only, these replace what the script
# would otherwise ask the machine:
#   OUTPOST_INSTALL_ARCH     the architecture `dpkg --print-architecture`
#                            would print (an rpm or uname -m name works too)
#   OUTPOST_INSTALL_MACHINE  what `uname -m` would print
#   OUTPOST_INSTALL_PKG      deb or rpm: the package format, instead of
#                            looking for dpkg and rpm
set -euo pipefail

prog=install.sh
confdir=/etc/outpost

die() {
	echo "$prog: $*" >&2
	exit 1
}

usage_error() {
	echo "$prog: $*" >&2
	echo "usage: $prog [--dry-run] [DIR|FILE...]   ($prog --help for more)" >&2
	exit 2
}

have() { command -v "$1" >/dev/null 2>&1; }

say() { echo "$prog: $*"; }

usage() {
	cat <<EOF
usage: $prog [--dry-run] [DIR|FILE...]

Installs, as root, the outpost .deb or .rpm that fits this machine's
architecture and package manager, with its dependencies (containerd, runc).

  DIR        searched for outpost_*.deb and outpost-*.rpm
             (default: dist/ of the checkout this script is in, else the
             current directory: $default_dir)
  FILE       a package file to consider
  --dry-run  print the chosen package and the commands; change nothing
  -h, --help this text

Of the packages that fit, the newest version is installed. An older one
than installed is refused; the same one is left as it is.
EOF
}

# script_dir and default_dir: a checkout (packaging/nfpm.yaml beside the
# script's directory) installs from its dist/.
src=${BASH_SOURCE[0]}
if [[ $src == */* ]]; then script_dir=$(cd "${src%/*}" && pwd -P); else script_dir=$(pwd -P); fi
if [[ -f $script_dir/../packaging/nfpm.yaml ]]; then
	default_dir=$(cd "$script_dir/.." && pwd -P)/dist
else
	default_dir=.
fi

dry_run=
args=()
while (($#)); do
	case $1 in
	--dry-run) dry_run=1 ;;
	-h | --help) usage; exit 0 ;;
	--) shift; args+=("$@"); break ;;
	-*) usage_error "unknown option $1" ;;
	*) args+=("$1") ;;
	esac
	shift
done
((${#args[@]})) || args=("$default_dir")

if [[ -z $dry_run && $(id -u) != 0 ]]; then
	echo "$prog: must run as root to install packages: sudo $0 ${args[*]} (or --dry-run to see what it would do)" >&2
	exit 2
fi

if [[ -z $dry_run ]] && [[ -n ${OUTPOST_INSTALL_ARCH:-}${OUTPOST_INSTALL_MACHINE:-}${OUTPOST_INSTALL_PKG:-} ]]; then
	usage_error "OUTPOST_INSTALL_ARCH, _MACHINE and _PKG are for tests: they need --dry-run"
fi

# ---- the machine -------------------------------------------------------

case ${OUTPOST_INSTALL_PKG:-} in
deb | rpm) format=$OUTPOST_INSTALL_PKG ;;
'')
	if have dpkg; then
		format=deb
	elif have rpm; then
		format=rpm
	else
		die "neither dpkg nor rpm is on PATH ($PATH): outpost ships as .deb (Debian, Ubuntu, Raspberry Pi OS) and .rpm (Fedora, openSUSE, RHEL and their kin); on another system copy the binary by hand"
	fi
	;;
*) usage_error "OUTPOST_INSTALL_PKG=$OUTPOST_INSTALL_PKG: want deb or rpm" ;;
esac

machine=${OUTPOST_INSTALL_MACHINE:-$(uname -m)}
if [[ -n ${OUTPOST_INSTALL_ARCH:-} ]]; then
	arch=$OUTPOST_INSTALL_ARCH
	arch_from="OUTPOST_INSTALL_ARCH"
elif [[ $format == deb ]] && have dpkg; then
	arch=$(dpkg --print-architecture)
	arch_from="dpkg --print-architecture"
else
	arch=$machine
	arch_from="uname -m"
fi

armv7_only="outpost is built for ARMv7 and later (Raspberry Pi 2, 3, 4, 5, Zero 2 W); ARMv6 boards (Pi 1, Zero, Zero W) cannot run it"
case $arch in
aarch64 | arm64) deb_arch=arm64 rpm_arch=aarch64 ;;
armhf | armv7l | armv7hl | armv7hnl | armv8l) deb_arch=armhf rpm_arch=armv7hl ;;
x86_64 | amd64) deb_arch=amd64 rpm_arch=x86_64 ;;
armv6* | armv5* | armv4* | armel | arm) die "this machine is $arch ($arch_from): $armv7_only" ;;
*) die "this machine's architecture $arch ($arch_from) is not supported: outpost is packaged for arm64/aarch64, armhf/armv7hl (ARMv7) and amd64/x86_64" ;;
esac
# Raspberry Pi OS's armhf userland also runs on ARMv6 boards, which the
# kernel names armv6l.
if [[ $deb_arch == armhf && $machine == armv6* ]]; then
	die "this machine is $machine (uname -m) with an $arch userland: $armv7_only"
fi
if [[ $format == deb ]]; then want_arch=$deb_arch; else want_arch=$rpm_arch; fi

# installer: the tool that installs a package file with its dependencies;
# dpkg and rpm themselves only when no such tool is here.
if [[ $format == deb ]]; then
	tools=(apt-get dpkg) reader=dpkg-deb
else
	tools=(dnf yum zypper rpm) reader=rpm
fi
installer=
for t in "${tools[@]}"; do
	if have "$t"; then installer=$t; break; fi
done
[[ -n $installer ]] || die "this machine installs .$format packages, but none of ${tools[*]} is on PATH"
have "$reader" || die "$reader is not on PATH: it is needed to read the .$format packages"

# ---- versions ----------------------------------------------------------

# newer A B reports whether package version A is newer than B, as the
# package manager orders them.
newer() {
	if [[ $format == deb ]]; then
		dpkg --compare-versions "$1" gt "$2"
		return
	fi
	local c
	c=$(rpm --eval "%{lua: print(rpm.vercmp('$1', '$2'))}" 2>/dev/null || true)
	case $c in
	1) return 0 ;;
	0 | -1) return 1 ;;
	esac
	if have rpmdev-vercmp; then
		local rc=0
		rpmdev-vercmp "$1" "$2" >/dev/null || rc=$?
		[[ $rc == 11 ]]
		return
	fi
	# Last resort: GNU sort's version order (no ~ handling).
	[[ $1 != "$2" && $(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -n 1) == "$1" ]]
}

# installed_version prints the installed outpost's version, or nothing.
installed_version() {
	if [[ $format == deb ]]; then
		have dpkg-query || return 0
		local s
		s=$(dpkg-query -W -f='${db:Status-Status} ${Version}' outpost 2>/dev/null || true)
		[[ $s == "installed "* ]] && echo "${s#installed }"
	elif rpm -q outpost >/dev/null 2>&1; then
		rpm -q --qf '%|EPOCH?{%{EPOCH}:}:{}|%{VERSION}-%{RELEASE}' outpost
	fi
	return 0
}

# ---- the packages ------------------------------------------------------

# abspath prints FILE's absolute path.
abspath() {
	local d=${1%/*} b=${1##*/}
	[[ $1 == */* ]] || d=.
	echo "$(cd "$d" && pwd -P)/$b"
}

# header FILE prints the package's name, architecture and version, one a
# line, or fails.
header() {
	if [[ $format == deb ]]; then
		# shellcheck disable=SC2016 # dpkg-deb's fields, not the shell's
		dpkg-deb --show --showformat='${Package}\n${Architecture}\n${Version}\n' "$1" 2>&1
	else
		rpm -qp --nosignature --nodigest --qf '%{NAME}\n%{ARCH}\n%|EPOCH?{%{EPOCH}:}:{}|%{VERSION}-%{RELEASE}\n' "$1" 2>&1
	fi
}

fits=() versions=() notes=()
consider() {
	local f=$1 ext
	case $f in
	*.deb) ext=deb ;;
	*.rpm) ext=rpm ;;
	*) notes+=("$f: not a .deb or .rpm file"); return ;;
	esac
	if [[ $ext != "$format" ]]; then
		notes+=("$f: a .$ext; this machine installs .$format packages")
		return
	fi
	local out lines=()
	if out=$(header "$f"); then mapfile -t lines <<<"$out"; fi
	if ((${#lines[@]} != 3)); then
		notes+=("$f: cannot read it as a .$format package: ${out%%$'\n'*}")
		return
	fi
	if [[ ${lines[0]} != outpost ]]; then
		notes+=("$f: package ${lines[0]}, not outpost")
	elif [[ ${lines[1]} != "$want_arch" ]]; then
		notes+=("$f: architecture ${lines[1]}, this machine needs $want_arch")
	else
		fits+=("$(abspath "$f")")
		versions+=("${lines[2]}")
	fi
}

shopt -s nullglob
for i in "${!args[@]}"; do
	a=${args[$i]}
	if [[ -d $a ]]; then
		a=$(cd "$a" && pwd -P) args[i]=$a
		found=("$a"/outpost_*.deb "$a"/outpost-*.rpm)
		for f in "${found[@]}"; do consider "$f"; done
		if ((${#found[@]} == 0)); then
			entries=("$a"/*)
			names=("${entries[@]##*/}")
			if ((${#names[@]} == 0)); then
				notes+=("$a: empty")
			elif ((${#names[@]} <= 20)); then
				notes+=("$a: no outpost_*.deb or outpost-*.rpm; it holds: ${names[*]}")
			else
				notes+=("$a: no outpost_*.deb or outpost-*.rpm; it holds: ${names[*]:0:20} and $((${#names[@]} - 20)) more")
			fi
		fi
	elif [[ -f $a ]]; then
		consider "$a"
	elif [[ $a == "$default_dir" ]]; then
		die "no package directory: $a does not exist; run make packages, or name the directory or files holding the packages"
	else
		die "$a: no such file or directory"
	fi
done

if ((${#fits[@]} == 0)); then
	{
		if ((${#args[@]} == 1)); then where=${args[0]}; else where="the ${#args[@]} paths given"; fi
		echo "$prog: no outpost .$format package for $want_arch in $where:"
		for n in "${notes[@]}"; do echo "  $n"; done
	} >&2
	exit 1
fi

chosen=${fits[0]} version=${versions[0]}
for i in "${!fits[@]}"; do
	if newer "${versions[$i]}" "$version"; then chosen=${fits[$i]} version=${versions[$i]}; fi
done
installed=$(installed_version)

if [[ $arch_from == "uname -m" ]]; then facts="uname -m: $machine"; else facts="$arch_from; uname -m: $machine"; fi
say "this machine: $want_arch ($facts), installs .$format packages with $installer"
say "chosen: $chosen (version $version; installed: ${installed:-none})"
for i in "${!fits[@]}"; do
	[[ ${fits[$i]} == "$chosen" ]] || say "also fits, not newer: ${fits[$i]} (version ${versions[$i]})"
done

# ---- what to run -------------------------------------------------------

# missing_deps prints the chosen .deb's dependency groups that no
# installed package satisfies ("containerd | containerd.io").
missing_deps() {
	local depends group alt ok groups alts
	depends=$(dpkg-deb -f "$chosen" Depends)
	IFS=, read -ra groups <<<"$depends"
	for group in "${groups[@]}"; do
		ok=
		IFS='|' read -ra alts <<<"$group"
		for alt in "${alts[@]}"; do
			alt=${alt%%(*} alt=${alt// /}
			if [[ $(dpkg-query -W -f='${db:Status-Status}' "$alt" 2>/dev/null) == installed ]]; then ok=1; fi
		done
		[[ -n $ok ]] || echo "${group# }"
	done
}

# next_steps tells what to do once outpost is installed: what the
# maintainer scripts (packaging/scripts) did not do.
next_steps() {
	cat <<EOF

outpost $version is installed.

Next:
  1. Edit $confdir/config.yaml: kubeconfig (or bootstrapKubeconfig) to join
     a cluster, nodeName, node labels; or put pod manifests (*.yaml) in
     $confdir/manifests to run standalone. Check it with:
       outpost config check --config $confdir/config.yaml
EOF
	if [[ -d /run/systemd/system ]] && have systemctl; then
		if systemctl is-active --quiet outpost; then
			echo "  2. outpost is running; after editing its config: systemctl restart outpost"
		else
			cat <<EOF
  2. outpost is not running: on a first install the package starts it only
     when the config or the manifests give it something to do. Start it,
     and at every boot: systemctl enable --now outpost
EOF
		fi
	else
		cat <<EOF
  2. systemd is not running here (a container, chroot or image build). On
     the board: systemctl enable --now outpost
EOF
	fi
	echo "  3. See what it does: outpost status"
}

# update and install: the commands to run, as words; update is empty
# when the archive's lists are not needed.
update=() install=()
case $installer in
apt-get)
	if [[ -n $(missing_deps) ]]; then
		# The dependencies come from the archive: make its lists current.
		update=(apt-get update)
	fi
	# A config edited on the board is kept, never asked about. containerd's
	# recommends (criu, and python3 with it: 100 MB) are not needed.
	install=(env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends
		-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$chosen")
	;;
dpkg)
	missing=$(missing_deps)
	if [[ -n $missing ]]; then
		die "$chosen needs $(echo "$missing" | paste -sd, -), not installed, and apt-get is not here to fetch them: install them first"
	fi
	install=(dpkg -i "$chosen")
	;;
dnf | yum) install=("$installer" install -y "$chosen") ;;
zypper) install=(zypper --non-interactive install --allow-unsigned-rpm "$chosen") ;;
rpm) install=(rpm -Uvh "$chosen") ;;
esac

if [[ -n $installed ]]; then
	if [[ $installed == "$version" ]]; then
		say "outpost $version is already installed; nothing to do"
		[[ -n $dry_run ]] || next_steps
		exit 0
	elif newer "$installed" "$version"; then
		die "outpost $installed is installed, newer than $chosen ($version): not downgrading; remove it first, or downgrade with $installer yourself"
	fi
fi

if [[ -n $dry_run ]]; then
	((${#update[@]} == 0)) || say "would run: ${update[*]}"
	say "would run: ${install[*]}"
	say "dry run: nothing changed"
	exit 0
fi

if ((${#update[@]})); then
	say "running: ${update[*]}"
	"${update[@]}" || die "${update[*]} failed (exit $?); outpost $version is not installed"
fi
say "running: ${install[*]}"
"${install[@]}" || die "${install[*]} failed (exit $?); outpost $version is not installed"

now=$(installed_version)
[[ $now == "$version" ]] || die "after installing $chosen, the package manager reports outpost ${now:-not installed}, not $version"

next_steps
