package e2e

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/outpost-edge/outpost/agent/cgroups"
	"github.com/outpost-edge/outpost/sync/kube"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// Issue 18's 30-pod rows, run by scripts/bench-peers.sh.
const (
	// peersPods is the number of pods on the node.
	peersPods = 30
	// peersSettle is how long the pods run, all ready, before memory is
	// read.
	peersSettle = 20 * time.Second
	// peersWorkingSet is how long after clear_refs the referenced pages
	// are counted.
	peersWorkingSet = 60 * time.Second
	// peersIdle is the default window of the idle CPU figure
	// (BENCH_PEERS_IDLE sets another).
	peersIdle = 5 * time.Minute
	// peersNodeIP is the kubelet node's address, on a veth inside its
	// network namespace (kubelet wants an interface with an address).
	peersNodeIP = "10.78.0.1"
	// peersPodCIDR is the kubelet node's pod network (CNI bridge).
	peersPodCIDR = "10.79.0.0/16"
	// peersPacedGap is the time between two creates of the paced batch:
	// 5 pods a second.
	peersPacedGap = 200 * time.Millisecond
)

// BenchmarkPeersPods runs one node with 30 pods (busybox httpd, an
// httpGet readiness probe every 10 s) against a real API server: the
// outpost agent on a private containerd, or, with BENCH_PEER=kubelet,
// upstream kubelet on a private containerd with its CRI plugin and a CNI
// bridge, and kube-proxy in nftables mode beside it (build both with
// scripts/testenv/build-tools.sh peers). The 30 pods are created at once,
// bound to the node, and an admin watch times each from its create's
// answer to phase Running. Once all are ready and 20 s have passed it
// reads the node agent's processes (outpost; kubelet + kube-proxy) and
// containerd's (the daemon and its shims): RSS and anonymous memory (PSS
// for containerd's, whose shims share pages), and the working set (Referenced in smaps_rollup 60 s after writing 1 to
// clear_refs), then their CPU over 5 minutes (BENCH_PEERS_IDLE=DURATION
// for another window); BENCH_PEERS_SMAPS=FILE keeps the (first) agent's
// /proc/PID/smaps as it was when its memory was read. Last, the 30 pods are deleted and 30 others
// created at 5 a second, timed the same way. One iteration is the whole
// run: -benchtime 1x.
func BenchmarkPeersPods(b *testing.B) {
	env.RequireRoot(b)
	peer := cmp.Or(os.Getenv("BENCH_PEER"), "outpost")
	idle := peersIdle
	if v := os.Getenv("BENCH_PEERS_IDLE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("BENCH_PEERS_IDLE=%q: want a positive duration", v)
		}
		idle = d
	}
	b.StopTimer()
	api := env.StartAPIServer(b)
	admin, err := kube.NewClient(api.Config, "outpost-bench-admin")
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "default"}}
	if err := admin.Core.Post().Namespace("default").Resource("serviceaccounts").Body(sa).Do(ctx).Error(); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatalf("create service account: %v", err)
	}

	var agents []int // the node agent's processes
	var ctrd *env.Containerd
	name := "bench-" + peer
	switch peer {
	case "outpost":
		api.Kubectl(b, "apply", "-f", "../../packaging/rbac.yaml")
		n := startBenchNode(b, name, api)
		ctrd = n.ctrd
		peersWaitNodeReady(b, admin, name)
		agents = []int{n.agentPID(b)}
	case "kubelet":
		kn := startKubeletNode(b, name, api)
		ctrd = kn.ctrd
		peersWaitNodeReady(b, admin, name)
		kp := startKubeProxy(b, api, filepath.Join(env.ToolsDir(), "bin", "kube-proxy"))
		agents = []int{kn.kubelet.Process.Pid, kp.cmd.Process.Pid}
	default:
		b.Fatalf("BENCH_PEER=%q: want outpost or kubelet", peer)
	}

	p50, p99 := peersStartPods(b, admin, name, "web", 0)
	b.ReportMetric(float64(p50.Milliseconds()), "startup-p50-ms")
	b.ReportMetric(float64(p99.Milliseconds()), "startup-p99-ms")
	peersWaitReady(b, admin, name, "web")
	time.Sleep(peersSettle)

	shims := func() []int { return pidsWithArg(ctrd.Address, "containerd-shim-runc-v2") }
	runtime := append([]int{ctrd.PID()}, shims()...)
	mem := func(pids []int, prefix string) {
		var rss, anon float64
		for _, pid := range pids {
			st := benchProcStatus(b, pid, "VmRSS", "RssAnon")
			rss += float64(st["VmRSS"]) / 1024
			anon += float64(st["RssAnon"]) / 1024
		}
		b.ReportMetric(rss, prefix+"-rss-MiB")
		b.ReportMetric(anon, prefix+"-anon-MiB")
	}
	mem(agents, "agent")
	if keep := os.Getenv("BENCH_PEERS_SMAPS"); keep != "" {
		// The agent's mappings as they were read, to see what its
		// anonymous memory is (heap arenas, stacks, the binary's data).
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", agents[0]))
		if err == nil {
			err = os.WriteFile(keep, data, 0o644)
		}
		if err != nil {
			b.Fatalf("BENCH_PEERS_SMAPS: %v", err)
		}
	}
	// The shims share their binary's pages, so summed RSS counts them
	// once per shim, which would favour outpost's few grouped shims over
	// kubelet's one per pod: the runtime's memory is summed as PSS.
	var pss, pssAnon float64
	for _, pid := range runtime {
		pss += float64(smapsRollup(b, pid, "Pss")) / 1024
		pssAnon += float64(smapsRollup(b, pid, "Pss_Anon")) / 1024
	}
	b.ReportMetric(pss, "runtime-pss-MiB")
	b.ReportMetric(pssAnon, "runtime-pss-anon-MiB")
	b.Logf("%s: agent pids %v, containerd and %d shims", peer, agents, len(runtime)-1)

	for _, pid := range append(slices.Clone(agents), runtime...) {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("1"), 0); err != nil {
			b.Fatalf("clear_refs of %d: %v", pid, err)
		}
	}
	time.Sleep(peersWorkingSet)
	ws := func(pids []int) (mib float64) {
		for _, pid := range pids {
			mib += float64(smapsRollup(b, pid, "Referenced")) / 1024
		}
		return mib
	}
	b.ReportMetric(ws(agents), "agent-ws-MiB")
	b.ReportMetric(ws(runtime), "runtime-ws-MiB")

	cpu := func(pids []int) (d time.Duration) {
		for _, pid := range pids {
			d += benchProcCPU(b, pid)
		}
		return d
	}
	a0, r0 := cpu(agents), cpu(runtime)
	time.Sleep(idle)
	a1, r1 := cpu(agents), cpu(append([]int{ctrd.PID()}, shims()...))
	b.ReportMetric((a1-a0).Seconds()/idle.Seconds()*100, "agent-cpu-%")
	b.ReportMetric((r1-r0).Seconds()/idle.Seconds()*100, "runtime-cpu-%")

	// Then the paced batch: the 30 go, and 30 others come at 5 a second.
	peersDeletePods(b, admin, name)
	p50, p99 = peersStartPods(b, admin, name, "paced", peersPacedGap)
	b.ReportMetric(float64(p50.Milliseconds()), "paced-p50-ms")
	b.ReportMetric(float64(p99.Milliseconds()), "paced-p99-ms")
}

