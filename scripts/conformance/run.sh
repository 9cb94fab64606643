#!/usr/bin/env bash
# make conformance: runs Kubernetes' own [NodeConformance] e2e specs
# (v1.37.2, the 236 of the default set) against `outpost agent` as the
# node of a one-node cluster that lives in a network namespace of its own:
# a registry on its loopback with substitute test images, etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, a containerd of
# its own, and the agent with the node's kubeconfig. It prints
# "N passed, N failed", the expected failures apart (expected-failures.txt:
# what upstream kubelet fails on this machine too, never counted as
# passed), and each failed spec with the first line of its failure; the
# junit report goes to dist/conformance/. Everything is torn down on every
# exit path.
#
#   CONFORMANCE_FOCUS=REGEX  runs the specs whose names match (default
#                            \[NodeConformance\])
#   CONFORMANCE_SPECS=FILE   runs the specs FILE names, one per line as in
#                            specs-236.txt (quick.txt: make test's subset)
#   CONFORMANCE_PROCS=N      ginkgo processes (default 4)
#   CONFORMANCE_TIMEOUT=D    ends the run after D (default 3h); the specs
#                            not run by then are not counted
#   CONFORMANCE_KEEP=1       leaves the cluster's logs in the work dir
#   CONFORMANCE_REPORT=DIR   where the junit report goes (dist/conformance)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
HERE=$ROOT/scripts/conformance
if [[ $(id -u) != 0 ]]; then
	echo "conformance: run as root (it starts containerd, makes network namespaces)" >&2
	exit 1
