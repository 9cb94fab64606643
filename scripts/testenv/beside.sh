#!/usr/bin/env bash
# beside.sh CMD [ARGS...]: runs CMD (make test's go test) beside another
# outpost, as on a board that runs one: its own state dir, containerd and
# containerd namespace, but the default pod network namespace prefix
# (outpost-) and cgroup parent (/outpost), so that a test that deletes
# what it did not make would hit it. The outpost runs in a network
# namespace of its own (its bridge and nftables table stay out of the
# host's), with a web pod and a sleeper. After CMD it checks that both
# pods run the same containers, still have their network namespaces, and
# that the web pod answers on its pod IP, and that CMD left no cgroup
# behind; it fails if not, or if CMD did.
# Then it removes what it made, and only that. Not root: CMD alone.
set -euo pipefail
if [[ $(id -u) != 0 ]]; then
	exec "$@"
fi
cd "$(dirname "$0")/../.."
TOOLS=${OUTPOST_TOOLS:-/var/cache/outpost-testenv}
DIR=$(mktemp -d /tmp/outpost-beside.XXXXXX)
SOCK=$DIR/containerd.sock
NETNS=beside-$$
NS=outpost-beside
CFG=$DIR/config.yaml
log() { echo "beside: $*"; }
pids=()
uids=()

# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
	set +e
	for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
	# The containers (each shim's children), then the shims.
	for shim in $(pgrep -f -- "-address $SOCK"); do pkill -9 -P "$shim"; done
	pkill -9 -f -- "-address $SOCK" 2>/dev/null
	sleep 0.5
	rm -rf "/run/containerd/runc/$NS"
	# Its pods' network namespaces and cgroups, by the UIDs it ran.
	for uid in "${uids[@]}"; do
		u=${uid//-/}
		ns=/run/netns/outpost-${u:0:12}
		[[ -e $ns ]] && umount -l "$ns" && rm -f "$ns"
		for h in /sys/fs/cgroup/*/outpost/pod"$uid" /sys/fs/cgroup/outpost/pod"$uid"; do
			[[ -d $h ]] && find "$h" -depth -type d -exec rmdir {} + 2>/dev/null
		done
	done
	ip netns delete "$NETNS" 2>/dev/null
	grep -o " $DIR/[^ ]*" /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null
	rm -rf "$DIR"
}
trap cleanup EXIT

go build -o "$DIR/outpost" ./cmd/outpost
CGO_ENABLED=0 go build -o "$DIR/containerd-shim-outpost-v2" ./cmd/containerd-shim-outpost-v2
cat >"$DIR/containerd.toml" <<EOT
version = 2
root = "$DIR/containerd-root"
state = "$DIR/containerd-state"
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
containerd --config "$DIR/containerd.toml" --log-level warn >"$DIR/containerd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do ctr -a "$SOCK" version >/dev/null 2>&1 && break; sleep 0.1; done
bins=()
for arch in amd64 arm64; do
	[[ -x $TOOLS/busybox/$arch/busybox ]] && bins+=("$arch=$TOOLS/busybox/$arch/busybox")
done
go run ./test/e2e/env/mkimage -o "$DIR/image.tar" "${bins[@]}"
ctr -a "$SOCK" -n "$NS" images import --all-platforms "$DIR/image.tar" >/dev/null

mkdir -p "$DIR/manifests"
cat >"$DIR/manifests/pods.yaml" <<'EOT'
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  containers:
  - name: httpd
    image: outpost.test/busybox:1.35
    command: [sh, -c, "mkdir -p /www && echo beside > /www/index.html && exec httpd -f -p 8080 -h /www"]
---
apiVersion: v1
kind: Pod
metadata: {name: sleeper}
spec:
  containers:
  - name: main
    image: outpost.test/busybox:1.35
    command: [sh, -c, "while true; do sleep 1; done"]
EOT
cat >"$CFG" <<EOT
nodeName: beside-$$
stateDir: $DIR/state
manifestDir: $DIR/manifests
imageDir: $DIR/images
logDir: $DIR/logs
runDir: $DIR/run
containerd:
  address: $SOCK
  namespace: $NS
server:
  address: ""
EOT
ip netns add "$NETNS"
ip netns exec "$NETNS" ip link set lo up
# nsenter enters the network namespace only: the agent's netns
# bind-mounts must be seen by containerd.
nsenter --net="/run/netns/$NETNS" "$DIR/outpost" agent --config "$CFG" >"$DIR/agent.log" 2>&1 &
pids+=($!)

# state prints, per pod, its UID, IP and running container IDs.
state() {
	"$DIR/outpost" status --config "$CFG" -o json 2>/dev/null | python3 -c '
import json, sys
s = json.load(sys.stdin)
if s.get("from") != "agent":
    sys.exit(1)
for p in sorted(s["pods"], key=lambda p: p["name"]):
    st = p.get("status") or {}
    ids = sorted(c["containerID"] for c in st.get("containerStatuses", []) if "running" in c.get("state", {}))
    print(p["name"], p["uid"], st.get("podIP", "-"), ",".join(ids) or "-")' 2>/dev/null
}
before=
for _ in $(seq 120); do
	before=$(state || true)
	if [[ $(grep -c ' containerd://' <<<"$before") == 2 ]] && ! grep -q ' - ' <<<"$before"; then
		break
	fi
	before=
	sleep 0.5
done
if [[ -z $before ]]; then
	log "the outpost beside the tests did not start its pods; its log:"
	tail -20 "$DIR/agent.log"
	exit 1
fi
mapfile -t uids < <(awk '{print $2}' <<<"$before")
ip=$(awk '$1 ~ /^web/ {print $3}' <<<"$before")
log "an outpost runs beside the tests in netns $NETNS (pod netns prefix outpost-, cgroup parent /outpost): web at $ip"

# The cgroups made under any outpost parent, to see what the tests leave.
cgroups() { find /sys/fs/cgroup -path '*outpost*' -type d 2>/dev/null | sort; }
cgroups >"$DIR/cgroups.before"

rc=0
"$@" || rc=$?

after=$(state || true)
bad=0
if [[ $after != "$before" ]]; then
	log "FAIL: its pods changed while the tests ran"
	log "before: $before"
	log "after:  ${after:-the agent does not answer}"
	bad=1
fi
for uid in "${uids[@]}"; do
	u=${uid//-/}
	if [[ ! -e /run/netns/outpost-${u:0:12} ]]; then
		log "FAIL: the network namespace of pod $uid was deleted"
		bad=1
	fi
done
if page=$(ip netns exec "$NETNS" curl -sS --max-time 5 "http://$ip:8080/") && [[ $page == beside ]]; then
	log "its pods ran through the tests untouched, and web answered on $ip"
else
	log "FAIL: web does not answer on $ip: ${page:-}"
	bad=1
fi
cgroups >"$DIR/cgroups.after"
left=$(comm -13 "$DIR/cgroups.before" "$DIR/cgroups.after")
if [[ -n $left ]]; then
	log "FAIL: the tests left $(wc -l <<<"$left") cgroups behind:"
	head -10 <<<"$left" | sed 's/^/beside:   /'
	bad=1
fi
if ((bad)); then
	tail -20 "$DIR/agent.log" | sed 's/^/beside: agent log: /'
	exit 1
fi
exit "$rc"
