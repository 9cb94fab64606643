#!/usr/bin/env bash
# Runs the service proxy benchmarks (part of `make bench`) and prints their
# figures:
#   - outpost's nftables Table on the real kernel, in fresh network
#     namespaces: the cold sync of 100, 1,000 and 10,000 Services × 5
#     endpoints, and adding, changing and deleting one Service at each size;
#   - the proxy's sync after one such change written to its store, on the
#     real kernel;
#   - outpost against upstream kube-proxy in nftables mode, on the same
#     Services in a real API server, same machine, same run
#     (OUTPOST_BENCH_PROXY_SIZES=N,N,… for other sizes);
#   - the agent's memory with 10,000 Services (the static, stripped binary,
#     as shipped).
# It needs root (network namespaces, nftables, a private API server and
# containerd): without root it says so and does nothing. kube-proxy is
# built on first use with scripts/testenv/build-tools.sh kube-proxy.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
TOOLS=${OUTPOST_TOOLS:-/var/cache/outpost-testenv}

if [[ $(id -u) != 0 ]]; then
	echo "bench-proxy: not root, so the service proxy benchmarks (network namespaces, nftables) are skipped"
	exit 0
fi
if [[ ! -x $TOOLS/bin/kube-proxy ]]; then
	scripts/testenv/build-tools.sh kube-proxy
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CGO_ENABLED=0 "$GO" build -tags grpcnotrace -trimpath -ldflags '-s -w' -o "$tmp/outpost" ./cmd/outpost

status=0
echo "== outpost's Table on the kernel (ms/op: the whole Sync; kernel-ms/op: its netlink batch)"
"$GO" test -run '^$' -bench 'BenchmarkNetlinkColdSync' -benchtime 1x -timeout 60m ./netproxy/nft/ 2>&1 | tee "$tmp/nft.txt" || status=1
"$GO" test -run '^$' -bench 'BenchmarkNetlinkUpdateOne' -benchtime 20x -timeout 60m ./netproxy/nft/ 2>&1 | tee -a "$tmp/nft.txt" || status=1
echo "== the proxy's sync after one store write, on the kernel (ms/op: the whole Sync; kernel-ms/op: its netlink batch)"
"$GO" test -run '^$' -bench 'BenchmarkSyncOneServiceKernel' -benchtime 200x -timeout 60m ./netproxy/proxy/ 2>&1 | tee -a "$tmp/nft.txt" || status=1
echo "== outpost against kube-proxy (nftables mode), and the agent's memory"
BENCH_OUTPOST="$tmp/outpost" "$GO" test -run '^$' -bench 'BenchmarkProxyVsKubeProxy|BenchmarkAgentRSS' -benchtime 1x -timeout 60m ./test/e2e/ 2>&1 |
	tee "$tmp/e2e.txt" || status=1

echo
echo "== service proxy figures"
grep -hE '^(Benchmark|--- (FAIL|SKIP))' "$tmp/nft.txt" "$tmp/e2e.txt" || true
# The comparison table, and the agent's memory line.
awk '/^service proxy, N Services/ {on = 1} on && /^(PASS|FAIL|ok|--- |Benchmark)/ {on = 0} on' "$tmp/e2e.txt"
grep -h 'services: in the store after' "$tmp/e2e.txt" | sed 's/^ *//' || true
exit "$status"
