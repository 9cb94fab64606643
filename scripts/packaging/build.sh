#!/usr/bin/env bash
# Builds the outpost .deb and .rpm packages from make build-all's
# binaries with nfpm (pinned, see tools.sh). Run from the repository root,
# as `make packages` does:
#
#   scripts/packaging/build.sh [DIST]
#
# DIST (default dist) holds outpost-linux-{arm64,arm-v7,amd64} and
# containerd-shim-outpost-v2-linux-{arm64,arm-v7,amd64}; the
# packages are written there too, or to $OUT:
#   outpost_<version>-1_{arm64,armhf,amd64}.deb
#   outpost-<version>-1.{aarch64,armv7hl,x86_64}.rpm
# VERSION (the Makefile's git describe) gives <version>; ARCHES (default
# "arm64 arm7 amd64") and FORMATS (default "deb rpm") narrow the build.
#
#   scripts/packaging/build.sh --print-version DESCRIBE
# prints the package version for a git describe string and exits.
set -euo pipefail

# commit_time prints HEAD's commit time, UTC, as YYYYMMDDHHMMSS.
commit_time() {
	TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S 2>/dev/null || echo 0
}

# pkg_version turns `git describe --tags --always --dirty` output into a
# deb and rpm version that sorts as the builds were made:
#   v1.2.0             -> 1.2.0
#   v1.2.0-rc.1        -> 1.2.0~rc.1              (before 1.2.0)
#   v1.2.0-5-gabc1234  -> 1.2.0+git5.abc1234      (after 1.2.0, before 1.2.1)
#   abc1234 (no tag)   -> 0.0.0~git<commit time>.abc1234
#   ...-dirty          -> the above, then .dirty (or +dirty after a tag)
pkg_version() {
	local d=$1 dirty= n= sha= v
	if [[ $d == *-dirty ]]; then dirty=1; d=${d%-dirty}; fi
	if [[ $d =~ ^(.*)-([0-9]+)-g([0-9a-f]+)$ ]]; then
		d=${BASH_REMATCH[1]} n=${BASH_REMATCH[2]} sha=${BASH_REMATCH[3]}
	fi
	if [[ $d =~ ^v?[0-9]+\.[0-9]+ ]]; then
		v=${d#v}
		if [[ $v == *-* ]]; then v=${v%%-*}~${v#*-}; fi
		v=${v//-/.}
		if [[ -n $n ]]; then v=$v+git$n.$sha; fi
		if [[ -n $dirty ]]; then
			if [[ $v == *+* ]]; then v=$v.dirty; else v=$v+dirty; fi
		fi
	elif [[ $d =~ ^[0-9a-f]{4,}$ ]]; then
		v=0.0.0~git$(commit_time).$d
		if [[ -n $dirty ]]; then v=$v.dirty; fi
	else
		v=0.0.0~dev
	fi
	if [[ ! $v =~ ^[0-9][A-Za-z0-9.+~]*$ ]]; then
		echo "packaging: cannot make a package version of $1 (got $v)" >&2
		return 1
	fi
	echo "$v"
}

if [[ ${1:-} == --print-version ]]; then
	pkg_version "$2"
	exit
fi

DIST=${1:-dist}
OUT=${OUT:-$DIST}
ARCHES=${ARCHES:-arm64 arm7 amd64}
FORMATS=${FORMATS:-deb rpm}
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
export OUTPOST_MAINTAINER=${OUTPOST_MAINTAINER:-outpost maintainers <outpost-edge@users.noreply.github.com>}

nfpm=$(scripts/packaging/tools.sh)
OUTPOST_VERSION=$(pkg_version "$VERSION")
export OUTPOST_VERSION
# File times in the packages are the commit's, so a rebuild is identical.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH

OUTPOST_WORK=$(mktemp -d)
export OUTPOST_WORK
trap 'rm -rf "$OUTPOST_WORK"' EXIT
# Debian wants a changelog in every package; this one names the build.
{
	echo "outpost ($OUTPOST_VERSION-1) unstable; urgency=medium"
	echo
	echo "  * Built from $VERSION."
	echo
	echo " -- $OUTPOST_MAINTAINER  $(LC_ALL=C date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n >"$OUTPOST_WORK/changelog.Debian.gz"
touch -d "@$SOURCE_DATE_EPOCH" "$OUTPOST_WORK/changelog.Debian.gz"

mkdir -p "$OUT"
for arch in $ARCHES; do
	case $arch in
	arm64) bin=outpost-linux-arm64 ;;
	arm7) bin=outpost-linux-arm-v7 ;;
	amd64) bin=outpost-linux-amd64 ;;
	*) echo "packaging: unknown architecture $arch (arm64, arm7, amd64)" >&2; exit 2 ;;
	esac
	export OUTPOST_ARCH=$arch OUTPOST_BINARY=$DIST/$bin OUTPOST_SHIM_BINARY=$DIST/containerd-shim-outpost-v2-${bin#outpost-}
	for b in "$OUTPOST_BINARY" "$OUTPOST_SHIM_BINARY"; do
		if [[ ! -f $b ]]; then
			echo "packaging: $b missing; run make build-all" >&2
			exit 1
		fi
	done
	for format in $FORMATS; do
		"$nfpm" package --config packaging/nfpm.yaml --packager "$format" --target "$OUT/" | sed 's/^/packaging: /'
	done
done
