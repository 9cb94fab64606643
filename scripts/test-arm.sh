#!/usr/bin/env bash
# Runs the unit tests of every package but test/e2e (real containerd and
# root, on the host's architecture), test/deps (go list, the same on
# every architecture) and test/packaging (host tools, the same too) for
# linux/arm64 and linux/arm (GOARM=7) under qemu-user, then the
# cross-built binaries in dist/ (make build-all): `outpost version` and
# `outpost config check` for arm64, arm and amd64.
# `make test-arm` builds dist/ and calls this. Needs qemu-user-static and
# jq (scripts/testenv/install.sh installs both).
#
# qemu-user has no NETLINK_NETFILTER socket, so the nftables tests skip
# there, saying so; route netlink, bbolt, MQTT and gRPC work.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
BUILDTAGS=${BUILDTAGS:-grpcnotrace}
ARCHES=(arm64 arm)
hostarch=$("$GO" env GOHOSTARCH)

# qemu prints the emulator for a GOARCH: nothing for the host's own, or
# when none is installed. Debian 12's qemu-user-static names it
# qemu-aarch64-static, Debian 13's plain qemu-aarch64.
qemu() {
	local q
	[[ $1 == "$hostarch" ]] && return
	case $1 in
	arm64) q=aarch64 ;;
	arm) q=arm ;;
	amd64) q=x86_64 ;;
	*) return ;;
	esac
	command -v "qemu-$q-static" || command -v "qemu-$q" || true
}

# As the e2e tests do: without root (so without make testenv) a missing
# tool skips, saying so; as root it fails.
missing=()
for a in "${ARCHES[@]}" amd64; do
	[[ $a == "$hostarch" || -n $(qemu "$a") ]] || missing+=("no emulator for linux/$a (package qemu-user-static)")
