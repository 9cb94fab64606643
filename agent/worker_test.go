package agent_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/agent/runtimetest"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/internal/waittest"
	"github.com/outpost-edge/outpost/store"
)

// syncClock is the fake clock with a count of timer resets. A pod worker
// re-arms its one timer at the end of every sync, so the count tells a
// test that a worker has finished reacting and waits again, and the armed
// deadlines tell how many workers an Advance will wake.
type syncClock struct {
	*clocktest.Fake
	mu     sync.Mutex
	resets int
	armed  map[*syncTimer]time.Time
}

type syncTimer struct {
	clock.Timer
	c *syncClock
}

func (c *syncClock) NewTimer(d time.Duration) clock.Timer {
	t := &syncTimer{Timer: c.Fake.NewTimer(d), c: c}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed[t] = c.Now().Add(d)
	return t
}

func (t *syncTimer) Stop() bool {
	was := t.Timer.Stop()
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	delete(t.c.armed, t)
	return was
}

func (t *syncTimer) Reset(d time.Duration) bool {
	was := t.Timer.Reset(d)
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.c.armed[t] = t.c.Now().Add(d)
	t.c.resets++
	return was
}

// syncs returns how many worker syncs have finished.
func (c *syncClock) syncs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resets
}

// due returns how many armed timers fire within d.
func (c *syncClock) due(d time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	end, n := c.Now().Add(d), 0
	for _, at := range c.armed {
		if !at.After(end) {
			n++
		}
	}
	return n
}

// harness runs pod managers over a real store and the fake runtime, the
// way Agent.Run does, one at a time (a second one is the agent after a
// restart).
type harness struct {
	t    *testing.T
	dir  string
	st   *store.Store
	clk  *syncClock
	rt   *runtimetest.Fake
	m    *agent.PodManager
	stop func()
	// refresh, when set before start, is the manager's RefreshVolumes.
	refresh func(ctx context.Context, pod *corev1.Pod, podIP string) error
	// cgroups, when set before start, is the manager's Cgroups.
	cgroups agent.PodCgroups
	// teardown, when set before start, is the manager's TeardownVolumes.
	teardown func(podUID string) error
	// spareAfter, when set before start, is the manager's SpareAfter.
	spareAfter time.Duration
}

var epoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newHarness(t *testing.T) *harness {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, store.FileName), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	clk := &syncClock{Fake: clocktest.New(epoch), armed: map[*syncTimer]time.Time{}}
	h := &harness{t: t, dir: dir, st: st, clk: clk, rt: runtimetest.New(clk)}
	h.rt.AddImage("busybox:1")
	t.Cleanup(func() {
		h.stopManager()
		st.Close()
	})
	return h
}

