#!/usr/bin/env bash
# Pod benchmarks (root): 30 pods on a private containerd, the agent in a
# network namespace of its own. Prints
#   - cold start: agent start → all 30 pods running, and ready
#   - offline reboot: agent, containerd, shims and containers killed,
#     runtime state and network wiped, no registry → all 30 back
#   - agent RSS idle with 30 pods, and its CPU over 60 s with readiness
#     probes every 10 s
#   - bytes the agent wrote to disk in 60 s of steady state, per hour
# Usage: scripts/bench-pods.sh [PODS]
# BENCH_SHIM_GROUPS=N sets containerd.shimGroups (default 4).
# BENCH_STEADY=SECONDS sets the steady-state window (default 60).
# BENCH_LOG=info|debug sets the agent's log level; BENCH_KEEP_LOG=FILE keeps
# its log (with GODEBUG=gctrace=1 in the environment, the GC trace too).
# BENCH_TAGS=outpostpprof builds the agent so SIGUSR1 writes a heap profile
# to $OUTPOST_HEAPPROFILE.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) == 0 ]] || { echo "bench-pods: run as root" >&2; exit 1; }
PODS=${1:-30}
STEADY=${BENCH_STEADY:-60}
TOOLS=${OUTPOST_TOOLS:-/var/cache/outpost-testenv}
B=$(mktemp -d /tmp/outpost-bench.XXXXXX)
SOCK=$B/containerd.sock
NETNS=outpost-bench-$$
NS=outpost-bench
CGO_ENABLED=0 go build -tags "grpcnotrace ${BENCH_TAGS:-}" -trimpath -ldflags '-s -w' -o "$B/outpost" ./cmd/outpost
ctrd_pid= agent=
kill_all() {
	[[ -n $agent ]] && kill -9 "$agent" 2>/dev/null && wait "$agent" 2>/dev/null || true
	agent=
	for shim in $(pgrep -f -- "-address $SOCK"); do pkill -9 -P "$shim" || true; done
	pkill -9 -f -- "-address $SOCK" || true
	[[ -n $ctrd_pid ]] && kill -9 "$ctrd_pid" 2>/dev/null && wait "$ctrd_pid" 2>/dev/null || true
	ctrd_pid=
}
cleanup() {
	set +e
	kill_all
	[[ -n ${BENCH_KEEP_LOG:-} ]] && cp "$B/agent.log" "$BENCH_KEEP_LOG"
	grep -o " $B/[^ ]*" /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l
	for n in /run/netns/outpost-*; do [[ $n == */$NETNS ]] && continue; [[ -e $n ]] && umount -l "$n" && rm -f "$n"; done
	ip netns delete "$NETNS" 2>/dev/null
	rm -rf "$B" "/run/containerd/runc/$NS"
	[[ -n $ACCT ]] && rmdir "$ACCT"
}
trap cleanup EXIT
cat >"$B/containerd.toml" <<EOT
version = 2
root = "$B/containerd-root"
state = "$B/containerd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
EOT
# On cgroup v1, containerd (and the shims and runc it starts) runs in a
# cpuacct group of its own so the bench can say what a start cost there.
ACCT=/sys/fs/cgroup/cpuacct/outpost-bench-$$
[[ -d /sys/fs/cgroup/cpuacct ]] && mkdir -p "$ACCT" || ACCT=
acct_ms() { [[ -n $ACCT ]] && awk '{printf "%.2f", $1 / 1e9}' "$ACCT/cpuacct.usage" || echo "?"; }
start_containerd() {
	(
		[[ -n $ACCT ]] && echo "$BASHPID" >"$ACCT/cgroup.procs"
		exec containerd --config "$B/containerd.toml" --log-level error >>"$B/containerd.log" 2>&1
	) &
	ctrd_pid=$!
	for _ in $(seq 100); do ctr -a "$SOCK" version >/dev/null 2>&1 && return; sleep 0.1; done
	echo "containerd did not start" >&2; exit 1
}
new_netns() {
	ip netns delete "$NETNS" 2>/dev/null || true
	ip netns add "$NETNS"
	ip netns exec "$NETNS" ip link set lo up
}
start_containerd
new_netns
go run ./test/e2e/env/mkimage -o "$B/image.tar" "amd64=$TOOLS/busybox/amd64/busybox" >/dev/null
ctr -a "$SOCK" -n "$NS" images import "$B/image.tar" >/dev/null
mkdir -p "$B/manifests"
for i in $(seq 1 "$PODS"); do
	cat >"$B/manifests/p$i.yaml" <<EOT
