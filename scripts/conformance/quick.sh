#!/usr/bin/env bash
# quick.sh: make test's share of make conformance, the specs of quick.txt
# (about a minute of specs, a minute to bring the cluster up). It runs
# only where the conformance tools are built already: building e2e.test
# and the rest from source takes 10 to 40 minutes (scripts/conformance/
# build.sh; make conformance runs it), more than a fresh machine's CI run
# may spend. Without them, or without root, it says so and passes.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CB=${OUTPOST_TOOLS:-/var/cache/outpost-testenv}/conformance/bin
if [[ $(id -u) != 0 ]]; then
	echo "conformance quick subset: skipped: not root"
	exit 0
fi
for t in e2e.test ginkgo kube-scheduler agnhost; do
	if [[ ! -x $CB/$t ]]; then
		echo "conformance quick subset: skipped: $CB/$t is not built (make conformance builds the tools, 10-40 min)"
		exit 0
	fi
done
echo "conformance quick subset: $(grep -c '^[^#]' "$HERE/quick.txt") specs of quick.txt"
CONFORMANCE_SPECS=$HERE/quick.txt CONFORMANCE_REPORT=${CONFORMANCE_REPORT:-$HERE/../../dist/conformance-quick} exec "$HERE/run.sh"