// start runs a new pod manager until stopManager or the test's end.
func (h *harness) start() {
	h.t.Helper()
	if h.stop != nil {
		h.t.Fatal("a pod manager is already running")
	}
	cfg := agent.PodConfig{
		NodeName: "n1", HostIP: "192.0.2.10", ClusterDNS: "10.96.0.10", ClusterDomain: "cluster.local",
		PodsDir: filepath.Join(h.dir, "pods"), LogDir: filepath.Join(h.dir, "logs"),
		SpareAfter: h.spareAfter,
	}
	deps := agent.PodDeps{Runtime: h.rt, Rand: func(int64) int64 { return 0 }, RefreshVolumes: h.refresh, Cgroups: h.cgroups, TeardownVolumes: h.teardown}
	h.m = agent.NewPodManager(cfg, deps, h.st, h.clk, slog.New(slog.NewTextHandler(h.t.Output(), nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	m := h.m
	go func() { m.Run(ctx); close(done) }()
	h.stop = func() { cancel(); <-done }
}

// stopManager stops the pod manager as an agent shutdown or crash would:
// containers keep running.
func (h *harness) stopManager() {
	if h.stop != nil {
		h.stop()
		h.stop = nil
	}
}

func (h *harness) put(pods ...*corev1.Pod) {
	h.t.Helper()
	for _, p := range pods {
		if err := h.st.Pods().Put(store.SourceStatic, p); err != nil {
			h.t.Fatal(err)
		}
	}
}

// eventually waits for cond for at most 5 s of wall time: only for the
// worker goroutines to react, never for fake time. Its failure shows the
// containers and the journal as last seen.
func (h *harness) eventually(what string, cond func() bool) {
	h.t.Helper()
	waittest.Poll{Timeout: 5 * time.Second, Every: 2 * time.Millisecond}.For(h.t, what, func() (bool, string) {
		if cond() {
			return true, ""
		}
		return false, "\ncontainers:\n" + h.rt.Dump() + "journal:\n" + h.journal()
	})
}

// synced waits until cond holds and more than after worker syncs have
// finished, so the worker that made cond true waits again.
func (h *harness) synced(after int, what string, cond func() bool) {
	h.t.Helper()
	h.eventually(what, func() bool { return h.clk.syncs() > after && cond() })
}

// advance moves the fake clock by d, with every worker idle, and waits
// until each worker whose timer fell due has synced. A worker that has
// removed its pod is waited for first: its timer stays armed until it
// exits, and would count as due without ever syncing.
func (h *harness) advance(d time.Duration) {
	h.t.Helper()
	h.eventually("removed pods' workers to exit", func() bool { return h.m == nil || h.m.Exiting() == 0 })
	n, due := h.clk.syncs(), h.clk.due(d)
	h.clk.Advance(d)
	h.eventually(fmt.Sprintf("%d worker(s) to sync after %v", due, d), func() bool { return h.clk.syncs() >= n+due })
}

// exit ends a running container and waits for its worker's sync and cond.
func (h *harness) exit(id string, code int32, what string, cond func() bool) {
	h.t.Helper()
	n := h.clk.syncs()
	if err := h.rt.Exit(id, code); err != nil {
		h.t.Fatal(err)
	}
	h.synced(n, what, cond)
}

// entries returns the journaled pod statuses by journal key.
func (h *harness) entries() map[string]store.Entry {
	h.t.Helper()
	es, err := h.st.Pending(0, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]store.Entry{}
	for _, e := range es {
		out[e.Key] = e
	}
	return out
}

func (h *harness) journal() string {
	var b strings.Builder
	es, _ := h.st.Pending(0, 0)
	for _, e := range es {
		var p corev1.Pod
		if err := p.Unmarshal(e.Value); err != nil {
			fmt.Fprintf(&b, "%s: %v\n", e.Key, err)
			continue
		}
		fmt.Fprintf(&b, "%s seq=%d phase=%s", e.Key, e.Seq, p.Status.Phase)
		for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			fmt.Fprintf(&b, " %s:%s restarts=%d", cs.Name, stateOf(cs), cs.RestartCount)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// status returns pod's journaled status; ok is false when none is.
func (h *harness) status(p *corev1.Pod) (st corev1.PodStatus, seq uint64, ok bool) {
	h.t.Helper()
	e, ok := h.entries()[agent.JournalKey(p.Namespace, p.Name)]
	if !ok {
		return st, 0, false
	}
	var got corev1.Pod
	if err := got.Unmarshal(e.Value); err != nil {
		h.t.Fatalf("journal %s: %v", e.Key, err)
	}
	if got.UID != p.UID {
		h.t.Fatalf("journal %s has uid %s, want %s", e.Key, got.UID, p.UID)
	}
	return got.Status, e.Seq, true
}

// phase returns pod's journaled phase, "" before any status.
func (h *harness) phase(p *corev1.Pod) corev1.PodPhase {
	st, _, _ := h.status(p)
	return st.Phase
}

// container returns the journaled status of pod's (init) container name.
func (h *harness) container(p *corev1.Pod, name string) corev1.ContainerStatus {
	st, _, _ := h.status(p)
	for _, cs := range append(st.InitContainerStatuses, st.ContainerStatuses...) {
		if cs.Name == name {
			return cs
		}
	}
	return corev1.ContainerStatus{}
}

// stateOf names a container status's state: "running", "waiting:REASON"
// or "terminated:CODE".
func stateOf(cs corev1.ContainerStatus) string {
	switch {
	case cs.State.Running != nil:
		return "running"
	case cs.State.Waiting != nil:
		return "waiting:" + cs.State.Waiting.Reason
	case cs.State.Terminated != nil:
		return fmt.Sprintf("terminated:%d", cs.State.Terminated.ExitCode)
	}
	return "none"
}

func (h *harness) state(p *corev1.Pod, name string) string { return stateOf(h.container(p, name)) }

func (h *harness) condition(p *corev1.Pod, t corev1.PodConditionType) corev1.ConditionStatus {
	st, _, _ := h.status(p)
	for _, c := range st.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

// running reports whether container id is running.
func (h *harness) running(id string) bool {
	c, ok := h.rt.Container(id)
	return ok && c.State == agent.StateRunning
}

func (h *harness) startedAt(id string) time.Time {
	h.t.Helper()
	c, ok := h.rt.Container(id)
	if !ok {
		h.t.Fatalf("no container %s", id)
	}
	return c.StartedAt
}

// count returns how many calls start with prefix.
func (h *harness) count(prefix string) int {
	n := 0
	for _, c := range h.rt.Calls() {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

func (h *harness) wantDump(want string) {
	h.t.Helper()
	if got := h.rt.Dump(); got != want {
		h.t.Fatalf("containers:\n%s\nwant:\n%s", got, want)
	}
}

// newPod returns a pod in namespace default with a UID like a static
// pod's (32 hex digits, derived from name).
func newPod(name string, policy corev1.RestartPolicy, containers ...corev1.Container) *corev1.Pod {
	sum := sha256.Sum256([]byte(name))
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(hex.EncodeToString(sum[:])[:32])},
		Spec:       corev1.PodSpec{RestartPolicy: policy, Containers: containers},
	}
}

func ctr(name string) corev1.Container {
	return corev1.Container{Name: name, Image: "busybox:1", ImagePullPolicy: corev1.PullIfNotPresent, Command: []string{"sleep", "inf"}}
}

func id(p *corev1.Pod, name string, attempt int) string {
	return agent.ContainerID(string(p.UID), name, attempt)
}

func TestPodContainersAreCreatedAndStartedOnce(t *testing.T) {
	h := newHarness(t)
	p := newPod("web", corev1.RestartPolicyAlways, ctr("app"), ctr("sidecar"))
	h.put(p)
	h.start()
	h.synced(0, "both containers running", func() bool {
		return h.running(id(p, "app", 0)) && h.running(id(p, "sidecar", 0)) && h.phase(p) == corev1.PodRunning
	})
	want := id(p, "app", 0) + " running attempt=0\n" + id(p, "sidecar", 0) + " running attempt=0\n"
	h.wantDump(want)
	if h.condition(p, corev1.PodReady) != corev1.ConditionTrue || h.state(p, "app") != "running" || h.state(p, "sidecar") != "running" {
		t.Fatalf("status:\n%s", h.journal())
	}
	spec, _ := h.rt.Spec(id(p, "app", 0))
	if !slices.Equal(spec.Args, []string{"sleep", "inf"}) || spec.Labels[agent.LabelPodUID] != string(p.UID) {
		t.Fatalf("spec = %+v", spec)
	}
	_, seq, _ := h.status(p)

	// Resyncs and wake-ups find the containers running and change nothing.
	for range 3 {
		h.advance(10 * time.Second)
	}
	h.wantDump(want)
	if n := h.count("create "); n != 2 {
		t.Fatalf("%d creates, want 2: %q", n, h.rt.Calls())
	}
	if n := h.count("start "); n != 2 {
		t.Fatalf("%d starts, want 2: %q", n, h.rt.Calls())
	}
	if _, again, _ := h.status(p); again != seq {
		t.Fatalf("unchanged status journaled again: seq %d -> %d", seq, again)
	}
}

// execReadiness is a readiness probe every period seconds that execs
// "check" in the container, which the fake runtime answers as its SetExec
// says.
func execReadiness(period int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"check"}}},
		PeriodSeconds: period, TimeoutSeconds: 3600,
	}
}

// TestProbesStartInTheSyncThatStartsTheContainer checks that the sync
// that starts a container also starts its probes, once it has read the
// container back running: the clock never moves here, so a worker that
// left them to a later sync would leave the pod unready.
func TestProbesStartInTheSyncThatStartsTheContainer(t *testing.T) {
	h := newHarness(t)
	p := newPod("web", corev1.RestartPolicyAlways, ctr("app"))
	p.Spec.Containers[0].ReadinessProbe = execReadiness(10)
	h.rt.SetExec(func(context.Context, string, []string) (int, []byte, error) { return 0, nil, nil })
	h.put(p)
	h.start()
	h.synced(0, "web ready with the clock still", func() bool { return h.condition(p, corev1.PodReady) == corev1.ConditionTrue })
	if n := h.count("create "); n != 1 {
		t.Fatalf("%d creates, want 1: %q", n, h.rt.Calls())
	}
}

// TestContainerSpecCarriesTTYAndStdin checks that a container's tty,
// stdin and stdinOnce reach the runtime's spec, and that a container
// without them asks for none.
func TestContainerSpecCarriesTTYAndStdin(t *testing.T) {
	h := newHarness(t)
	with := func(name string, set func(c *corev1.Container)) corev1.Container {
		c := ctr(name)
		set(&c)
		return c
	}
	p := newPod("stdio", corev1.RestartPolicyAlways,
		ctr("plain"),
		with("term", func(c *corev1.Container) { c.TTY = true }),
		with("in", func(c *corev1.Container) { c.Stdin = true }),
		with("once", func(c *corev1.Container) { c.Stdin, c.StdinOnce = true, true }),
		with("both", func(c *corev1.Container) { c.TTY, c.Stdin = true, true }),
	)
	h.put(p)
	h.start()
	h.synced(0, "all containers running", func() bool {
		for _, c := range p.Spec.Containers {
			if !h.running(id(p, c.Name, 0)) {
				return false
			}
		}
		return true
	})
	for _, tc := range []struct {
		name                  string
		tty, stdin, stdinOnce bool
	}{
		{name: "plain"},
		{name: "term", tty: true},
		{name: "in", stdin: true},
		{name: "once", stdin: true, stdinOnce: true},
		{name: "both", tty: true, stdin: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec, ok := h.rt.Spec(id(p, tc.name, 0))
			if !ok {
				t.Fatalf("no container %s:\n%s", tc.name, h.rt.Dump())
			}
			if spec.TTY != tc.tty || spec.Stdin != tc.stdin || spec.StdinOnce != tc.stdinOnce {
				t.Fatalf("spec tty=%v stdin=%v stdinOnce=%v, want %v %v %v",
					spec.TTY, spec.Stdin, spec.StdinOnce, tc.tty, tc.stdin, tc.stdinOnce)
			}
		})
	}
	h.wantDump(id(p, "both", 0) + " running attempt=0 tty stdin\n" +
		id(p, "in", 0) + " running attempt=0 stdin\n" +
		id(p, "once", 0) + " running attempt=0 stdin stdinOnce\n" +
		id(p, "plain", 0) + " running attempt=0\n" +
		id(p, "term", 0) + " running attempt=0 tty\n")
}

func TestCrashLoopBackOffDoublesAndCountsRestarts(t *testing.T) {
	h := newHarness(t)
	p := newPod("crash", corev1.RestartPolicyAlways, ctr("app"))
	h.put(p)
	h.start()
	h.synced(0, "app running", func() bool { return h.running(id(p, "app", 0)) })

	// First crash: back off 10 s before the restart.
	crashed := h.clk.Now()
	h.exit(id(p, "app", 0), 1, "CrashLoopBackOff", func() bool { return h.state(p, "app") == "waiting:CrashLoopBackOff" })
	cs := h.container(p, "app")
	if !strings.Contains(cs.State.Waiting.Message, "back-off 10s") || cs.RestartCount != 0 ||
		cs.LastTerminationState.Terminated == nil || cs.LastTerminationState.Terminated.ExitCode != 1 {
		t.Fatalf("status during first back-off: %+v", cs)
	}
	// kubelet reports a crash-looping pod as Running, not Pending.
	if ph := h.phase(p); ph != corev1.PodRunning {
		t.Fatalf("phase during back-off = %s, want Running", ph)
	}
	h.advance(9 * time.Second)
	h.wantDump(id(p, "app", 0) + " exited attempt=0 exit=1\n")
	h.advance(time.Second)
	h.wantDump(id(p, "app", 0) + " exited attempt=0 exit=1\n" + id(p, "app", 1) + " running attempt=1\n")
	if got := h.startedAt(id(p, "app", 1)).Sub(crashed); got != 10*time.Second {
		t.Fatalf("restarted %v after the crash, want 10s", got)
	}
	h.eventually("restart count 1", func() bool {
		cs := h.container(p, "app")
		return stateOf(cs) == "running" && cs.RestartCount == 1
	})

	// Second crash: 20 s.
	crashed = h.clk.Now()
	h.exit(id(p, "app", 1), 2, "CrashLoopBackOff again", func() bool { return h.state(p, "app") == "waiting:CrashLoopBackOff" })
	cs = h.container(p, "app")
	if !strings.Contains(cs.State.Waiting.Message, "back-off 20s") || cs.RestartCount != 1 || cs.LastTerminationState.Terminated.ExitCode != 2 {
		t.Fatalf("status during second back-off: %+v", cs)
	}
	// Only the newest dead attempt is kept, for logs --previous.
	h.wantDump(id(p, "app", 1) + " exited attempt=1 exit=2\n")
	h.advance(19 * time.Second)
	if h.running(id(p, "app", 2)) {
		t.Fatalf("restarted before 20s:\n%s", h.rt.Dump())
	}
	h.advance(time.Second)
	h.wantDump(id(p, "app", 1) + " exited attempt=1 exit=2\n" + id(p, "app", 2) + " running attempt=2\n")
	if got := h.startedAt(id(p, "app", 2)).Sub(crashed); got != 20*time.Second {
		t.Fatalf("restarted %v after the second crash, want 20s", got)
	}
	h.eventually("restart count 2", func() bool { return h.container(p, "app").RestartCount == 2 })
	rs, ok, err := h.st.Restart(string(p.UID), "app")
	if err != nil || !ok || rs.Count != 2 || time.Duration(rs.Backoff) != 20*time.Second {
		t.Fatalf("stored restart state = %+v %v %v", rs, ok, err)
	}
}

func TestRestartPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy  corev1.RestartPolicy
		exit    int32
		restart bool
		phase   corev1.PodPhase // after the exit
	}{
		{corev1.RestartPolicyAlways, 0, true, corev1.PodRunning},
		{corev1.RestartPolicyOnFailure, 0, false, corev1.PodSucceeded},
		{corev1.RestartPolicyOnFailure, 1, true, corev1.PodRunning},
		{corev1.RestartPolicyNever, 1, false, corev1.PodFailed},
		{corev1.RestartPolicyNever, 0, false, corev1.PodSucceeded},
	} {
		t.Run(fmt.Sprintf("%s/exit%d", tc.policy, tc.exit), func(t *testing.T) {
			h := newHarness(t)
			p := newPod("job", tc.policy, ctr("app"))
			h.put(p)
			h.start()
			h.synced(0, "app running", func() bool { return h.running(id(p, "app", 0)) })
			h.exit(id(p, "app", 0), tc.exit, "phase "+string(tc.phase), func() bool { return h.phase(p) == tc.phase })
			exited := fmt.Sprintf("%s exited attempt=0 exit=%d\n", id(p, "app", 0), tc.exit)
			h.advance(10 * time.Second)
			if !tc.restart {
				h.advance(10 * time.Minute)
				h.wantDump(exited)
				if ph := h.phase(p); ph != tc.phase {
					t.Fatalf("phase = %s later, want %s", ph, tc.phase)
				}
				if st := h.state(p, "app"); st != fmt.Sprintf("terminated:%d", tc.exit) {
					t.Fatalf("app state = %s", st)
				}
				return
			}
			h.wantDump(exited + id(p, "app", 1) + " running attempt=1\n")
			h.eventually("phase Running", func() bool { return h.phase(p) == corev1.PodRunning })
		})
	}
}

