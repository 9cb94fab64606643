#!/usr/bin/env bash
# Builds the pinned tools the end-to-end tests run: etcd, kube-apiserver,
# kube-controller-manager, kubectl, metrics-server, distribution's OCI
# registry, containerd 2 with its runc shim (in a directory of their
# own, so that the tests' containerd stays the distribution's 1.6
# unless a test asks for 2), and nfpm for the package test
# (scripts/packaging/tools.sh), from the Go module proxy, into a cache
# directory outside the repository ($OUTPOST_TOOLS, default
# /var/cache/outpost-testenv). A tool already present at its pinned
# version is not rebuilt.
#
# With the argument kube-proxy it builds only kube-proxy (for the service
# proxy benchmark, `make bench`), and with peers kube-proxy and kubelet
# (for `make bench-peers`): `make test` needs neither.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)

KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
REGISTRY_VERSION=${REGISTRY_VERSION:-v3.1.2}
METRICS_SERVER_VERSION=${METRICS_SERVER_VERSION:-v0.8.0}
CONTAINERD2_VERSION=${CONTAINERD2_VERSION:-v2.3.7}
TOOLS=${OUTPOST_TOOLS:-/var/cache/outpost-testenv}
BIN="$TOOLS/bin"
mkdir -p "$BIN" "$TOOLS/src"
export GOFLAGS=-mod=mod
export CGO_ENABLED=0

stamp() { cat "$BIN/.$1.version" 2>/dev/null || true; }

build_kube() {
	if [[ "$(stamp kube)" == "$KUBE_VERSION" && -x "$BIN/kube-apiserver" && -x "$BIN/kubectl" && -x "$BIN/kube-controller-manager" ]]; then
		echo "testenv: kube-apiserver, kube-controller-manager and kubectl $KUBE_VERSION already built"
		return
	fi
	local src="$TOOLS/src/kube-$KUBE_VERSION"
	rm -rf "$src" && mkdir -p "$src" && cd "$src"
	echo "testenv: building kube-apiserver, kube-controller-manager and kubectl $KUBE_VERSION (first time takes several minutes)"
	local staging="v0${KUBE_VERSION#v1}"
	local kmod
	kmod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
	{
		echo "module outpost.test/kubetools"
		echo
		grep -E '^go [0-9]' "$kmod"
		echo
		echo "require k8s.io/kubernetes $KUBE_VERSION"
		echo
		# Every staging module k8s.io/kubernetes replaces with ./staging maps
		# to the published module of the matching version.
		grep -Eo '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$kmod" |
			awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
	} >go.mod
	cat >tools.go <<'EOT'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
EOT
	go mod tidy >/dev/null 2>&1 || true
	go build -trimpath -ldflags '-s -w' -o "$BIN/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
	go build -trimpath -ldflags '-s -w' -o "$BIN/kubectl" k8s.io/kubernetes/cmd/kubectl
	go build -trimpath -ldflags '-s -w' -o "$BIN/kube-controller-manager" k8s.io/kubernetes/cmd/kube-controller-manager
	echo "$KUBE_VERSION" >"$BIN/.kube.version"
}