fi
TOOLS=${OUTPOST_TOOLS:-/var/cache/outpost-testenv}
TB=$TOOLS/bin
CB=$TOOLS/conformance/bin
FOCUS=${CONFORMANCE_FOCUS:-'\[NodeConformance\]'}
if [[ -n ${CONFORMANCE_SPECS:-} ]]; then
	# Each name, its regexp metacharacters escaped, as one alternative.
	FOCUS=$(python3 -c 'import re, sys
names = [l.split(": ", 1)[1].strip() for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
print("|".join(re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", n) for n in names))' "$CONFORMANCE_SPECS")
fi
SKIP='\[Serial\]|\[Slow\]|\[Flaky\]|\[Disruptive\]|\[Feature:[^]]+\]|\[FeatureGate:[^]]+\]'
PROCS=${CONFORMANCE_PROCS:-4}
REPORT=${CONFORMANCE_REPORT:-$ROOT/dist/conformance}
W=$(mktemp -d /tmp/outpost-conformance.XXXXXX)
NS=opconf-$$
NODE=conformance-node
NODE_IP=10.77.0.1
ADMIN_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
NODE_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
X=(nsenter "--net=/run/netns/$NS" --)
P=$W/pki
L=$W/logs
pids=()
log() { echo "conformance: $*"; }

# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
	set +e
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null; done
	sleep 1
	for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
	# The pods' containers (each shim's children), then the shims.
	for shim in $(pgrep -f -- "-address $W/containerd.sock"); do pkill -9 -P "$shim"; done
	pkill -9 -f -- "-address $W/containerd.sock" 2>/dev/null
	sleep 0.5
	rm -rf /run/containerd/runc/outpost-conformance
	for ns in /run/netns/"$NS"-*; do [[ -e $ns ]] && umount -l "$ns" && rm -f "$ns"; done
	for cg in /sys/fs/cgroup/*/"$NS" /sys/fs/cgroup/"$NS"; do
		[[ -d $cg ]] && find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
	done
	ip netns delete "$NS" 2>/dev/null
	grep -o " $W/[^ ]*" /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null
	if [[ ${CONFORMANCE_KEEP:-} == 1 ]]; then
		log "logs kept in $L"
	else
		rm -rf "$W"
	fi
}
trap cleanup EXIT

# start NAME CMD...: runs CMD in the cluster's namespace, logging to $L.
start() {
	local name=$1
	shift
	"${X[@]}" "$@" >"$L/$name.log" 2>&1 &
	pids+=($!)
}
# waitfor WHAT TRIES CMD...: runs CMD in the namespace every 0.2 s until it
# succeeds.
waitfor() {
	local what=$1 tries=$2
	shift 2
	for _ in $(seq "$tries"); do
		"${X[@]}" "$@" >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	log "$what did not come up; its log:"
	tail -20 "$L/$what.log" 2>/dev/null
	exit 1
}

for tool in "$TB/etcd" "$TB/kube-apiserver" "$TB/kube-controller-manager" "$TB/kubectl" "$TB/registry" \
	"$CB/e2e.test" "$CB/ginkgo" "$CB/kube-scheduler" "$CB/agnhost"; do
	[[ -x $tool ]] || { log "$tool is missing: make testenv and scripts/conformance/build.sh build it"; exit 1; }
done
command -v nc.openbsd >/dev/null || apt-get install -y -qq netcat-openbsd >/dev/null
# gcc and a static libc build the images' /bin/sh (shsel/sh.c).
if ! command -v gcc >/dev/null || [[ $(gcc -print-file-name=libc.a) != /* ]]; then
	apt-get install -y -qq gcc libc6-dev >/dev/null
fi
mkdir -p "$L" "$P" "$REPORT"
make --no-print-directory build >/dev/null

log "cluster in network namespace $NS (node $NODE at $NODE_IP), work dir $W"
ip netns add "$NS"
ip -n "$NS" link set lo up
# The node's address, on a veth pair inside the namespace (this kernel
# has no dummy link type).
ip -n "$NS" link add nc0 type veth peer name nc1
ip -n "$NS" addr add "$NODE_IP/24" dev nc0
ip -n "$NS" link set nc1 up
ip -n "$NS" link set nc0 up

mkdir -p "$W/registry"
cat >"$W/registry.yml" <<EOT
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $W/registry}, delete: {enabled: true}}
http: {addr: "127.0.0.1:5000"}
EOT
OTEL_TRACES_EXPORTER=none start registry "$TB/registry" serve "$W/registry.yml"
waitfor registry 100 curl -sf http://127.0.0.1:5000/v2/
"${X[@]}" "$HERE/images.sh" 127.0.0.1:5000 "$W/images" >"$L/images.log" 2>&1 || {
	log "building the test images failed:"
	tail -20 "$L/images.log"
	exit 1
}

(
	cd "$P"
	openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=conformance-ca 2>/dev/null
	openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null
	printf 'subjectAltName=IP:127.0.0.1,IP:10.43.0.1,IP:%s,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n' "$NODE_IP" >apiserver.ext
	openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 2 -extfile apiserver.ext 2>/dev/null
	# The API server's client certificate to the node (logs, exec,
	# port-forward): the agent authorizes system:masters locally.
	openssl req -newkey rsa:2048 -nodes -keyout kubelet-client.key -out kubelet-client.csr -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" 2>/dev/null
	openssl x509 -req -in kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out kubelet-client.crt -days 2 \
		-extfile <(echo extendedKeyUsage=clientAuth) 2>/dev/null
	openssl genrsa -out sa.key 2048 2>/dev/null
	openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
)
printf '%s,admin,admin-uid,system:masters\n%s,system:node:%s,node-uid,system:nodes\n' "$ADMIN_TOKEN" "$NODE_TOKEN" "$NODE" >"$P/tokens.csv"
for u in admin:$ADMIN_TOKEN node:$NODE_TOKEN; do
	cat >"$W/${u%%:*}.kubeconfig" <<EOT
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443", certificate-authority: $P/ca.crt}}]
users: [{name: u, user: {token: ${u#*:}}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
EOT
done

start etcd "$TB/etcd" --name c --data-dir "$W/etcd" --listen-client-urls http://127.0.0.1:12379 --advertise-client-urls http://127.0.0.1:12379 \
	--listen-peer-urls http://127.0.0.1:12380 --initial-advertise-peer-urls http://127.0.0.1:12380 --initial-cluster c=http://127.0.0.1:12380 \
	--unsafe-no-fsync --log-level warn
start kube-apiserver "$TB/kube-apiserver" --etcd-servers=http://127.0.0.1:12379 --bind-address=127.0.0.1 --secure-port=6443 \
	--advertise-address="$NODE_IP" --endpoint-reconciler-type=none --cert-dir="$P" --tls-cert-file="$P/apiserver.crt" \
	--tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" --token-auth-file="$P/tokens.csv" \
	--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true \
	--kubelet-client-certificate="$P/kubelet-client.crt" --kubelet-client-key="$P/kubelet-client.key" \
	--kubelet-preferred-address-types=InternalIP,Hostname --service-account-issuer=https://kubernetes.default.svc.cluster.local \
	--service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" --service-cluster-ip-range=10.43.0.0/16
waitfor kube-apiserver 900 curl -sf --cacert "$P/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" https://127.0.0.1:6443/readyz
# What a cluster gives outpost nodes (docs/api.md): the service proxy's
# read of every namespace's EndpointSlices.
"${X[@]}" "$TB/kubectl" --kubeconfig "$W/admin.kubeconfig" apply -f "$ROOT/packaging/rbac.yaml" >"$L/rbac.log" 2>&1
start kube-controller-manager "$TB/kube-controller-manager" --kubeconfig="$W/admin.kubeconfig" \
	--authentication-kubeconfig="$W/admin.kubeconfig" --authorization-kubeconfig="$W/admin.kubeconfig" --leader-elect=false \
	--bind-address=127.0.0.1 --secure-port=10257 --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
	--use-service-account-credentials=false
start kube-scheduler "$CB/kube-scheduler" --kubeconfig="$W/admin.kubeconfig" --authentication-kubeconfig="$W/admin.kubeconfig" \
	--authorization-kubeconfig="$W/admin.kubeconfig" --leader-elect=false --bind-address=127.0.0.1 --secure-port=10259

cat >"$W/containerd.toml" <<EOT
version = 2
root = "$W/containerd-root"
state = "$W/containerd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$W/containerd.sock"
[ttrpc]
  address = "$W/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
EOT
start containerd containerd --config "$W/containerd.toml" --log-level warn
waitfor containerd 300 ctr -a "$W/containerd.sock" version

cat >"$W/outpost.yaml" <<EOT
nodeName: $NODE
stateDir: $W/state
manifestDir: $W/manifests
imageDir: $W/images-dir
logDir: $W/pods-logs
runDir: $W/run
kubeconfig: $W/node.kubeconfig
containerd:
  address: $W/containerd.sock
  namespace: outpost-conformance
  cgroupParent: /$NS
network:
  netnsPrefix: $NS-
server:
  address: $NODE_IP:10250
  clientCAFile: $P/ca.crt
log:
  level: ${CONFORMANCE_LOG:-info}
EOT
mkdir -p "$W/manifests"
start outpost "$ROOT/bin/outpost" agent --config "$W/outpost.yaml"
waitfor outpost 900 sh -c "'$TB/kubectl' --kubeconfig '$W/admin.kubeconfig' get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q True"
log "node $NODE Ready; running the specs ($PROCS processes; the log: $L/e2e.log)"

ARGS=(--kubeconfig="$W/admin.kubeconfig" --provider=skeleton --kube-test-repo-list="$HERE/repo-list.yaml"
	--report-dir="$W/report" --ginkgo.focus="$FOCUS" --ginkgo.skip="$SKIP" --ginkgo.no-color --ginkgo.timeout="${CONFORMANCE_TIMEOUT:-3h}")
mkdir -p "$W/report"
started=$SECONDS
rc=0
(cd "$W/report" && "${X[@]}" "$CB/ginkgo" run --procs="$PROCS" --no-color --timeout="${CONFORMANCE_TIMEOUT:-3h}" "$CB/e2e.test" -- "${ARGS[@]}") \
	>"$L/e2e.log" 2>&1 || rc=$?
took=$((SECONDS - started))
cp "$W"/report/junit*.xml "$REPORT/" 2>/dev/null || true
cp "$L/e2e.log" "$REPORT/e2e.log"
src=0
python3 "$HERE/summary.py" "$W/report" "$HERE/expected-failures.txt" "$took" || src=$?
if ((src == 1)); then
	log "no junit report (ginkgo exited $rc); the end of the e2e log:"
	tail -30 "$L/e2e.log"
fi
exit "$src"