func initPod(name string, policy corev1.RestartPolicy) *corev1.Pod {
	p := newPod(name, policy, ctr("app"))
	p.Spec.InitContainers = []corev1.Container{ctr("init1"), ctr("init2")}
	return p
}

func TestInitContainersRunInOrder(t *testing.T) {
	h := newHarness(t)
	p := initPod("init", corev1.RestartPolicyAlways)
	h.put(p)
	h.start()
	h.synced(0, "init1 running", func() bool { return h.running(id(p, "init1", 0)) })
	h.wantDump(id(p, "init1", 0) + " running attempt=0\n")
	if h.phase(p) != corev1.PodPending || h.condition(p, corev1.PodInitialized) != corev1.ConditionFalse ||
		h.state(p, "app") != "waiting:PodInitializing" {
		t.Fatalf("status while initializing:\n%s", h.journal())
	}
	h.advance(10 * time.Second) // a resync does not start the next one early
	h.wantDump(id(p, "init1", 0) + " running attempt=0\n")

	h.exit(id(p, "init1", 0), 0, "init2 running", func() bool { return h.running(id(p, "init2", 0)) })
	h.wantDump(id(p, "init1", 0) + " exited attempt=0 exit=0\n" + id(p, "init2", 0) + " running attempt=0\n")

	h.exit(id(p, "init2", 0), 0, "app running", func() bool { return h.running(id(p, "app", 0)) && h.phase(p) == corev1.PodRunning })
	h.wantDump(id(p, "app", 0) + " running attempt=0\n" + id(p, "init1", 0) + " exited attempt=0 exit=0\n" + id(p, "init2", 0) + " exited attempt=0 exit=0\n")
	if h.condition(p, corev1.PodInitialized) != corev1.ConditionTrue || h.state(p, "init1") != "terminated:0" || h.state(p, "init2") != "terminated:0" {
		t.Fatalf("status after init:\n%s", h.journal())
	}
	// Done init containers are not run again.
	h.advance(10 * time.Second)
	if n := h.count("create "); n != 3 {
		t.Fatalf("%d creates, want 3: %q", n, h.rt.Calls())
	}
}

