#!/usr/bin/env bash
# Prints the size of the stripped static binary per target and the agent's
# resident memory after start with the examples recorded.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'kill $agent 2>/dev/null || true; rm -rf "$tmp"' EXIT
agent=
echo "binary size (CGO_ENABLED=0 -tags grpcnotrace -trimpath -ldflags '-s -w'):"
for t in linux/arm64 linux/arm linux/amd64; do
	CGO_ENABLED=0 GOOS=${t%/*} GOARCH=${t#*/} GOARM=7 go build -tags grpcnotrace -trimpath -ldflags '-s -w' -o "$tmp/outpost" ./cmd/outpost
	stat -c %s "$tmp/outpost" | awk -v t="$t" '{printf "  %-12s %6.1f MiB\n", t, $1/1048576}'
done
CGO_ENABLED=0 go build -tags grpcnotrace -trimpath -ldflags '-s -w' -o "$tmp/outpost" ./cmd/outpost
printf 'stateDir: %s/state\nmanifestDir: %s/examples\nnodeName: bench\nlog: {level: warn}\n' "$tmp" "$PWD" >"$tmp/config.yaml"
"$tmp/outpost" agent --record-only --config "$tmp/config.yaml" &
agent=$!
for _ in $(seq 100); do [[ -S $tmp/state/outpost.sock ]] && break; sleep 0.1; done
sleep 2
echo "agent idle RSS, --record-only, examples/ recorded: $(awk '/VmRSS/ {printf "%.1f MiB", $2/1024}' /proc/$agent/status)"
