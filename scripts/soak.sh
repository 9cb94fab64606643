#!/usr/bin/env bash
# make soak (root): the reliability trials of docs/soak.md against real
# containerd, nftables, kube-apiserver and mosquitto, each in its own
# network namespaces, containerd and temp dirs. SOAK_SCALE=quick (default,
# under 15 minutes) or full (under 90); SOAK_TRIALS=REGEX runs some of
# them. Prints one line per trial with its counts, then "N passed, N
# failed", and writes the table to dist/soak/report.md; the whole go test
# output is in dist/soak/soak.log.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
export SOAK_SCALE=${SOAK_SCALE:-quick}
case $SOAK_SCALE in
quick) timeout=40m ;;
full) timeout=150m ;;
*) echo "soak: SOAK_SCALE=$SOAK_SCALE: want quick or full" >&2; exit 2 ;;
esac
if [[ $(id -u) != 0 ]]; then
	echo "soak: run as root (containerd, network namespaces, nftables, loop mounts)" >&2
	exit 1
fi
out=$PWD/dist/soak
mkdir -p "$out"
rm -f "$out/report.md"
export SOAK_REPORT=$out/report.md
echo "soak: SOAK_SCALE=$SOAK_SCALE${SOAK_TRIALS:+ SOAK_TRIALS=$SOAK_TRIALS}; go test output in $out/soak.log"
rc=0
# The trials print "soak: LINE" as each ends, and the summary at the end.
$GO test -count=1 -timeout "$timeout" -run '^TestSoak$' -v ./test/e2e/ >"$out/soak.log" 2>&1 || rc=$?
sed -n '/^soak (/,$p' "$out/soak.log" | grep -v '^\(PASS\|FAIL\|ok \|---\|exit status\)' || true
if [[ $rc != 0 ]]; then
	echo
	echo "soak: failed (go test exit $rc); the failures, from $out/soak.log:"
	grep -n -- '--- FAIL\|panic:\|_test.go:[0-9]*:' "$out/soak.log" | grep -v 'soak_test.go' | tail -40 || true
fi
[[ -f $SOAK_REPORT ]] && echo "soak: report in $SOAK_REPORT"
exit $rc
