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
CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$B/containerd-shim-outpost-v2" ./cmd/containerd-shim-outpost-v2
ctrd_pid= agent= events_pid=
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
	pkill -f -- "ctr -a $SOCK events"
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
# The watchers below cost the machine next to nothing while pods start
# (a poll that ran `outpost status` and jq 20 times a second took about
# 40 % of the 2 cores it was timing): a bash loop reads containerd's event
# stream and ends at the task start that makes every pod's.
#
# watch_tasks starts that loop; it writes to $B/all-started the time, by
# containerd's clock, at which a task had started for every pod.
watch_tasks() {
	(
		declare -A seen
		c=0
		while read -r day time _ _ _ topic event; do
			[[ $topic == /tasks/start ]] || continue
			id=${event%%,*}
			[[ -n ${seen[$id]:-} ]] && continue
			seen[$id]=1
			if ((++c == PODS)); then
				echo "$day $time UTC"
				break
			fi
		done < <(exec timeout 300 ctr -a "$SOCK" events)
	) >"$B/all-started" &
	events_pid=$!
	sleep 0.2
}
# wait_running T0 sets secs to the seconds from T0 until every pod's
# task had started, by containerd's clock.
wait_running() {
	wait "$events_pid" || true
	events_pid=
	pkill -f -- "ctr -a $SOCK events" || true
	if [[ -s $B/all-started ]]; then
		secs=$(awk -v t0="$1" -v t1="$(date -d "$(cat "$B/all-started")" +%s.%N)" 'BEGIN {printf "%.2f", t1 - t0}')
	else
		secs=timeout
	fi
}
# count_ready prints how many pods the running agent reports with every
# container ready.
count_ready() {
	"$B/outpost" status -o json --config "$B/config.yaml" 2>/dev/null | jq '
	[.pods[] | select(.synced and ((.status.containerStatuses // []) | length > 0) and
		all(.status.containerStatuses[]; .ready == true))] | length' 2>/dev/null || echo 0
}
# wait_ready T0 prints the seconds from T0 until the agent reports every
# pod ready. It asks 5 times a second, and only once all tasks run.
wait_ready() {
	local t0=$1
	for _ in $(seq 600); do
		if [[ $(count_ready) == "$PODS" ]]; then
			awk -v t0="$t0" -v t1="$(date +%s.%N)" 'BEGIN {printf "%.2f\n", t1 - t0}'
			return
		fi
		sleep 0.2
	done
	echo "timeout"
}
watch_tasks
t0=$(date +%s.%N)
start_agent
wait_running "$t0"
echo "cold start, $PODS pods running:            $secs s"
echo "cold start, $PODS pods ready:              $(wait_ready "$t0") s (readiness every 10 s; a probe before httpd listens waits a period, as in kubelet)"

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
watch_tasks
t0=$(date +%s.%N)
a0=$(acct_ms)
start_agent
wait_running "$t0"
echo "offline reboot, agent start to $PODS running: $secs s (agent CPU $(awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14+$15)/hz}' "/proc/$agent/stat") s; containerd, shims and runc $(awk -v a="$a0" -v b="$(acct_ms)" 'BEGIN {printf "%.2f", b - a}') s)"
echo "offline reboot, agent start to $PODS ready:   $(wait_ready "$t0") s"
sleep 3
echo "agent RSS after the reboot with $PODS pods:   $(rss)"
shims=$(pgrep -f -- "containerd-shim-runc-v2 .*-address $SOCK" || true)
echo "containerd shims after the reboot:           $(echo "$shims" | grep -c .) processes, PSS $(for p in $shims; do awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup"; done | awk '{s += $1} END {printf "%.1f", s / 1024}') MiB in all"
