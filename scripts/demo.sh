#!/usr/bin/env bash
# make demo: outpost's main job on the embedded defaults, on this machine.
# It starts a private containerd (its own socket and root, nothing shared
# with a system containerd), imports the test image, runs the agent
# standalone on examples/, and shows `outpost status` from the running
# agent and then from the store alone. Everything it starts is stopped and
# removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) != 0 ]]; then
	echo "demo: run as root (it starts containerd): sudo make demo" >&2
	exit 1
fi
scripts/testenv/install.sh

TOOLS=${OUTPOST_TOOLS:-/var/cache/outpost-testenv}
DEMO=$(mktemp -d /tmp/outpost-demo.XXXXXX)
SOCK=$DEMO/containerd.sock
pids=()
cleanup() {
	set +e
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
	pkill -9 -f -- "-address $SOCK" 2>/dev/null
	grep -o " $DEMO/[^ ]*" /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null
	rm -rf "$DEMO"
}
trap cleanup EXIT

echo "== starting a private containerd in $DEMO"
cat >"$DEMO/containerd.toml" <<EOT
version = 2
root = "$DEMO/containerd-root"
state = "$DEMO/containerd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
EOT
containerd --config "$DEMO/containerd.toml" --log-level warn >"$DEMO/containerd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do ctr -a "$SOCK" version >/dev/null 2>&1 && break; sleep 0.1; done
ctr -a "$SOCK" version | sed -n 's/^  Version: */containerd /p' | head -1

echo "== importing the test image"
bins=()
for arch in amd64 arm64; do
	[[ -x $TOOLS/busybox/$arch/busybox ]] && bins+=("$arch=$TOOLS/busybox/$arch/busybox")
done
go run ./test/e2e/env/mkimage -o "$DEMO/image.tar" "${bins[@]}"
ctr -a "$SOCK" -n outpost images import --all-platforms "$DEMO/image.tar" >/dev/null
ctr -a "$SOCK" -n outpost images ls -q

echo "== starting the agent (standalone, manifests from examples/)"
cat >"$DEMO/config.yaml" <<EOT
nodeName: outpost-demo
stateDir: $DEMO/state
manifestDir: $PWD/examples
imageDir: $DEMO/images
logDir: $DEMO/logs
runDir: $DEMO/run
containerd:
  address: $SOCK
EOT
bin/outpost config check --config "$DEMO/config.yaml" >/dev/null
bin/outpost agent --config "$DEMO/config.yaml" 2>"$DEMO/agent.log" &
agent=$!
pids+=($agent)
for _ in $(seq 100); do [[ -S $DEMO/state/outpost.sock ]] && break; sleep 0.1; done
sleep 4
sed 's/^/agent log: /' "$DEMO/agent.log"
echo
echo "== outpost status"
bin/outpost status --config "$DEMO/config.yaml"

echo
echo "== stopping the agent; status now reads the store file itself"
kill "$agent" && wait "$agent" || true
bin/outpost status --config "$DEMO/config.yaml"
echo
echo "demo: the desired pods and Service are in the store and survive the agent's"
echo "restart. Running them on containerd and programming nftables for the Service"
echo "are the next capabilities (see the issues); this demo grows with them."
