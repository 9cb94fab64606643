#!/usr/bin/env bash
# make bench-peers (root): outpost against upstream kube-proxy (and, as
# the rows come, kubelet) v1.37.2 on the same workloads, in one run, with
# the runs of outpost and of the peer alternating. Prints one table, each
# row with outpost's median, the peer's, and the ratio (min and max in
# brackets), and writes the same table, with the date, the machine, the
# kernel and the components' versions, to docs/benchmarks.md and the
# scaling rows as SVG charts under docs/img/.
#
# Rows measured so far (issue 18 lists the rest):
#   - 30 pods through a real API server on outpost, then on kubelet with
#     kube-proxy beside it (BenchmarkPeersPods): startup p50 and p99 of 30
#     created at once; RSS, anonymous memory and working set of the agents
#     and of containerd with its shims; idle CPU over BENCH_PEERS_IDLE (5m);
#     then 30 others created at 5 a second: startup p50 and p99;
#   - offline reboot of 30 static pods (BenchmarkPeersReboot): outpost, then
#     kubelet standalone with the same pods as static manifests, against the
#     floor, bare runc create + start of the same containers, and the floor
#     on containerd, a bare client creating and starting them; then outpost
#     with containerd.ociRuntime: crun against bare crun, bare runc and
#     the floor on containerd with crun;
#   - nftables at N Services × 5 endpoints: cold sync; add one Service;
#     change one EndpointSlice; delete one Service (BenchmarkProxyVsKubeProxy:
#     each run starts kube-proxy, then outpost's Table, on the same objects);
#   - memory with N Services × 5 endpoints: the whole outpost agent
#     (BenchmarkAgentRSS10kServices) against kube-proxy with the same
#     Services programmed.
#
# BENCH_PEERS_RUNS=R runs each R times (default 3); BENCH_PEERS_SIZES=N,N,…
# sets the numbers of Services (default 100,1000,10000; the memory rows
# take those of 1,000 and more); BENCH_PEERS_DOC=PATH writes the document
# elsewhere (default docs/benchmarks.md; "-" writes none).
#
# Each benchmark's lines are appended as they come to dist/bench-peers.txt
# (BENCH_PEERS_RAW), so the runs that ended are kept if a later one fails;
# a benchmark that fails is run once more before the script gives up.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
RUNS=${BENCH_PEERS_RUNS:-3}
SIZES=${BENCH_PEERS_SIZES:-100,1000,10000}
DOC=${BENCH_PEERS_DOC:-docs/benchmarks.md}
TOOLS=${OUTPOST_TOOLS:-/var/cache/outpost-testenv}

if [[ $(id -u) != 0 ]]; then
	echo "bench-peers: run as root (network namespaces, nftables, a private API server and containerd)" >&2
	exit 1
fi
for tool in nft ip python3; do
	command -v "$tool" >/dev/null || { echo "bench-peers: $tool not installed" >&2; exit 1; }
done
if ! command -v gnuplot >/dev/null; then
	echo "bench-peers: installing gnuplot-nox for the charts"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnuplot-nox >/dev/null
fi
# kubelet's pods get their network from the CNI bridge plugin.
if [[ ! -x /usr/lib/cni/bridge && ! -x /opt/cni/bin/bridge ]]; then
	echo "bench-peers: installing containernetworking-plugins for kubelet's pods"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containernetworking-plugins >/dev/null
fi
scripts/testenv/install.sh >/dev/null
scripts/testenv/build-tools.sh >/dev/null
scripts/testenv/build-tools.sh peers

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The tree the binaries are built from, not the one at the end of a run
# that lasts an hour.
built=$(git describe --always --dirty 2>/dev/null || echo unknown)
CGO_ENABLED=0 "$GO" build -tags grpcnotrace -trimpath -ldflags '-s -w' -o "$tmp/outpost" ./cmd/outpost
# The shim start binary beside the agent, as the packages install it.
CGO_ENABLED=0 "$GO" build -trimpath -ldflags '-s -w' -o "$tmp/containerd-shim-outpost-v2" ./cmd/containerd-shim-outpost-v2
"$GO" test -c -o "$tmp/e2e.test" ./test/e2e/
out=${BENCH_PEERS_RAW:-dist/bench-peers.txt}
mkdir -p "$(dirname "$out")"
: >"$out"
bench() { # NAME [ENV=VALUE…]
	local name=$1
	shift
	for try in 1 2; do
		echo "bench-peers: $name $*"
		if (cd test/e2e && env BENCH_OUTPOST="$tmp/outpost" "$@" "$tmp/e2e.test" -test.run '^$' \
			-test.bench "^$name\$" -test.benchtime 1x -test.timeout 60m -test.v) >"$tmp/run.txt" 2>&1; then
			# A benchmark that skipped (a peer not built, a plugin
			# missing) passes with no figures: that is a failure here.
			if grep -q '^--- SKIP' "$tmp/run.txt" || ! grep -qE '^Benchmark.* ns/op' "$tmp/run.txt"; then
				grep -A3 '^--- SKIP' "$tmp/run.txt" >&2
				echo "bench-peers: $name $* measured nothing" >&2
				exit 1
			fi
			grep -E '^Benchmark.* ns/op' "$tmp/run.txt" | sed "s/^/$*|/" >>"$out"
			return
		fi
		tail -40 "$tmp/run.txt" >&2
		echo "bench-peers: $name failed (try $try of 2)" >&2
	done
	echo "bench-peers: the figures of the runs that ended are in $out" >&2
	exit 1
}
start=$(date +%s)
for r in $(seq 1 "$RUNS"); do
	echo "bench-peers: run $r of $RUNS"
	bench BenchmarkPeersPods BENCH_PEER=outpost "BENCH_PEERS_IDLE=${BENCH_PEERS_IDLE:-5m}"
	bench BenchmarkPeersPods BENCH_PEER=kubelet "BENCH_PEERS_IDLE=${BENCH_PEERS_IDLE:-5m}"
	for peer in runc containerd outpost kubelet crun outpost-crun containerd-crun; do
		bench BenchmarkPeersReboot BENCH_PEER=$peer
	done
	bench BenchmarkProxyVsKubeProxy "OUTPOST_BENCH_PROXY_SIZES=$SIZES"
	for n in ${SIZES//,/ }; do
		((n >= 1000)) || continue
		bench BenchmarkAgentRSS10kServices "OUTPOST_BENCH_RSS_SERVICES=$n"
	done
done
secs=$(($(date +%s) - start))

versions=$(
	echo "kube-proxy $(cat "$TOOLS/bin/.kube-proxy.version")"
	echo "kubelet $(cat "$TOOLS/bin/.kubelet.version")"
	echo "containerd $(containerd --version | awk '{print $3}')"
	echo "runc $(runc --version | awk 'NR == 1 {print $3}')"
	echo "crun $(crun --version | awk 'NR == 1 {print $3}')"
	echo "outpost $built"
	echo "nftables $(nft --version | awk '{print $2}')"
	echo "kernel $(uname -r)"
)
python3 scripts/bench-peers-report.py --input "$out" --doc "$DOC" --runs "$RUNS" --seconds "$secs" \
	--machine "$(nproc) cores $(uname -m), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)" \
	--versions "$versions" --settings "BENCH_PEERS_RUNS=$RUNS BENCH_PEERS_SIZES=$SIZES BENCH_PEERS_IDLE=${BENCH_PEERS_IDLE:-5m}"