done
command -v jq >/dev/null || missing+=("no jq (package jq)")
if ((${#missing[@]})); then
	printf 'test-arm: %s\n' "${missing[@]}" >&2
	if [[ $(id -u) != 0 ]]; then
		echo "test-arm: skipped: not root, so make testenv installed nothing; as root it installs them" >&2
		exit 0
	fi
	echo "test-arm: run scripts/testenv/install.sh (make testenv does)" >&2
	exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mapfile -t pkgs < <("$GO" list ./... | grep -v -e '/test/e2e\(/\|$\)' -e '/test/deps$' -e '/test/packaging$')

# summary prints, from go test -json events, how many tests (subtests and
# fuzz seeds included) passed, skipped and failed, each skipped test with
# the reason it gave, and each failed test's output.
summary() {
	jq -rs --arg arch "$1" '
		reduce (.[] | select(.Test != null)) as $e ({};
			($e.Package | sub("^github.com/outpost-edge/outpost/"; "")) as $p
			| ($p + " " + $e.Test) as $k
			| if $e.Action == "output" then .[$k].out += [$e.Output]
			  elif $e.Action == "pass" or $e.Action == "fail" or $e.Action == "skip" then .[$k].res = $e.Action
			  else . end)
		| to_entries as $t
		| def n($r): [$t[] | select(.value.res == $r)] | length;
		  def said: [.value.out[]? | select(test("^(=== |\\s*--- )") | not)] | join("") | rtrimstr("\n");
		  def reason: [.value.out[]? | select(test("^\\s+[^\\s]+\\.go:[0-9]+: "))] | last // "" | sub("^\\s+"; "") | rtrimstr("\n");
		"test-arm: \($arch): \(n("pass")) passed, \(n("skip")) skipped, \(n("fail")) failed (tests, subtests and fuzz seeds)",
		($t[] | select(.value.res == "skip") | "  skip \(.key): \(reason)"),
		($t[] | select(.value.res == "fail") | "  FAIL \(.key):\n\(said)")
	' "$2"
}

status=0
for arch in "${ARCHES[@]}"; do
	q=$(qemu "$arch")
	echo "== test-arm: go test for linux/$arch${q:+ under $(basename "$q")}"
	log=$tmp/test-$arch.json
	start=$(date +%s)
	# go test -json: the package lines stream as go test prints them; the
	# events go to the log for the summary. -trimpath, -tags and GOARM as
	# build-all's, so the tests reuse the packages it compiled.
	set +e
	CGO_ENABLED=0 GOOS=linux GOARCH=$arch GOARM=7 \
		"$GO" test -json -trimpath -tags "$BUILDTAGS" ${q:+-exec "$q"} -count=1 -short "${pkgs[@]}" |
		tee "$log" |
		jq -rj --unbuffered 'select((.Action == "output" and .Test == null and .Output != "PASS\n") or .Action == "build-output") | .Output'
	rc=${PIPESTATUS[0]}
	set -e
	sum=$(summary "$arch" "$log")
	echo "$sum"
	echo "test-arm: linux/$arch tests took $(($(date +%s) - start))s"
	if ((rc != 0)); then
		echo "test-arm: go test for linux/$arch failed" >&2
		status=1
		# Said again at the end, where a log cut in its middle still shows it.
		{
			echo "test-arm: go test for linux/$arch failed:"
			sed -n '/^  FAIL /,$p' <<<"$sum"
			jq -rj 'select(.Action == "output" and .Test == null and (.Output | test("^(FAIL\t|panic)"))) | "  " + .Output' "$log"
		} >>"$tmp/failed"
	fi
done

# The binaries make build-all made: built as asked (go version -m), static
# (they run under qemu-user with no ARM libraries), and they run; config
# check prints the same config on every architecture.
check=
for arch in amd64 "${ARCHES[@]}"; do
	bin=dist/outpost-linux-$arch
	[[ $arch == arm ]] && bin=$bin-v7
	[[ -x $bin ]] || { echo "test-arm: no $bin: run make build-all (make test-arm does)" >&2; exit 1; }
	q=$(qemu "$arch")
	run=(${q:+"$q"})
	echo "== test-arm: $bin${q:+ under $(basename "$q")}"
	settings=$("$GO" version -m "$bin")
	want=("CGO_ENABLED=0" "GOARCH=$arch" "-tags=$BUILDTAGS")
	[[ $arch == arm ]] && want+=("GOARM=7")
	for w in "${want[@]}"; do
		grep -qx $'\tbuild\t'"$w" <<<"$settings" || { echo "test-arm: $bin: not built with $w" >&2; status=1; }
	done
	shim=dist/containerd-shim-outpost-v2-${bin#dist/outpost-}
	if [[ ! -x $shim ]]; then
		echo "test-arm: no $shim: run make build-all" >&2
		status=1
	else
		shimset=$("$GO" version -m "$shim")
		for w in "CGO_ENABLED=0" "GOARCH=$arch"; do
			grep -qx $'\tbuild\t'"$w" <<<"$shimset" || { echo "test-arm: $shim: not built with $w" >&2; status=1; }
		done
	fi
	out=$("${run[@]}" "$bin" version) || { echo "test-arm: $bin version failed" >&2; status=1; }
	sed 's/^/  /' <<<"$out"
	grep -qx "platform: linux/$arch" <<<"$out" || { echo "test-arm: $bin version: want platform: linux/$arch" >&2; status=1; }
	if ! out=$("${run[@]}" "$bin" config check --config packaging/config.yaml 2>&1); then
		echo "$out" >&2
		echo "test-arm: $bin config check failed" >&2
		status=1
	elif [[ -n $check && $out != "$check" ]]; then
		diff <(echo "$check") <(echo "$out") >&2 || true
		echo "test-arm: $bin config check prints another config than linux/amd64's" >&2
		status=1
	else
		echo "  config check --config packaging/config.yaml: ok ($(wc -l <<<"$out") lines${check:+, as linux/amd64})"
	fi
	[[ -n $check ]] || check=$out
done
if ((status)); then
	[[ -s $tmp/failed ]] && cat "$tmp/failed" >&2
	echo "test-arm: FAILED" >&2
	exit 1
fi
echo "test-arm: passed"