func TestFailedInitContainer(t *testing.T) {
	t.Run("Never fails the pod", func(t *testing.T) {
		h := newHarness(t)
		p := initPod("init-never", corev1.RestartPolicyNever)
		h.put(p)
		h.start()
		h.synced(0, "init1 running", func() bool { return h.running(id(p, "init1", 0)) })
		h.exit(id(p, "init1", 0), 1, "phase Failed", func() bool { return h.phase(p) == corev1.PodFailed })
		h.advance(10 * time.Second)
		h.advance(10 * time.Minute)
		h.wantDump(id(p, "init1", 0) + " exited attempt=0 exit=1\n")
		if h.state(p, "init1") != "terminated:1" || h.condition(p, corev1.PodInitialized) != corev1.ConditionFalse || h.phase(p) != corev1.PodFailed {
			t.Fatalf("status:\n%s", h.journal())
		}
	})
	t.Run("OnFailure retries it first", func(t *testing.T) {
		h := newHarness(t)
		p := initPod("init-onfailure", corev1.RestartPolicyOnFailure)
		h.put(p)
		h.start()
		h.synced(0, "init1 running", func() bool { return h.running(id(p, "init1", 0)) })
		h.exit(id(p, "init1", 0), 1, "init1 backing off", func() bool { return h.state(p, "init1") == "waiting:CrashLoopBackOff" })
		if h.phase(p) != corev1.PodPending {
			t.Fatalf("phase = %s, want Pending", h.phase(p))
		}
		h.advance(10 * time.Second)
		h.wantDump(id(p, "init1", 0) + " exited attempt=0 exit=1\n" + id(p, "init1", 1) + " running attempt=1\n")
		h.exit(id(p, "init1", 1), 0, "init2 running", func() bool { return h.running(id(p, "init2", 0)) })
		h.exit(id(p, "init2", 0), 0, "app running", func() bool { return h.running(id(p, "app", 0)) })
	})
}

func TestDeletedPodRunsPreStopThenStopsAndRemovesContainers(t *testing.T) {
	h := newHarness(t)
	p := newPod("gone", corev1.RestartPolicyAlways, ctr("app"), ctr("sidecar"))
	grace := int64(5)
	p.Spec.TerminationGracePeriodSeconds = &grace
	p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"drain"}}}}
	h.rt.SetHandlesSIGTERM(id(p, "app", 0), true)
	h.put(p)
	h.start()
	h.synced(0, "containers running", func() bool { return h.running(id(p, "app", 0)) && h.running(id(p, "sidecar", 0)) })
	// Give it restart state to forget.
	h.exit(id(p, "sidecar", 0), 1, "sidecar backing off", func() bool { return h.state(p, "sidecar") == "waiting:CrashLoopBackOff" })
	h.advance(10 * time.Second)
	h.eventually("sidecar restarted", func() bool { return h.running(id(p, "sidecar", 1)) })
	podDir := filepath.Join(h.dir, "pods", string(p.UID))
	if _, err := os.Stat(podDir); err != nil {
		t.Fatal(err)
	}

	if _, err := h.st.Pods().Delete(p.Namespace, p.Name); err != nil {
		t.Fatal(err)
	}
	podGone := func() bool {
		_, err := os.Stat(podDir)
		_, restarts, _ := h.st.Restart(string(p.UID), "sidecar")
		return h.rt.Dump() == "" && os.IsNotExist(err) && !restarts && len(h.m.Events(string(p.UID))) == 0
	}
	h.eventually("containers, pod directory, restart state and events removed", podGone)
	if _, ok := h.m.Views()[string(p.UID)]; ok {
		t.Error("removed pod still in the views")
	}
	calls := h.rt.Calls()
	for _, want := range []string{
		"exec " + id(p, "app", 0) + " drain",
		"stop " + id(p, "app", 0) + " 5s",
		"stop " + id(p, "sidecar", 1) + " 5s",
		"remove " + id(p, "app", 0),
		"remove " + id(p, "sidecar", 0),
		"remove " + id(p, "sidecar", 1),
	} {
		if !slices.Contains(calls, want) {
			t.Errorf("no %q in calls %q", want, calls)
		}
	}
	if i, j := slices.Index(calls, "exec "+id(p, "app", 0)+" drain"), slices.Index(calls, "stop "+id(p, "app", 0)+" 5s"); i > j {
		t.Errorf("preStop hook ran after the stop: %q", calls)
	}
}

