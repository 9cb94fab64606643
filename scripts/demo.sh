#!/usr/bin/env bash
# make demo: outpost's main job on the embedded defaults, on this machine.
# It starts a private containerd (its own socket and root, nothing shared
# with a system containerd), imports the test image, runs the agent
# standalone on examples/ (a web server with probes and a ConfigMap
# volume, a Service in front of it, a sampler, a crash loop), fetches the
# web page from the pod's IP and through the Service's cluster IP, shows
# `outpost status`, `outpost logs`, the kubelet API with an admin client
# certificate (logs, metrics, and a 401 without one), then kills the agent and starts it
# again to show the same containers still running and the Service still
# answering. Everything it
# starts is stopped and removed on exit: containers, pod network
# namespaces, the outpost0 bridge and the outpost nftables table.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) != 0 ]]; then
	echo "demo: run as root (it starts containerd): sudo make demo" >&2
	exit 1
fi
scripts/testenv/install.sh

TOOLS=${OUTPOST_TOOLS:-/var/cache/outpost-testenv}
# The demo's agent runs in this host's network namespace with the
# default bridge and nftables table: an outpost already running here
# owns them.
if ip link show outpost0 >/dev/null 2>&1 || nft list table inet outpost >/dev/null 2>&1; then
	echo "demo: this host has an outpost0 bridge or an outpost nftables table already (an outpost runs here?); stop it first, the demo would take them over" >&2
	exit 1
fi
DEMO=$(mktemp -d /tmp/outpost-demo.XXXXXX)
SOCK=$DEMO/containerd.sock
pids=()
cleanup() {
	set +e
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
	# Containers: kill the shims' children (each container's init), then the shims.
	for shim in $(pgrep -f -- "-address $SOCK"); do pkill -9 -P "$shim"; done
	pkill -9 -f -- "-address $SOCK" 2>/dev/null
	rm -rf /run/containerd/runc/outpost-demo
	# What the demo made, and only that: its pods' namespaces and
	# cgroups by their prefix and parent, and the bridge and table it
	# found absent.
	for ns in /run/netns/outpost-demo-*; do [[ -e $ns ]] && umount -l "$ns" && rm -f "$ns"; done
	for cg in /sys/fs/cgroup/*/outpost-demo /sys/fs/cgroup/outpost-demo; do
		[[ -d $cg ]] && find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
	done
	ip link del outpost0 2>/dev/null
	nft delete table inet outpost 2>/dev/null
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
ctr -a "$SOCK" -n outpost-demo images import --all-platforms "$DEMO/image.tar" >/dev/null
ctr -a "$SOCK" -n outpost-demo images ls -q

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
  namespace: outpost-demo
  cgroupParent: /outpost-demo
network:
  netnsPrefix: outpost-demo-
server:
  clientCAFile: $DEMO/ca.crt
EOT
# A CA for the kubelet API's client certificates, and an admin's
# certificate from it (group system:masters, server.localGroups' default).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=outpost-demo-ca \
	-keyout "$DEMO/ca.key" -out "$DEMO/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/O=system:masters/CN=demo-admin" \
	-keyout "$DEMO/admin.key" -out "$DEMO/admin.csr" 2>/dev/null
openssl x509 -req -in "$DEMO/admin.csr" -CA "$DEMO/ca.crt" -CAkey "$DEMO/ca.key" -CAcreateserial -days 1 \
	-extfile <(echo extendedKeyUsage=clientAuth) -out "$DEMO/admin.crt" 2>/dev/null
bin/outpost config check --config "$DEMO/config.yaml" >/dev/null
start_agent() {
	bin/outpost agent --config "$DEMO/config.yaml" 2>>"$DEMO/agent.log" &
	agent=$!
	pids+=("$agent")
}
status_json() { bin/outpost status --config "$DEMO/config.yaml" -o json 2>/dev/null; }
# pod_field POD FIELD: a field of a pod's status from the running agent.
pod_ready() {
	status_json | python3 -c '
import json,sys
try:
    s=json.load(sys.stdin)
except ValueError:
    sys.exit(0)  # the agent is not answering yet
for p in s["pods"]:
    if p["name"]==sys.argv[1] and p.get("status"):
        print(p["status"].get("podIP",""), all(c.get("ready") for c in p["status"].get("containerStatuses",[])))' "$1"
}
start_agent
echo -n "waiting for the web pod to be ready"
for _ in $(seq 60); do
	read -r ip ok < <(pod_ready web-outpost-demo) || true
	[[ ${ok:-} == True ]] && break
	echo -n .
	sleep 0.5
done
echo
sed 's/^/agent log: /' "$DEMO/agent.log" | grep -v 'level=DEBUG' | head -20
echo
echo "== outpost status"
bin/outpost status --config "$DEMO/config.yaml"
echo
echo "== the web page, fetched from the pod's IP ($ip)"
timeout 5 busybox wget -q -O - "http://$ip:8080/"
echo
echo "== the same page through the Service web, on its cluster IP (10.43.0.80:80, nftables)"
timeout 5 busybox wget -q -O - "http://10.43.0.80/"
echo
echo "== outpost logs sensor"
sleep 1
bin/outpost logs sensor-outpost-demo --config "$DEMO/config.yaml" | tail -3
echo
echo "== the kubelet API on :10250 (what kubectl logs, exec and top go through), with the admin certificate"
api() { curl -sS --cacert "$DEMO/state/pki/outpost-serving.crt" --cert "$DEMO/admin.crt" --key "$DEMO/admin.key" "https://127.0.0.1:10250$1"; }
echo "\$ GET /containerLogs/default/sensor-outpost-demo/sampler?tailLines=2"
api "/containerLogs/default/sensor-outpost-demo/sampler?tailLines=2"
echo "\$ GET /metrics (some of it)"
api /metrics | grep -E '^(outpost_pods|outpost_proxy_service_ports|go_goroutines|process_resident_memory_bytes)[ {]' || true
echo "\$ GET /pods without a certificate"
curl -sS --cacert "$DEMO/state/pki/outpost-serving.crt" https://127.0.0.1:10250/pods
echo
echo "== waiting 12 s for the crash loop to restart and back off"
sleep 12
bin/outpost status --config "$DEMO/config.yaml" default/crashloop-outpost-demo
echo
echo "== killing the agent with SIGKILL and starting it again: the same containers keep running"
before=$(status_json | python3 -c 'import json,sys; print(sorted(c["containerID"] for p in json.load(sys.stdin)["pods"] if p.get("status") for c in p["status"].get("containerStatuses",[]) if c.get("state",{}).get("running") and p["name"]!="crashloop-outpost-demo"))')
kill -9 "$agent"; wait "$agent" 2>/dev/null || true
start_agent
for _ in $(seq 40); do status_json >/dev/null && break; sleep 0.25; done
sleep 1
after=$(status_json | python3 -c 'import json,sys; print(sorted(c["containerID"] for p in json.load(sys.stdin)["pods"] if p.get("status") for c in p["status"].get("containerStatuses",[]) if c.get("state",{}).get("running") and p["name"]!="crashloop-outpost-demo"))')
echo "before: $before"
echo "after:  $after"
[[ $before == "$after" ]] && echo "same containers: nothing was restarted" || echo "containers differ!"
echo -n "the Service across the restart: "
timeout 5 busybox wget -q -O - "http://10.43.0.80/"
echo
echo "== stopping the agent; status now reads the store file itself"
kill "$agent" && wait "$agent" || true
bin/outpost status --config "$DEMO/config.yaml"
echo
echo "demo: pods ran from the local store with no API server and no registry."