// peersDeletePods deletes the pods on node and waits until the API
// server has none left.
func peersDeletePods(b *testing.B, admin *kube.Client, node string) {
	b.Helper()
	ctx := b.Context()
	selector := fields.OneTermEqualSelector("spec.nodeName", node).String()
	opts := &metav1.ListOptions{FieldSelector: selector}
	if err := admin.Core.Delete().Namespace("default").Resource("pods").VersionedParams(opts, metav1.ParameterCodec).Do(ctx).Error(); err != nil {
		b.Fatalf("delete pods: %v", err)
	}
	within(2*time.Minute).For(b, "the pods deleted", func() (bool, string) {
		var list corev1.PodList
		if err := admin.Core.Get().Resource("pods").VersionedParams(opts, metav1.ParameterCodec).Do(ctx).Into(&list); err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 0, fmt.Sprintf("%d left", len(list.Items))
	})
}

// peersWaitNodeReady waits for the node to register and be Ready.
func peersWaitNodeReady(b *testing.B, admin *kube.Client, name string) {
	b.Helper()
	within(2*time.Minute).For(b, "node "+name+" Ready", func() (bool, string) {
		var node corev1.Node
		if err := admin.Core.Get().Resource("nodes").Name(name).Do(b.Context()).Into(&node); err != nil {
			return false, err.Error()
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, asJSON(node.Status.Conditions)
	})
}

// peersPod is the benchmark's pod prefix-i on node.
func peersPod(node, prefix string, i int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%02d", prefix, i), Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName: node,
			// httpd, as PID 1, ignores SIGTERM: a short grace keeps the
			// deletion before the paced batch short.
			TerminationGracePeriodSeconds: pbPtr(int64(2)),
			AutomountServiceAccountToken:  pbPtr(false),
			EnableServiceLinks:            pbPtr(false),
			Containers: []corev1.Container{{
				Name:            "web",
				Image:           env.TestImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"httpd", "-f", "-p", "8080", "-h", "/var/www"},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}},
					PeriodSeconds: 10,
				},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}},
			}},
		},
	}
}