func TestOrphanContainersAreRemovedAtStart(t *testing.T) {
	h := newHarness(t)
	p := newPod("orphan", corev1.RestartPolicyAlways, ctr("app"))
	grace := int64(7)
	p.Spec.TerminationGracePeriodSeconds = &grace
	h.put(p)
	h.start()
	h.synced(0, "app running", func() bool { return h.running(id(p, "app", 0)) })
	h.stopManager()
	// Deleted while the agent was down.
	if _, err := h.st.Pods().Delete(p.Namespace, p.Name); err != nil {
		t.Fatal(err)
	}
	h.start()
	h.eventually("orphan removed", func() bool { return h.rt.Dump() == "" })
	// The pod's spec is gone; its grace period came from the container's label.
	if !slices.Contains(h.rt.Calls(), "stop "+id(p, "app", 0)+" 7s") {
		t.Errorf("orphan not stopped with the pod's 7 s grace period: %q", h.rt.Calls())
	}
}

func TestRestartStateSurvivesAgentRestart(t *testing.T) {
	h := newHarness(t)
	p := newPod("survivor", corev1.RestartPolicyAlways, ctr("app"))
	h.put(p)
	h.start()
	h.synced(0, "app running", func() bool { return h.running(id(p, "app", 0)) })
	h.exit(id(p, "app", 0), 1, "first back-off", func() bool { return h.state(p, "app") == "waiting:CrashLoopBackOff" })
	h.advance(10 * time.Second)
	h.eventually("attempt 1 running", func() bool { return h.running(id(p, "app", 1)) })
	crashed := h.clk.Now()
	h.exit(id(p, "app", 1), 1, "second back-off", func() bool {
		w := h.container(p, "app").State.Waiting
		return w != nil && strings.Contains(w.Message, "back-off 20s")
	})

	// The agent restarts 5 s into the 20 s back-off.
	h.stopManager()
	h.clk.Advance(5 * time.Second)
	n := h.clk.syncs()
	h.start()
	h.synced(n, "back-off after restart", func() bool {
		cs := h.container(p, "app")
		return stateOf(cs) == "waiting:CrashLoopBackOff" && cs.RestartCount == 1
	})
	h.advance(14 * time.Second)
	if h.running(id(p, "app", 2)) {
		t.Fatalf("restarted %v after the crash, before the 20s back-off", h.clk.Now().Sub(crashed))
	}
	h.advance(time.Second)
	h.eventually("attempt 2 running", func() bool { return h.running(id(p, "app", 2)) })
	if got := h.startedAt(id(p, "app", 2)).Sub(crashed); got != 20*time.Second {
		t.Fatalf("restarted %v after the crash, want 20s", got)
	}
	h.eventually("restart count 2", func() bool { return h.container(p, "app").RestartCount == 2 })
}

func TestContainerLostInRebootComesBackAtOnce(t *testing.T) {
	h := newHarness(t)
	p := newPod("rebooted", corev1.RestartPolicyAlways, ctr("app"))
	h.put(p)
	h.start()
	h.synced(0, "app running", func() bool { return h.running(id(p, "app", 0)) })
	h.stopManager()
	// The node loses power: the container did not crash, so no back-off,
	// but the restart counts.
	h.clk.Advance(time.Hour)
	h.rt.Reboot()
	n := h.clk.syncs()
	h.start()
	h.synced(n, "app running after reboot", func() bool {
		cs := h.container(p, "app")
		return h.running(id(p, "app", 1)) && stateOf(cs) == "running" && cs.RestartCount == 1
	})
	if term := h.container(p, "app").LastTerminationState.Terminated; term == nil || term.ExitCode != 255 || term.Reason != agent.ReasonLost {
		t.Fatalf("last termination = %+v", term)
	}
	// A crash after that backs off from the start, 10 s.
	h.exit(id(p, "app", 1), 1, "back-off", func() bool {
		w := h.container(p, "app").State.Waiting
		return w != nil && w.Reason == "CrashLoopBackOff" && strings.Contains(w.Message, "back-off 10s")
	})
	h.advance(10 * time.Second)
	h.eventually("attempt 2 running", func() bool { return h.running(id(p, "app", 2)) })
}

func TestMissingImageDoesNotBlockOtherPods(t *testing.T) {
	h := newHarness(t)
	never := newPod("never", corev1.RestartPolicyAlways, ctr("app"))
	never.Spec.Containers[0].Image, never.Spec.Containers[0].ImagePullPolicy = "local:1", corev1.PullNever
	unpullable := newPod("unpullable", corev1.RestartPolicyAlways, ctr("app"))
	unpullable.Spec.Containers[0].Image = "remote:1"
	good := newPod("good", corev1.RestartPolicyAlways, ctr("app"))
	h.put(never, unpullable, good)
	h.start()
	h.synced(2, "good running, the others waiting", func() bool {
		return h.running(id(good, "app", 0)) && h.phase(good) == corev1.PodRunning &&
			h.state(never, "app") == "waiting:ErrImageNeverPull" && h.state(unpullable, "app") == "waiting:ErrImagePull"
	})
	// ErrImagePull on the failed pull, then ImagePullBackOff while waiting.
	h.advance(time.Second)
	h.eventually("unpullable backing off", func() bool { return h.state(unpullable, "app") == "waiting:ImagePullBackOff" })
	if cs := h.container(never, "app"); !strings.Contains(cs.State.Waiting.Message, "local:1") || h.phase(never) != corev1.PodPending {
		t.Fatalf("never-pull pod status:\n%s", h.journal())
	}
	h.wantDump(id(good, "app", 0) + " running attempt=0\n")

	// The images show up: both pods start on their next try.
	h.rt.AddImage("local:1")
	h.rt.AddToRegistry("remote:1")
	h.advance(10 * time.Second)
	h.eventually("all running", func() bool {
		return h.running(id(never, "app", 0)) && h.running(id(unpullable, "app", 0)) &&
			h.phase(never) == corev1.PodRunning && h.phase(unpullable) == corev1.PodRunning
	})
	if !slices.Contains(h.rt.Calls(), "pull remote:1") {
		t.Fatalf("remote:1 not pulled: %q", h.rt.Calls())
	}
}

