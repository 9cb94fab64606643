package e2e

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/sync/kube"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// Issue 4's pod startup benchmark.
const (
	// defaultStartupPods are created at once (BENCH_PODS sets another
	// number).
	defaultStartupPods = 30
	// startupSteady is how long the pods run before the agent's memory
	// is read.
	startupSteady = 20 * time.Second
	// startupDeadline bounds the wait for every pod to run.
	startupDeadline = 3 * time.Minute
)

// BenchmarkKubePodStartup runs the agent (the real binary, in a network
// namespace of its own, on a private containerd, with the node identity)
// against a real API server. Once its Node is Ready, 30 pods bound to it
// (the local test image, a sleeping container) are created at once (or
// paced, below), and
// an admin watch on the node's pods, started before, notes when each
// shows phase Running. It reports, in ms, p50, p99 and the slowest of the
// times from each create request's answer to that watch event (the
// startup time a user sees: the pod exists in the API from the answer
// on), p50 and p99 from the request being sent, the host's CPU use and
// the agent's CPU time meanwhile, and, after 20 s of steady state with
// the pods running and the link up, the agent's VmRSS, RssAnon and
// RssFile in MiB. One iteration is one whole scenario: run it with
// -benchtime 1x.
//
// The environment tunes it:
//   - BENCH_PODS=N creates N pods instead of 30;
//   - BENCH_POD_RATE=R creates them at R pods per second instead of all
//     at once;
//   - BENCH_OUTPOST=PATH runs that agent binary instead of the one
//     TestMain builds (with cgo, symbols and DWARF): `make build`'s
//     bin/outpost is static and stripped, as shipped;
//   - BENCH_LOG sets the agent's log level (default info);
//   - BENCH_KEEP_LOG=FILE keeps the agent's log in FILE, the API
//     server's audit log in FILE.audit and each pod's create and Running
//     times in FILE.pods, to see where the time went.
//
// The node is set up here rather than with newNode and connect, which
// take a *testing.T.
func BenchmarkKubePodStartup(b *testing.B) {
	env.RequireRoot(b)
	if benchBin() == "" {
		b.Fatal("outpost binary not built (TestMain builds it as root)")
	}
	metrics := map[string]float64{}
	b.StopTimer()
	for i := range b.N {
		for k, v := range runPodStartup(b, i) {
			metrics[k] += v / float64(b.N)
		}
	}
	for k, v := range metrics {
		b.ReportMetric(v, k)
	}
}