// peersStartPods creates the pods named prefix-NN, one every gap (all at
// once when gap is 0), and returns the p50 and p99 of the times from each
// create's answer to a watch seeing it Running.
func peersStartPods(b *testing.B, admin *kube.Client, node, prefix string, gap time.Duration) (p50, p99 time.Duration) {
	b.Helper()
	ctx := b.Context()
	selector := fields.OneTermEqualSelector("spec.nodeName", node).String()
	var list corev1.PodList
	if err := admin.Core.Get().Resource("pods").VersionedParams(&metav1.ListOptions{FieldSelector: selector}, metav1.ParameterCodec).Do(ctx).Into(&list); err != nil {
		b.Fatalf("list pods: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, startupDeadline)
	defer cancel()
	w, err := admin.Core.Get().Resource("pods").VersionedParams(&metav1.ListOptions{
		FieldSelector: selector, ResourceVersion: list.ResourceVersion, Watch: true,
	}, metav1.ParameterCodec).Watch(wctx)
	if err != nil {
		b.Fatalf("watch pods: %v", err)
	}
	defer w.Stop()
	var mu sync.Mutex
	answered := map[string]time.Time{}
	var wg sync.WaitGroup
	start := time.Now()
	for i := range peersPods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(start.Add(time.Duration(i) * gap)))
			pod := peersPod(node, prefix, i)
			err := admin.Core.Post().Namespace("default").Resource("pods").Body(pod).Do(ctx).Error()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				b.Errorf("create %s: %v", pod.Name, err)
				return
			}
			answered[pod.Name] = time.Now()
		}()
	}
	running := map[string]time.Time{}
	for len(running) < peersPods {
		ev, ok := <-w.ResultChan()
		if !ok {
			b.Fatalf("the watch ended with %d of %d pods running", len(running), peersPods)
		}
		pod, isPod := ev.Object.(*corev1.Pod)
		if ev.Type == watch.Error || !isPod {
			b.Fatalf("watch: %v %v", ev.Type, ev.Object)
		}
		if !strings.HasPrefix(pod.Name, prefix+"-") {
			continue
		}
		if _, seen := running[pod.Name]; !seen && pod.Status.Phase == corev1.PodRunning {
			running[pod.Name] = time.Now()
		}
	}
	wg.Wait()
	var ds []time.Duration
	each := make([]string, peersPods)
	for n, t := range running {
		d := t.Sub(answered[n])
		ds = append(ds, d)
		if i, err := strconv.Atoi(strings.TrimPrefix(n, prefix+"-")); err == nil && i < peersPods {
			each[i] = fmt.Sprint(d.Milliseconds())
		}
	}
	b.Logf("%s: ms from create to Running, in creation order: %s", prefix, strings.Join(each, " "))
	slices.Sort(ds)
	return benchPercentile(ds, 50), benchPercentile(ds, 99)
}