# build_kube_cmd NAME builds k8s.io/kubernetes/cmd/NAME (kube-proxy,
# kubelet) in the module build_kube sets up, stamped with the release's
# version: kubelet reports it to the API server, which checks it against
# the node's.
build_kube_cmd() {
	local name=$1 src="$TOOLS/src/kube-$KUBE_VERSION"
	if [[ "$(stamp "$name")" == "$KUBE_VERSION" && -x "$BIN/$name" && -f "$src/go.mod" ]]; then
		echo "testenv: $name $KUBE_VERSION already built"
		return
	fi
	build_kube
	cd "$src"
	grep -q "cmd/$name\"" tools.go || sed -i "s|^\t_ \"k8s.io/kubernetes/cmd/kubectl\"|&\n\t_ \"k8s.io/kubernetes/cmd/$name\"|" tools.go
	echo "testenv: building $name $KUBE_VERSION"
	local v=${KUBE_VERSION#v} ldf="-s -w"
	ldf+=" -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=${v%%.*}"
	v=${v#*.}
	ldf+=" -X k8s.io/component-base/version.gitMinor=${v%%.*} -X k8s.io/component-base/version.gitTreeState=clean"
	go build -trimpath -ldflags "$ldf" -o "$BIN/$name" "k8s.io/kubernetes/cmd/$name"
	echo "$KUBE_VERSION" >"$BIN/.$name.version"
}

build_etcd() {
	if [[ "$(stamp etcd)" == "$ETCD_VERSION" && -x "$BIN/etcd" ]]; then
		echo "testenv: etcd $ETCD_VERSION already built"
		return
	fi
	local src="$TOOLS/src/etcd-$ETCD_VERSION"
	rm -rf "$src" && mkdir -p "$src" && cd "$src"
	echo "testenv: building etcd $ETCD_VERSION"
	cat >go.mod <<EOT
module outpost.test/etcd

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOT
	cat >main.go <<'EOT'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOT
	go mod tidy >/dev/null
	go build -trimpath -ldflags '-s -w' -o "$BIN/etcd" .
	echo "$ETCD_VERSION" >"$BIN/.etcd.version"
}

build_registry() {
	if [[ "$(stamp registry)" == "$REGISTRY_VERSION" && -x "$BIN/registry" ]]; then
		echo "testenv: registry $REGISTRY_VERSION already built"
		return
	fi
	echo "testenv: building registry $REGISTRY_VERSION"
	# The module has no replace directives, so go install builds it with
	# exactly the versions its own go.mod and go.sum pin.
	GOBIN="$BIN" go install -trimpath -ldflags '-s -w' \
		"github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"
	echo "$REGISTRY_VERSION" >"$BIN/.registry.version"
}

build_metrics_server() {
	if [[ "$(stamp metrics-server)" == "$METRICS_SERVER_VERSION" && -x "$BIN/metrics-server" ]]; then
		echo "testenv: metrics-server $METRICS_SERVER_VERSION already built"
		return
	fi
	local src="$TOOLS/src/metrics-server-$METRICS_SERVER_VERSION"
	rm -rf "$src" && mkdir -p "$src" && cd "$src"
	echo "testenv: building metrics-server $METRICS_SERVER_VERSION"
	# A module of its own requiring only metrics-server: it has no replace
	# directives, so the build list is the one its own go.mod pins.
	go mod init outpost.test/metrics-server >/dev/null 2>&1
	go get "sigs.k8s.io/metrics-server@$METRICS_SERVER_VERSION" >/dev/null
	go build -trimpath -ldflags '-s -w' -o "$BIN/metrics-server" sigs.k8s.io/metrics-server/cmd/metrics-server
	echo "$METRICS_SERVER_VERSION" >"$BIN/.metrics-server.version"
}

# build_containerd2 builds containerd 2 and its runc shim into
# $TOOLS/containerd2/bin, for test/e2e's TestE2EContainerd2: the
# containerd.io package installs 2.x, whose runc shim answers a start
# differently from 1.6's.
build_containerd2() {
	local dir="$TOOLS/containerd2/bin"
	if [[ "$(cat "$dir/.version" 2>/dev/null || true)" == "$CONTAINERD2_VERSION" && -x "$dir/containerd" && -x "$dir/containerd-shim-runc-v2" ]]; then
		echo "testenv: containerd $CONTAINERD2_VERSION already built"
		return
	fi
	echo "testenv: building containerd $CONTAINERD2_VERSION and its runc shim"
	mkdir -p "$dir"
	# No replace directives in containerd's go.mod: go install builds
	# with the versions it pins. Without cgo, as the other tools.
	GOBIN="$dir" go install -trimpath -ldflags '-s -w' -tags 'no_btrfs no_devmapper no_zfs' \
		"github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD2_VERSION" \
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD2_VERSION"
	echo "$CONTAINERD2_VERSION" >"$dir/.version"
}

if [[ "${1:-}" == peers ]]; then
	build_kube_cmd kube-proxy
	build_kube_cmd kubelet
	echo "testenv: kube-proxy and kubelet in $BIN"
	exit 0
fi
if [[ "${1:-}" == kube-proxy ]]; then
	build_kube_cmd kube-proxy
	echo "testenv: kube-proxy in $BIN"
	exit 0
fi
build_etcd
build_kube
build_metrics_server
build_registry
build_containerd2
"$HERE/../packaging/tools.sh" >/dev/null
echo "testenv: tools in $BIN"