// runPodStartup runs one scenario and returns its figures by unit.
func runPodStartup(b *testing.B, iter int) map[string]float64 {
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
	n := startBenchNode(b, fmt.Sprintf("bench-startup-%d", iter), api)

	within(90*time.Second).For(b, "a Ready node", func() (bool, string) {
		var node corev1.Node
		if err := admin.Core.Get().Resource("nodes").Name(n.name).Do(ctx).Into(&node); err != nil {
			return false, err.Error()
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, asJSON(node.Status.Conditions)
	})

	// The watch starts from the list's resourceVersion, before any create.
	selector := fields.OneTermEqualSelector("spec.nodeName", n.name).String()
	var list corev1.PodList
	if err := admin.Core.Get().Resource("pods").VersionedParams(&metav1.ListOptions{FieldSelector: selector}, metav1.ParameterCodec).Do(ctx).Into(&list); err != nil {
		b.Fatalf("list pods: %v", err)
	}
	wctx, cancelWatch := context.WithTimeout(ctx, startupDeadline)
	defer cancelWatch()
	w, err := admin.Core.Get().Resource("pods").VersionedParams(&metav1.ListOptions{
		FieldSelector: selector, ResourceVersion: list.ResourceVersion, Watch: true,
	}, metav1.ParameterCodec).Watch(wctx)
	if err != nil {
		b.Fatalf("watch pods: %v", err)
	}
	defer w.Stop()

	type timing struct{ sent, answered, running time.Time }
	var mu sync.Mutex
	times := map[string]*timing{}
	startupPods := benchPods(b)
	names := make([]string, startupPods)
	for j := range names {
		names[j] = fmt.Sprintf("start-%02d", j)
		times[names[j]] = &timing{}
	}
	allRunning := make(chan struct{})
	go func() {
		left := startupPods
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) || p.Status.Phase != corev1.PodRunning {
				continue
			}
			now := time.Now()
			mu.Lock()
			t := times[p.Name]
			if t != nil && t.running.IsZero() {
				t.running = now
				left--
			}
			mu.Unlock()
			if left == 0 {
				close(allRunning)
				return
			}
		}
	}()

	pid := n.agentPID(b)
	busy0, total0 := benchHostCPU(b)
	agent0 := benchProcCPU(b, pid)
	b.StartTimer()
	var wg sync.WaitGroup
	errs := make(chan error, startupPods)
	gap := benchPodGap(b)
	for j, name := range names {
		if j > 0 && gap > 0 {
			time.Sleep(gap)
		}
		pod := apiPod(name, n.name, "exec sleep 3600")
		wg.Go(func() {
			sent := time.Now()
			err := admin.Core.Post().Namespace("default").Resource("pods").Body(pod).Do(ctx).Error()
			answered := time.Now()
			if err != nil {
				errs <- fmt.Errorf("create pod %s: %w", name, err)
				return
			}
			mu.Lock()
			times[name].sent, times[name].answered = sent, answered
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	select {
	case <-allRunning:
	case <-wctx.Done():
		mu.Lock()
		var missing []string
		for name, t := range times {
			if t.running.IsZero() {
				missing = append(missing, name)
			}
		}
		mu.Unlock()
		slices.Sort(missing)
		b.Fatalf("pods not Running in the API within %v: %v", startupDeadline, missing)
	}
	b.StopTimer()
	busy1, total1 := benchHostCPU(b)
	agentCPU := benchProcCPU(b, pid) - agent0

	mu.Lock()
	var fromAnswer, fromSent []time.Duration
	var table strings.Builder
	for _, name := range names {
		t := times[name]
		fromAnswer = append(fromAnswer, t.running.Sub(t.answered))
		fromSent = append(fromSent, t.running.Sub(t.sent))
		fmt.Fprintf(&table, "%s sent %s answered %s running %s\n", name,
			t.sent.Format(time.RFC3339Nano), t.answered.Format(time.RFC3339Nano), t.running.Format(time.RFC3339Nano))
	}
	mu.Unlock()
	if keep := os.Getenv("BENCH_KEEP_LOG"); keep != "" {
		if err := os.WriteFile(keep+".pods", []byte(table.String()), 0o644); err != nil {
			b.Errorf("keep the pods' times: %v", err)
		}
	}
	slices.Sort(fromAnswer)
	slices.Sort(fromSent)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	out := map[string]float64{
		"p50-ms": ms(benchPercentile(fromAnswer, 50)), "p99-ms": ms(benchPercentile(fromAnswer, 99)), "max-ms": ms(fromAnswer[len(fromAnswer)-1]),
		"p50-from-sent-ms": ms(benchPercentile(fromSent, 50)), "p99-from-sent-ms": ms(benchPercentile(fromSent, 99)),
	}
	out["host-cpu-busy-%"] = 100 * float64(busy1-busy0) / float64(total1-total0)
	out["agent-cpu-s"] = agentCPU.Seconds()
	b.Logf("iteration %d: create answered → Running seen, sorted: %v; host CPU %.0f%% busy meanwhile, the agent used %v of CPU",
		iter, benchRound(fromAnswer), out["host-cpu-busy-%"], agentCPU.Round(time.Millisecond))

	// Steady state: the pods run and the link is up; then the agent's
	// memory.
	time.Sleep(startupSteady)
	s, err := n.status()
	if err != nil {
		b.Fatalf("outpost status: %v", err)
	}
	if s.Agent == nil || s.Agent.Link == nil || !s.Agent.Link.Connected {
		b.Fatalf("agent not connected after the steady state: %s", asJSON(s.Agent))
	}
	runningPods := 0
	for i := range s.Pods {
		if s.Pods[i].Status != nil && running(&s.Pods[i]) {
			runningPods++
		}
	}
	if runningPods != startupPods {
		b.Fatalf("%d pods running on the agent after the steady state, want %d", runningPods, startupPods)
	}
	mem := benchProcStatus(b, pid, "VmRSS", "RssAnon", "RssFile")
	for k, v := range mem {
		out[k+"-MiB"] = float64(v) / 1024
	}
	b.Logf("iteration %d: agent pid %d (%s) with %d pods running, link up: VmRSS %.1f MiB (RssAnon %.1f, RssFile %.1f: %s); journal backlog %d",
		iter, pid, benchBin(), runningPods, float64(mem["VmRSS"])/1024, float64(mem["RssAnon"])/1024, float64(mem["RssFile"])/1024,
		benchFileRss(b, pid), s.JournalBacklog)
	return out
}

// benchPercentile is the nearest-rank p-th percentile of sorted ds.
func benchPercentile(ds []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p/100*float64(len(ds)))) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

func benchRound(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// benchPods is how many pods the startup benchmark creates.
func benchPods(b *testing.B) int {
	v := os.Getenv("BENCH_PODS")
	if v == "" {
		return defaultStartupPods
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("BENCH_PODS=%q: want a number of pods, at least 1", v)
	}
	return n
}

// benchPodGap is the time between two pod creates: none (all at once)
// unless BENCH_POD_RATE sets pods per second.
func benchPodGap(b *testing.B) time.Duration {
	v := os.Getenv("BENCH_POD_RATE")
	if v == "" {
		return 0
	}
	r, err := strconv.ParseFloat(v, 64)
	if err != nil || r <= 0 {
		b.Fatalf("BENCH_POD_RATE=%q: want pods per second, more than 0", v)
	}
	return time.Duration(float64(time.Second) / r)
}

// benchBin is the agent binary the benchmark runs.
func benchBin() string { return cmp.Or(os.Getenv("BENCH_OUTPOST"), outpostBin) }

// benchNode is an agent for a benchmark: what newNode and connect make
// for a test, with testing.TB.
type benchNode struct {
	name, dir, cfg, netns string
	// podNetns prefixes the names of the node's pod network namespaces.
	podNetns string
	ctrd     *env.Containerd
	agent    *exec.Cmd
	done     chan struct{}
}

// startBenchNode starts a private containerd with the test image, a
// network namespace, and the agent in it connected to api with the node
// identity through a forwarder (with api nil, an agent with no API
// server, on its manifests alone); all are stopped in b's cleanup.
func startBenchNode(b *testing.B, name string, api *env.APIServer) *benchNode {
	b.Helper()
	n := newBenchNode(b, name, api)
	n.startAgent(b)
	return n
}

// newBenchNode sets up what startBenchNode does but the agent, which
// startAgent starts.
func newBenchNode(b *testing.B, name string, api *env.APIServer) *benchNode {
	b.Helper()
	return newBenchNodeOn(b, name, api, "")
}

// newBenchNodeOn is newBenchNode with the pods on the OCI runtime
// ociRuntime (containerd.ociRuntime; empty is runc), its containerd
// without the host's cgroup v2 hierarchy where it is hybrid
// (env.StartContainerdV1Only): crun 1.8 refuses that layout.
func newBenchNodeOn(b *testing.B, name string, api *env.APIServer, ociRuntime string) *benchNode {
	b.Helper()
	dir := b.TempDir()
	// The agent's runDir is a tmpfs, as /run/outpost is on a board;
	// mounted before containerd starts, so that a containerd in a mount
	// namespace of its own has it too (the FIFOs of the containers' output
	// are there).
	env.Tmpfs(b, filepath.Join(dir, "run"))
	var ctrd *env.Containerd
	if ociRuntime == "" {
		ctrd = env.StartContainerd(b)
	} else {
		ctrd = env.StartContainerdV1Only(b)
	}
	ns := fmt.Sprintf("outpost-bench-%d", time.Now().UnixNano()%1e9)
	ctrd.ImportTestImage(b, ns)
	n := &benchNode{name: name, dir: dir, cfg: filepath.Join(dir, "config.yaml"), netns: ns, ctrd: ctrd,
		podNetns: fmt.Sprintf("ob%d-", time.Now().UnixNano()%1e9)}
	for _, d := range []string{"manifests", "images"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	addNetns(b, n.netns)
	b.Cleanup(func() {
		n.kill()
		n.removePodNetns()
		exec.Command("ip", "netns", "delete", n.netns).Run()
	})
	ctrd.StopFirst(n.kill)
	kubeconfig := ""
	if api != nil {
		kubeconfig = "kubeconfig: " + api.NodeKubeconfig(b, name)
	}
	cfg := fmt.Sprintf(`nodeName: %s
stateDir: %s
manifestDir: %s
imageDir: %s
logDir: %s
runDir: %s
%s
containerd:
  address: %s
  namespace: %s
  cgroupParent: %s
  shimGroups: %s
  ociRuntime: %q
network:
  netnsPrefix: %s
log:
  level: %s
`, name, filepath.Join(dir, "state"), filepath.Join(dir, "manifests"), filepath.Join(dir, "images"),
		filepath.Join(dir, "logs"), n.runDir(), kubeconfig, ctrd.Address, ns, ctrd.CgroupParent, cmp.Or(os.Getenv("BENCH_SHIM_GROUPS"), "4"), ociRuntime, n.podNetns, cmp.Or(os.Getenv("BENCH_LOG"), "info"))
	if err := os.WriteFile(n.cfg, []byte(cfg), 0o644); err != nil {
		b.Fatal(err)
	}
	if api != nil {
		u, err := url.Parse(api.URL)
		if err != nil {
			b.Fatal(err)
		}
		benchForward(b, "/run/netns/"+n.netns, u.Host)
	}
	logPath := filepath.Join(dir, "agent.log")
	b.Cleanup(func() {
		data, _ := os.ReadFile(logPath)
		if keep := os.Getenv("BENCH_KEEP_LOG"); keep != "" {
			var audit []byte
			if api != nil {
				audit, _ = os.ReadFile(filepath.Join(api.Dir, "audit.log"))
			}
			if err := errors.Join(os.WriteFile(keep, data, 0o644), os.WriteFile(keep+".audit", audit, 0o644)); err != nil {
				b.Errorf("keep the logs: %v", err)
			}
		}
		if b.Failed() {
			lines := strings.Split(string(data), "\n")
			b.Logf("agent log (last lines):\n%s", strings.Join(lines[max(0, len(lines)-60):], "\n"))
		}
	})
	return n
}

// runDir is the agent's runDir: a tmpfs, which a reboot empties.
func (n *benchNode) runDir() string { return filepath.Join(n.dir, "run") }

// removePodNetns removes the pins of the node's pod network namespaces.
func (n *benchNode) removePodNetns() {
	removeNetnsPins(func(e string) bool { return strings.HasPrefix(e, n.podNetns) })
}

// startAgent starts the agent in the node's network namespace, its log
// appended to the node's agent.log.
func (n *benchNode) startAgent(b *testing.B) {
	b.Helper()
	logf, err := os.OpenFile(filepath.Join(n.dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("nsenter", "--net=/run/netns/"+n.netns, benchBin(), "agent", "--config", n.cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		b.Fatal(err)
	}
	done := make(chan struct{})
	n.agent, n.done = cmd, done
	go func() { cmd.Wait(); logf.Close(); close(done) }()
}

// benchForward makes addr, on the host's loopback, reachable at the same
// address in the network namespace at nsPath, until b's cleanup.
func benchForward(b *testing.B, nsPath, addr string) {
	b.Helper()
	var ln net.Listener
	if err := inNetns(nsPath, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		b.Fatalf("listen on %s in the node's namespace: %v", addr, err)
	}
	f := &forwarder{ln: ln, open: map[net.Conn]bool{}}
	f.wg.Add(1)
	go f.serve(addr)
	b.Cleanup(func() {
		ln.Close()
		f.pause() // closes the open connections
		f.wg.Wait()
	})
}

func (n *benchNode) kill() {
	if n.agent == nil {
		return
	}
	n.agent.Process.Signal(syscall.SIGKILL)
	<-n.done
	n.agent = nil
}

func (n *benchNode) status() (agent.Status, error) {
	var s agent.Status
	out, err := exec.Command(outpostBin, "status", "-o", "json", "--config", n.cfg).Output()
	if err != nil {
		return s, err
	}
	err = json.Unmarshal(out, &s)
	return s, err
}

// agentPID returns the PID of the outpost agent process: nsenter execs it
// in place when it enters only a network namespace, so it is the
// command's own PID; were nsenter to fork, its child.
func (n *benchNode) agentPID(b *testing.B) int {
	b.Helper()
	isAgent := func(pid int) bool {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(data), "\x00")
		return err == nil && len(args) > 1 && args[0] == benchBin() && args[1] == "agent" && slices.Contains(args, n.cfg)
	}
	pid := n.agent.Process.Pid
	if isAgent(pid) {
		return pid
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		b.Fatalf("children of nsenter %d: %v", pid, err)
	}
	for _, f := range strings.Fields(string(data)) {
		if c, err := strconv.Atoi(f); err == nil && isAgent(c) {
			return c
		}
	}
	b.Fatalf("no outpost agent process for %s: pid %d is not it, nor any of its children %q", n.cfg, pid, data)
	return 0
}

// benchHostCPU returns the machine's busy and total CPU time so far, in
// clock ticks, from /proc/stat (idle and iowait are not busy).
func benchHostCPU(b *testing.B) (busy, total int64) {
	b.Helper()
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fs := strings.Fields(line)
	if len(fs) < 6 || fs[0] != "cpu" {
		b.Fatalf("/proc/stat: first line %q", line)
	}
	for i, f := range fs[1:] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			b.Fatalf("/proc/stat: %q: %v", line, err)
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

// benchClockTicks is USER_HZ, the unit of /proc's CPU times (100 on Linux).
const benchClockTicks = 100

// benchProcCPU returns the user and system CPU time process pid used so far.
func benchProcCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command (which may hold spaces) in parens.
	_, rest, _ := strings.Cut(string(data), ") ")
	fs := strings.Fields(rest)
	if len(fs) < 13 {
		b.Fatalf("/proc/%d/stat: %q", pid, data)
	}
	var ticks int64
	for _, f := range fs[11:13] { // utime, stime: fields 14 and 15
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/stat: %q: %v", pid, data, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / benchClockTicks
}

// benchFileRss says which files the process's file-backed resident pages
// belong to, largest first, from /proc/PID/smaps.
func benchFileRss(b *testing.B, pid int) string {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	byFile := map[string]int64{}
	file := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		switch {
		case len(fs) >= 5 && strings.Contains(fs[0], "-") && !strings.HasSuffix(fs[0], ":"):
			// A mapping's header: address range, perms, offset, dev, inode[, path].
			file = ""
			if len(fs) >= 6 && fs[4] != "0" {
				file = filepath.Base(fs[5])
			}
		case len(fs) == 3 && fs[0] == "Rss:" && file != "":
			kb, _ := strconv.ParseInt(fs[1], 10, 64)
			byFile[file] += kb
		}
	}
	type entry struct {
		file string
		kb   int64
	}
	var es []entry
	for f, kb := range byFile {
		if kb > 0 {
			es = append(es, entry{f, kb})
		}
	}
	slices.SortFunc(es, func(a, b entry) int { return cmp.Compare(b.kb, a.kb) })
	var parts []string
	for _, e := range es[:min(len(es), 4)] {
		parts = append(parts, fmt.Sprintf("%s %.1f MiB", e.file, float64(e.kb)/1024))
	}
	return strings.Join(parts, ", ")
}

// benchProcStatus reads the named kB fields of /proc/PID/status.
func benchProcStatus(b *testing.B, pid int, names ...string) map[string]int64 {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || !slices.Contains(names, k) {
			continue
		}
		num, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/status %s: %v", pid, k, err)
		}
		out[k] = num
	}
	if err := sc.Err(); err != nil {
		b.Fatal(err)
	}
	if len(out) != len(names) {
		b.Fatalf("/proc/%d/status: found %v of %v", pid, out, names)
	}
	return out
}
