#!/usr/bin/env bash
# Builds what `make conformance` runs, from the Go module proxy, into
# $OUTPOST_TOOLS/conformance/bin (default /var/cache/outpost-testenv),
# cached there: Kubernetes' e2e.test, the ginkgo CLI, agnhost and
# kube-scheduler at $KUBE_VERSION, and the small test binaries the
# substitute images need (pause, nnp). etcd, kube-apiserver,
# kube-controller-manager, kubectl and the registry come from `make
# testenv` (scripts/testenv/build-tools.sh). The module that pins the
# versions is scripts/conformance/src (its go.sum is the reference
# harness's); a binary already built at the pinned version is not built
# again. The first build takes 20 to 40 minutes on 2 cores.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
KUBE_VERSION=v1.37.2
TOOLS=${OUTPOST_TOOLS:-/var/cache/outpost-testenv}
BIN=$TOOLS/conformance/bin
SRC=$TOOLS/src/conformance-$KUBE_VERSION
mkdir -p "$BIN"
rm -rf "$SRC" && mkdir -p "$SRC" && cp -r "$HERE/src/." "$SRC/"
cd "$SRC"
export GOFLAGS="-buildvcs=false -mod=readonly" GOTOOLCHAIN=local
minor=${KUBE_VERSION#v1.}
minor=${minor%%.*}
LDF="-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"

# build NAME CMD...: runs CMD unless NAME is in $BIN at $KUBE_VERSION.
build() {
	local name=$1
	shift
	if [[ -x $BIN/$name && $(cat "$BIN/.$name.version" 2>/dev/null) == "$KUBE_VERSION" ]]; then
		return
	fi
	echo "conformance: building $name $KUBE_VERSION"
	local start=$SECONDS
	"$@"
	echo "$KUBE_VERSION" >"$BIN/.$name.version"
	echo "conformance: $name built in $((SECONDS - start))s"
}
build pause env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN/pause" ./cmd/pause
build nnp env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN/nnp" ./cmd/nnp
build ginkgo go build -trimpath -o "$BIN/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
build agnhost env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN/agnhost" k8s.io/kubernetes/test/images/agnhost
build kube-scheduler go build -trimpath -ldflags "$LDF" -o "$BIN/kube-scheduler" k8s.io/kubernetes/cmd/kube-scheduler
build e2e.test go test -c -vet=off -trimpath -ldflags "$LDF" -o "$BIN/e2e.test" k8s.io/kubernetes/test/e2e
# The agnhost image's https hook handler serves this pair.
cp "$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)"/test/images/agnhost/porter/localhost.{crt,key} "$BIN/"
echo "conformance: tools in $BIN"