func TestContainerCreatedButNotStartedIsStarted(t *testing.T) {
	h := newHarness(t)
	p := newPod("half", corev1.RestartPolicyAlways, ctr("app"))
	h.put(p)
	// The agent dies between create and start.
	h.rt.FailNext(runtimetest.OpStart, errors.New("agent killed"))
	h.start()
	h.synced(0, "app created", func() bool { return h.state(p, "app") == "waiting:RunContainerError" })
	h.wantDump(id(p, "app", 0) + " created attempt=0\n")
	h.stopManager()

	n := h.clk.syncs()
	h.start()
	h.synced(n, "app running", func() bool { return h.running(id(p, "app", 0)) && h.state(p, "app") == "running" })
	h.wantDump(id(p, "app", 0) + " running attempt=0\n")
	if n := h.count("create "); n != 1 {
		t.Fatalf("%d creates, want 1: %q", n, h.rt.Calls())
	}
	if rc := h.container(p, "app").RestartCount; rc != 0 {
		t.Fatalf("restart count %d, want 0", rc)
	}
}

// TestOlderAttemptLeftRunningIsRemoved: an attempt older than the newest
// that runs, which containerd can finish creating and an earlier agent
// starting after its successor took the attempt for lost, is removed at
// the next sync, and the newest keeps running.
func TestOlderAttemptLeftRunningIsRemoved(t *testing.T) {
	h := newHarness(t)
	p := newPod("dup", corev1.RestartPolicyAlways, ctr("app"))
	h.put(p)
	h.start()
	h.synced(0, "app running", func() bool { return h.running(id(p, "app", 0)) })
	// The newest attempt, 1, runs beside attempt 0.
	spec, ok := h.rt.Spec(id(p, "app", 0))
	if !ok {
		t.Fatal("no spec of attempt 0")
	}
	spec.ID = id(p, "app", 1)
	spec.Labels = maps.Clone(spec.Labels)
	spec.Labels[agent.LabelAttempt] = "1"
	if err := h.rt.Create(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.Start(context.Background(), spec.ID); err != nil {
		t.Fatal(err)
	}
	h.advance(time.Minute) // the resync
	h.eventually("attempt 0 removed", func() bool {
		_, left := h.rt.Container(id(p, "app", 0))
		return !left
	})
	if !h.running(id(p, "app", 1)) {
		t.Fatalf("the newest attempt does not run:\n%s", h.rt.Dump())
	}
}

func TestPodAddedBackWhileBeingRemovedRunsAgain(t *testing.T) {
	h := newHarness(t)
	p := newPod("flap", corev1.RestartPolicyAlways, ctr("app"))
	p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"drain"}}}}
	inHook, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h.rt.SetExec(func(ctx context.Context, _ string, _ []string) (int, []byte, error) {
		once.Do(func() {
			close(inHook)
			<-release
		})
		return 0, nil, nil
	})
	h.put(p)
	h.start()
	h.synced(0, "app running", func() bool { return h.running(id(p, "app", 0)) })

	// A static manifest removed and put back gives the same UID.
	if _, err := h.st.Pods().Delete(p.Namespace, p.Name); err != nil {
		t.Fatal(err)
	}
	select {
	case <-inHook:
	case <-time.After(5 * time.Second):
		t.Fatal("preStop hook not run on removal")
	}
	h.put(p)
	h.eventually("pod desired again", func() bool { _, ok := h.m.Views()[string(p.UID)]; return ok })
	close(release)
	h.eventually("app created and running again", func() bool { return h.count("create ") == 2 && h.running(id(p, "app", 0)) })
}

// countRefreshes makes the manager's RefreshVolumes count its calls by
// pod name (set before start) and returns the count of a pod.
func (h *harness) countRefreshes() func(name string) int {
	var mu sync.Mutex
	refreshed := map[string]int{}
	h.refresh = func(_ context.Context, pod *corev1.Pod, _ string) error {
		mu.Lock()
		defer mu.Unlock()
		refreshed[pod.Name]++
		return nil
	}
	return func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return refreshed[name]
	}
}

// podWithConfigMap is a pod whose volume is config map cm.
func podWithConfigMap(name, cm string) *corev1.Pod {
	p := newPod(name, corev1.RestartPolicyAlways, ctr("app"))
	p.Spec.Volumes = []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: cm}}}}}
	return p
}

// An edited config map never reached a running container: volumes were
// written only when a container started. Now a store change refreshes the
// content volumes of a running pod, and of no other.
func TestConfigMapEditRefreshesVolumesOfRunningPod(t *testing.T) {
	h := newHarness(t)
	count := h.countRefreshes()
	withCM := podWithConfigMap("conf", "app")
	plain := newPod("plain", corev1.RestartPolicyAlways, ctr("app"))
	h.put(withCM, plain)
	h.start()
	h.synced(0, "both pods running", func() bool { return h.phase(withCM) == corev1.PodRunning && h.phase(plain) == corev1.PodRunning })

	before := count("conf")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "app"}, Data: map[string]string{"k": "v2"}}
	if err := h.st.ConfigMaps().Put(store.SourceStatic, cm); err != nil {
		t.Fatal(err)
	}
	h.eventually("the running pod's volumes refreshed after the config map changed", func() bool { return count("conf") > before })
	if n := count("plain"); n != 0 {
		t.Fatalf("pod without content volumes refreshed %d times", n)
	}
	if n := h.count("create "); n != 2 {
		t.Fatalf("%d creates, want 2 (no container restarted): %q", n, h.rt.Calls())
	}
}