apiVersion: v1
kind: Pod
metadata: {name: p$i}
spec:
  containers:
  - name: web
    image: outpost.test/busybox:1.35
    command: [httpd, -f, -p, "8080", -h, /var/www]
    readinessProbe:
      httpGet: {path: /, port: 8080}
      periodSeconds: 10
EOT
done
cat >"$B/config.yaml" <<EOT
nodeName: bench
stateDir: $B/state
manifestDir: $B/manifests
logDir: $B/logs
runDir: $B/run
containerd: {address: $SOCK, namespace: $NS, shimGroups: ${BENCH_SHIM_GROUPS:-4}}
log: {level: ${BENCH_LOG:-warn}}
EOT
start_agent() {
	nsenter --net=/run/netns/$NETNS "$B/outpost" agent --config "$B/config.yaml" 2>>"$B/agent.log" &
	agent=$!
}
# count_pods WHAT prints how many pods the running agent reports with every
# container running, or ready.
count_pods() {
	"$B/outpost" status -o json --config "$B/config.yaml" 2>/dev/null | jq --arg key "$1" '
	[.pods[] | select(.synced and ((.status.containerStatuses // []) | length > 0) and
		all(.status.containerStatuses[]; if $key == "ready" then .ready == true else .state.running != null end))] | length' 2>/dev/null || echo 0
}
# wait_pods T0 WHAT prints the seconds from T0 until all pods are WHAT.
wait_pods() {
	local t0=$1
	for _ in $(seq 1200); do
		if [[ $(count_pods "$2") == "$PODS" ]]; then
			awk -v t0="$t0" -v t1="$(date +%s.%N)" 'BEGIN {printf "%.2f\n", t1 - t0}'
			return
		fi
		sleep 0.05
	done
	echo "timeout"
}
t0=$(date +%s.%N)
start_agent
echo "cold start, $PODS pods running:            $(wait_pods "$t0" running) s"
echo "cold start, $PODS pods ready:              $(wait_pods "$t0" ready) s (readiness every 10 s; a probe before httpd listens waits a period, as in kubelet)"

sleep 5
rss() { awk '/^VmRSS/ {r=$2} /^RssAnon/ {a=$2} /^RssFile/ {f=$2} END {printf "%.1f MiB (anonymous %.1f, file %.1f)", r/1024, a/1024, f/1024}' "/proc/$agent/status"; }
cpu_ticks() { awk '{print $14+$15}' "/proc/$agent/stat"; }
wbytes() { awk '/^write_bytes/ {print $2}' "/proc/$agent/io"; }
c0=$(cpu_ticks); w0=$(wbytes)
sleep "$STEADY"
c1=$(cpu_ticks); w1=$(wbytes)
hz=$(getconf CLK_TCK)
echo "agent RSS idle with $PODS pods:               $(rss)"
echo "agent CPU over $STEADY s (probes every 10 s):     $(awk -v c="$((c1 - c0))" -v hz="$hz" -v s="$STEADY" 'BEGIN {printf "%.2f", c / hz / s * 100}') % of a core"
echo "agent disk writes, steady state:             $(awk -v w="$((w1 - w0))" -v s="$STEADY" 'BEGIN {printf "%.0f", w * 3600 / s / 1024}') KiB per hour"

# Power cut: everything dies at once; /run (containerd state, runc state,
# network namespaces) is lost; the store and containerd's root stay.
kill_all
grep -o " $B/containerd-state/[^ ]*" /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
rm -rf "$B/containerd-state" "/run/containerd/runc/$NS" "$B/run"
for n in /run/netns/outpost-*; do [[ $n == */$NETNS ]] && continue; [[ -e $n ]] && umount -l "$n" && rm -f "$n"; done
new_netns
start_containerd
t0=$(date +%s.%N)
a0=$(acct_ms)
start_agent
echo "offline reboot, agent start to $PODS running: $(wait_pods "$t0" running) s (agent CPU $(awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14+$15)/hz}' "/proc/$agent/stat") s; containerd, shims and runc $(awk -v a="$a0" -v b="$(acct_ms)" 'BEGIN {printf "%.2f", b - a}') s)"
echo "offline reboot, agent start to $PODS ready:   $(wait_pods "$t0" ready) s"
sleep 3
echo "agent RSS after the reboot with $PODS pods:   $(rss)"
shims=$(pgrep -f -- "containerd-shim-runc-v2 .*-address $SOCK" || true)
echo "containerd shims after the reboot:           $(echo "$shims" | grep -c .) processes, PSS $(for p in $shims; do awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup"; done | awk '{s += $1} END {printf "%.1f", s / 1024}') MiB in all"