// peersWaitReady waits for every pod prefix-NN on node to be Ready.
func peersWaitReady(b *testing.B, admin *kube.Client, node, prefix string) {
	b.Helper()
	selector := fields.OneTermEqualSelector("spec.nodeName", node).String()
	within(2*time.Minute).For(b, "every pod ready", func() (bool, string) {
		var list corev1.PodList
		if err := admin.Core.Get().Resource("pods").VersionedParams(&metav1.ListOptions{FieldSelector: selector}, metav1.ParameterCodec).Do(b.Context()).Into(&list); err != nil {
			return false, err.Error()
		}
		ready := 0
		for _, p := range list.Items {
			if !strings.HasPrefix(p.Name, prefix+"-") {
				continue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == peersPods, fmt.Sprintf("%d of %d ready", ready, peersPods)
	})
}

// pidsWithArg returns the processes whose command is named name and
// whose arguments include arg.
func pidsWithArg(arg, name string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
		if filepath.Base(args[0]) == name && slices.Contains(args[1:], arg) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// smapsRollup returns a field of the process's smaps_rollup, in kB.
func smapsRollup(b *testing.B, pid int, field string) int64 {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && k == field {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatalf("smaps_rollup of %d: %s: %v", pid, k, err)
			}
			return n
		}
	}
	b.Fatalf("smaps_rollup of %d has no %s", pid, field)
	return 0
}

// kubeletNode is upstream kubelet on a private containerd with its CRI
// plugin, in a network namespace of its own with a CNI bridge.
type kubeletNode struct {
	name, dir string
	ns        *pbNetns
	ctrd      *env.Containerd
	args      []string
	kubelet   *exec.Cmd
	done      chan struct{}
}

// startKubeletNode starts kubelet as node name against api (with api
// nil, standalone, on its static pods alone), and stops it and
// everything it made in b's cleanup.
func startKubeletNode(b *testing.B, name string, api *env.APIServer) *kubeletNode {
	b.Helper()
	kn := newKubeletNode(b, name, api)
	kn.start(b)
	return kn
}

// newKubeletNode sets up what startKubeletNode does but kubelet, which
// start starts.
func newKubeletNode(b *testing.B, name string, api *env.APIServer) *kubeletNode {
	b.Helper()
	bin := filepath.Join(env.ToolsDir(), "bin", "kubelet")
	if _, err := os.Stat(bin); err != nil {
		b.Skipf("kubelet not built (%v): run scripts/testenv/build-tools.sh peers as root", err)
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		b.Skipf("no CNI bridge plugin (%v): apt-get install containernetworking-plugins", err)
	}
	// Kubelet mounts volumes under its root: a dir of its own, unmounted
	// before it is removed.
	dir, err := os.MkdirTemp("", "outpost-kubelet-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		unmountPrefix(dir)
		os.RemoveAll(dir)
	})
	kn := &kubeletNode{name: name, dir: dir, ns: newPBNetns(b, "obench-kl")}
	kn.nodeNet(b)
	cni := filepath.Join(dir, "net.d")
	if err := os.MkdirAll(cni, 0o755); err != nil {
		b.Fatal(err)
	}
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "bench", "plugins": [{"type": "bridge", "bridge": "cni0",
 "isGateway": true, "ipMasq": false, "hairpinMode": true,
 "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}}]}`, peersPodCIDR, filepath.Join(dir, "ipam"))
	if err := os.WriteFile(filepath.Join(cni, "10-bench.conflist"), []byte(conf), 0o644); err != nil {
		b.Fatal(err)
	}
	// The CRI plugin pins each sandbox's network namespace as
	// /run/netns/cni-…, and puts the pods' cgroups under /k8s.io
	// (cgroupsPerQOS is off): both go once containerd has stopped (this
	// cleanup is registered before its own, so it runs after).
	before := netnsEntries()
	const criCgroups = "/sys/fs/cgroup/memory/k8s.io"
	cgroupsBefore := dirEntries(criCgroups)
	b.Cleanup(func() {
		kn.removeSandboxNetns(before)
		// Containers whose shim died with a power cut outlive
		// containerd's own cleanup: their processes are killed here, in
		// the cgroups this run made.
		for id := range dirEntries(criCgroups) {
			if !cgroupsBefore[id] {
				killCgroupProcs(filepath.Join(criCgroups, id))
			}
		}
		if len(cgroupsBefore) == 0 {
			env.RemoveCgroups(b, "/k8s.io")
		}
	})
	const pause = "outpost.test/pause:1"
	kn.ctrd = env.StartContainerdCRI(b, env.CRIOptions{Netns: kn.ns.path(), CNIConfDir: cni, SandboxImage: pause})
	kn.ctrd.ImportTestImage(b, "k8s.io")
	kn.ctrd.ImportImage(b, "k8s.io", pause, "sleep", "2147483647")

	kn.args = []string{"--root-dir=" + filepath.Join(dir, "root"), "--cert-dir=" + filepath.Join(dir, "pki"),
		"--hostname-override=" + name, "--node-ip=" + peersNodeIP, "--v=1"}
	if api != nil {
		u, err := url.Parse(api.URL)
		if err != nil {
			b.Fatal(err)
		}
		benchForward(b, kn.ns.path(), u.Host)
		kn.args = append(kn.args, "--kubeconfig="+api.NodeKubeconfig(b, name))
	}
	cfg := filepath.Join(dir, "kubelet.yaml")
	kn.args = append(kn.args, "--config="+cfg)
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: 10250
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://%s
staticPodPath: %s
podLogsDir: %s
resolvConf: /etc/resolv.conf
registerNode: true
serializeImagePulls: false
evictionHard: {"memory.available": "1Mi", "nodefs.available": "1%%", "imagefs.available": "1%%"}
`, peersNodeIP, kn.ctrd.Address, kn.manifests(), filepath.Join(dir, "podlogs"))), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(kn.manifests(), 0o755); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("kubelet log (last lines):\n%s", tailFile(filepath.Join(dir, "kubelet.log"), 40))
		}
		kn.stop()
	})
	kn.ctrd.StopFirst(kn.stop)
	return kn
}

// manifests is kubelet's static pod directory.
func (kn *kubeletNode) manifests() string { return filepath.Join(kn.dir, "manifests") }

// nodeNet gives the node's network namespace kubelet's node address, on
// a veth.
func (kn *kubeletNode) nodeNet(b *testing.B) {
	b.Helper()
	for _, args := range [][]string{
		{"ip", "-n", kn.ns.name, "link", "add", "kb0", "type", "veth", "peer", "name", "kb1"},
		{"ip", "-n", kn.ns.name, "addr", "add", peersNodeIP + "/24", "dev", "kb0"},
		{"ip", "-n", kn.ns.name, "link", "set", "kb0", "up"},
		{"ip", "-n", kn.ns.name, "link", "set", "kb1", "up"},
		{"ip", "-n", kn.ns.name, "route", "add", "default", "dev", "kb0"},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// removeSandboxNetns removes the CRI plugin's sandbox netns pins that
// were not in before.
func (kn *kubeletNode) removeSandboxNetns(before map[string]bool) {
	removeNetnsPins(func(e string) bool { return strings.HasPrefix(e, "cni-") && !before[e] })
}

// start starts kubelet in the node's network namespace, its log appended
// to kubelet.log.
func (kn *kubeletNode) start(b *testing.B) {
	b.Helper()
	logf, err := os.OpenFile(filepath.Join(kn.dir, "kubelet.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	bin := filepath.Join(env.ToolsDir(), "bin", "kubelet")
	cmd := exec.Command("nsenter", append([]string{"--net=" + kn.ns.path(), bin}, kn.args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		b.Fatal(err)
	}
	done := make(chan struct{})
	kn.kubelet, kn.done = cmd, done
	go func() { cmd.Wait(); logf.Close(); close(done) }()
}

// stop stops kubelet with SIGTERM, then SIGKILL after 10 s.
func (kn *kubeletNode) stop() {
	if kn.kubelet == nil {
		return
	}
	kn.kubelet.Process.Signal(syscall.SIGTERM)
	select {
	case <-kn.done:
	case <-time.After(10 * time.Second):
		kn.kill()
	}
	kn.kubelet = nil
}

// kill kills kubelet with SIGKILL, as a power cut would.
func (kn *kubeletNode) kill() {
	if kn.kubelet == nil {
		return
	}
	syscall.Kill(-kn.kubelet.Process.Pid, syscall.SIGKILL)
	<-kn.done
	kn.kubelet = nil
}

// unmountPrefix detaches every mount under dir, deepest first.
func unmountPrefix(dir string) {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	var mounts []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			mounts = append(mounts, f[4])
		}
	}
	slices.Sort(mounts)
	for _, m := range slices.Backward(mounts) {
		syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

// tailFile returns the last n lines of the file at path.
func tailFile(path string, n int) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// killCgroupProcs kills, with SIGKILL, the processes in the cgroup dir
// (of the memory hierarchy) and those below it, after thawing the same
// cgroups of the freezer hierarchy: a runc the power cut killed while it
// had a container's cgroup frozen leaves it frozen, and its processes do
// not die until thawed.
func killCgroupProcs(dir string) {
	if rel, ok := strings.CutPrefix(dir, "/sys/fs/cgroup/memory"); ok {
		cgroups.Tree{Parent: rel}.ThawAll()
	}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		data, _ := os.ReadFile(p)
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		return nil
	})
}