// Every pod's change woke every worker, and a woken worker syncs its pod
// with containerd (a list, a task state per container, its content
// volumes written again): 30 pods created one after another cost 30 × 30
// syncs, which slowed the last pods' starts. Now another pod's change
// wakes no worker; a config map's still wakes them all.
func TestAnotherPodsChangeWakesNoWorker(t *testing.T) {
	h := newHarness(t)
	count := h.countRefreshes() // syncs of the running pod, by name
	first := podWithConfigMap("first", "app")
	h.put(first)
	h.start()
	h.synced(0, "first running", func() bool { return h.phase(first) == corev1.PodRunning })
	before := count("first")

	for i := range 3 {
		p := newPod(fmt.Sprintf("next-%d", i), corev1.RestartPolicyAlways, ctr("app"))
		h.put(p)
		h.eventually(p.Name+" running", func() bool { return h.phase(p) == corev1.PodRunning })
	}
	if n := count("first") - before; n != 0 {
		t.Fatalf("the first pod synced %d times while 3 others were created, want 0", n)
	}

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "app"}, Data: map[string]string{"k": "v"}}
	if err := h.st.ConfigMaps().Put(store.SourceStatic, cm); err != nil {
		t.Fatal(err)
	}
	h.eventually("the first pod synced after the config map changed", func() bool { return count("first") > before })
}

// A failing postStart hook kills the container, records FailedPostStartHook
// and the restart policy brings it back after the backoff; a succeeding
// hook leaves it running.
func TestPostStartHook(t *testing.T) {
	h := newHarness(t)
	var mu sync.Mutex
	fail := true
	h.rt.SetExec(func(_ context.Context, _ string, cmd []string) (int, []byte, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(cmd) > 0 && cmd[0] == "poststart" && fail {
			return 1, []byte("not yet"), nil
		}
		return 0, nil, nil
	})
	c := ctr("app")
	c.Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"poststart"}}}}
	p := newPod("hooked", corev1.RestartPolicyAlways, c)
	h.put(p)
	h.start()
	h.synced(0, "first attempt killed by its hook", func() bool {
		c, ok := h.rt.Container(id(p, "app", 0))
		return ok && c.State == agent.StateExited
	})
	h.eventually("FailedPostStartHook event", func() bool {
		for _, v := range h.m.Views() {
			for _, e := range v.Events {
				if e.Reason == "FailedPostStartHook" && strings.Contains(e.Message, "exit code 1") {
					return true
				}
			}
		}
		return false
	})
	mu.Lock()
	fail = false
	mu.Unlock()
	h.advance(10 * time.Second)
	h.eventually("second attempt running", func() bool { return h.running(id(p, "app", 1)) })
}

func TestLostExitEventsSeenAfterReconnect(t *testing.T) {
	h := newHarness(t)
	p := newPod("quiet", corev1.RestartPolicyAlways, ctr("app"))
	h.put(p)
	h.start()
	h.synced(0, "app running", func() bool { return h.running(id(p, "app", 0)) })
	// The exit happens while the agent's event stream is down: nothing
	// wakes the worker, and its resync is a minute away.
	if err := h.rt.ExitUnseen(id(p, "app", 0), 1); err != nil {
		t.Fatal(err)
	}
	n := h.clk.syncs()
	h.rt.Reconnect()
	h.synced(n, "exit seen after the reconnect", func() bool {
		return h.container(p, "app").LastTerminationState.Terminated != nil
	})
}

func TestPodPendingWhileAContainerHasNotRun(t *testing.T) {
	h := newHarness(t)
	side := ctr("side")
	side.Image, side.ImagePullPolicy = "local:2", corev1.PullNever
	p := newPod("half", corev1.RestartPolicyAlways, ctr("app"), side)
	h.put(p)
	h.start()
	// As kubelet's getPhase: one container waiting to run for the first
	// time keeps the pod Pending while the other runs.
	h.synced(0, "app running, side waiting", func() bool {
		return h.running(id(p, "app", 0)) && h.state(p, "side") == "waiting:ErrImageNeverPull"
	})
	if got := h.phase(p); got != corev1.PodPending {
		t.Fatalf("phase %s with a container never run, want Pending", got)
	}
	h.rt.AddImage("local:2")
	h.advance(10 * time.Second)
	h.eventually("both running", func() bool { return h.running(id(p, "side", 0)) && h.phase(p) == corev1.PodRunning })
}

func sidecar(name string) corev1.Container {
	c := ctr(name)
	always := corev1.ContainerRestartPolicyAlways
	c.RestartPolicy = &always
	return c
}

func TestSidecarsRunBesideThePodAndStopWhenItEnds(t *testing.T) {
	h := newHarness(t)
	p := newPod("sidecars", corev1.RestartPolicyNever, ctr("app"))
	p.Spec.InitContainers = []corev1.Container{sidecar("proxy"), ctr("init1")}
	h.put(p)
	h.start()
	h.synced(0, "proxy, then init1 running", func() bool { return h.running(id(p, "proxy", 0)) && h.running(id(p, "init1", 0)) })
	if st := h.container(p, "app"); h.phase(p) != corev1.PodPending || h.state(p, "app") != "waiting:PodInitializing" || st.Started == nil || *st.Started {
		t.Fatalf("status while initializing (started %v, as kubelet: false):\n%s", st.Started, h.journal())
	}
	h.exit(id(p, "init1", 0), 0, "app running", func() bool { return h.running(id(p, "app", 0)) && h.phase(p) == corev1.PodRunning })
	if h.condition(p, corev1.PodInitialized) != corev1.ConditionTrue || h.condition(p, corev1.PodReady) != corev1.ConditionTrue ||
		!h.container(p, "proxy").Ready || h.state(p, "proxy") != "running" {
		t.Fatalf("status after init:\n%s", h.journal())
	}

	// A sidecar restarts whatever the pod's policy, and holds nothing back.
	h.exit(id(p, "proxy", 0), 1, "proxy backing off", func() bool { return h.state(p, "proxy") == "waiting:CrashLoopBackOff" })
	if h.phase(p) != corev1.PodRunning || h.condition(p, corev1.PodInitialized) != corev1.ConditionTrue ||
		h.condition(p, corev1.PodReady) != corev1.ConditionFalse {
		t.Fatalf("status with the sidecar down:\n%s", h.journal())
	}
	h.advance(10 * time.Second)
	h.eventually("proxy restarted", func() bool { return h.running(id(p, "proxy", 1)) })
	if n := h.count("create " + id(p, "init1", 0)); n != 1 {
		t.Fatalf("init1 created %d times: %q", n, h.rt.Calls())
	}

	// The app's end ends the pod: its sidecar is stopped, its exit does not count.
	h.exit(id(p, "app", 0), 0, "pod Succeeded", func() bool { return h.phase(p) == corev1.PodSucceeded })
	h.eventually("proxy stopped", func() bool { return !h.running(id(p, "proxy", 1)) })
	h.advance(time.Minute)
	if h.running(id(p, "proxy", 2)) || h.phase(p) != corev1.PodSucceeded {
		t.Fatalf("after the pod ended:\n%s\njournal:\n%s", h.rt.Dump(), h.journal())
	}
}

