#!/usr/bin/env bash
# Installs nfpm, the packager `make packages` runs, at a pinned version
# from the Go module proxy into the tool cache ($OUTPOST_TOOLS/bin,
# default /var/cache/outpost-testenv/bin), and prints its path. It is
# built with `go install pkg@version`, so its dependencies never enter
# our go.mod. A binary already there at the pinned version is reused.
#
# Pinned to v2.45.0: v2.46 and later need modules under
# go.digitalxero.dev, which the module proxy does not serve.
set -euo pipefail

NFPM_VERSION=${NFPM_VERSION:-v2.45.0}
TOOLS=${OUTPOST_TOOLS:-/var/cache/outpost-testenv}
BIN="$TOOLS/bin"

if [[ "$(cat "$BIN/.nfpm.version" 2>/dev/null)" == "$NFPM_VERSION" && -x "$BIN/nfpm" ]]; then
	echo "$BIN/nfpm"
	exit 0
fi
mkdir -p "$BIN"
echo "packaging: building nfpm $NFPM_VERSION into $BIN" >&2
# Outside the repository, so our go.mod is neither read nor changed.
cd /
GOFLAGS=-mod=mod CGO_ENABLED=0 GOBIN="$BIN" go install -trimpath -ldflags '-s -w' \
	"github.com/goreleaser/nfpm/v2/cmd/nfpm@$NFPM_VERSION" >&2
echo "$NFPM_VERSION" >"$BIN/.nfpm.version"
echo "$BIN/nfpm"