func TestSidecarsStopAfterTheContainersInReverseOrder(t *testing.T) {
	h := newHarness(t)
	p := newPod("sidecar-order", corev1.RestartPolicyAlways, ctr("app"))
	p.Spec.InitContainers = []corev1.Container{sidecar("first"), sidecar("second")}
	h.put(p)
	h.start()
	h.synced(0, "all running", func() bool {
		return h.running(id(p, "first", 0)) && h.running(id(p, "second", 0)) && h.running(id(p, "app", 0))
	})
	if _, err := h.st.Pods().Delete(p.Namespace, p.Name); err != nil {
		t.Fatal(err)
	}
	h.eventually("containers removed", func() bool { return h.rt.Dump() == "" })
	var stops []string
	for _, c := range h.rt.Calls() {
		if strings.HasPrefix(c, "stop ") {
			stops = append(stops, strings.Fields(c)[1])
		}
	}
	want := []string{id(p, "app", 0), id(p, "second", 0), id(p, "first", 0)}
	if !slices.Equal(stops, want) {
		t.Fatalf("stops %q, want %q", stops, want)
	}
}

func TestSidecarWithStartupProbeHoldsTheNextInitContainer(t *testing.T) {
	h := newHarness(t)
	p := newPod("sidecar-startup", corev1.RestartPolicyAlways, ctr("app"))
	sc := sidecar("proxy")
	sc.StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"check"}}}, PeriodSeconds: 5, FailureThreshold: 100}
	p.Spec.InitContainers = []corev1.Container{sc}
	var up atomic.Bool
	h.rt.SetExec(func(_ context.Context, _ string, cmd []string) (int, []byte, error) {
		if up.Load() {
			return 0, nil, nil
		}
		return 1, nil, nil
	})
	h.put(p)
	h.start()
	h.synced(0, "proxy running", func() bool { return h.running(id(p, "proxy", 0)) })
	h.advance(5 * time.Second)
	h.advance(5 * time.Second)
	if h.running(id(p, "app", 0)) || h.condition(p, corev1.PodInitialized) != corev1.ConditionFalse {
		t.Fatalf("app started before its sidecar did:\n%s", h.rt.Dump())
	}
	up.Store(true)
	h.advance(5 * time.Second)
	h.eventually("app running", func() bool { return h.running(id(p, "app", 0)) })
}

func TestReadinessGatesHoldThePodReady(t *testing.T) {
	h := newHarness(t)
	p := newPod("gated", corev1.RestartPolicyAlways, ctr("app"))
	p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: "example.com/lb"}}
	h.put(p)
	h.start()
	h.synced(0, "app running", func() bool { return h.running(id(p, "app", 0)) && h.phase(p) == corev1.PodRunning })
	reason := func(t corev1.PodConditionType) string {
		st, _, _ := h.status(p)
		for _, c := range st.Conditions {
			if c.Type == t {
				return string(c.Status) + ":" + c.Reason
			}
		}
		return ""
	}
	if reason(corev1.ContainersReady) != "True:" || reason(corev1.PodReady) != "False:ReadinessGatesNotReady" {
		t.Fatalf("with the gate's condition missing: ContainersReady %s, Ready %s", reason(corev1.ContainersReady), reason(corev1.PodReady))
	}
	q := p.DeepCopy()
	q.Status.Conditions = []corev1.PodCondition{{Type: "example.com/lb", Status: corev1.ConditionTrue}}
	h.put(q)
	h.eventually("pod ready", func() bool { return reason(corev1.PodReady) == "True:" })
}

func TestActiveDeadlineStopsAndFailsThePod(t *testing.T) {
	h := newHarness(t)
	p := newPod("deadline", corev1.RestartPolicyAlways, ctr("app"))
	h.put(p)
	h.start()
	h.synced(0, "app running", func() bool { return h.running(id(p, "app", 0)) })
	// Set on the running pod, as `kubectl patch` would.
	q := p.DeepCopy()
	d := int64(30)
	q.Spec.ActiveDeadlineSeconds = &d
	n := h.clk.syncs()
	h.put(q)
	h.synced(n, "the deadline seen", func() bool { return true }) // its timer armed before time moves
	h.advance(20 * time.Second)
	if !h.running(id(p, "app", 0)) {
		t.Fatal("stopped before its deadline")
	}
	h.advance(10 * time.Second)
	h.eventually("pod Failed", func() bool { return h.phase(p) == corev1.PodFailed })
	st, _, _ := h.status(p)
	if st.Reason != "DeadlineExceeded" || h.running(id(p, "app", 0)) {
		t.Fatalf("after the deadline: reason %q, containers:\n%s", st.Reason, h.rt.Dump())
	}
	h.advance(time.Minute)
	if h.running(id(p, "app", 1)) {
		t.Fatal("restarted after its deadline")
	}
}

func TestEphemeralContainerStartsOnceInARunningPod(t *testing.T) {
	h := newHarness(t)
	p := newPod("debugged", corev1.RestartPolicyAlways, ctr("app"))
	h.put(p)
	h.start()
	h.synced(0, "app running", func() bool { return h.running(id(p, "app", 0)) })
	q := p.DeepCopy()
	q.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon(ctr("debugger"))}}
	h.put(q)
	h.eventually("debugger running and reported", func() bool {
		st, _, _ := h.status(p)
		return h.running(id(p, "debugger", 0)) && len(st.EphemeralContainerStatuses) == 1 && st.EphemeralContainerStatuses[0].State.Running != nil
	})
	h.exit(id(p, "debugger", 0), 0, "debugger terminated", func() bool {
		st, _, _ := h.status(p)
		return st.EphemeralContainerStatuses[0].State.Terminated != nil
	})
	h.advance(time.Minute)
	if n := h.count("create " + id(p, "debugger", 1)); n != 0 || h.phase(p) != corev1.PodRunning {
		t.Fatalf("ephemeral container started again, or the pod changed phase (%s): %q", h.phase(p), h.rt.Calls())
	}
}
