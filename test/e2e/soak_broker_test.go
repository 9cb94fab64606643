package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/outpost-edge/outpost/agent"
)

func init() { addSoakTrial(60, "BrokerFlapping", soakBrokerFlapping) }

const (
	// flapConvergeWithin bounds how long the API server may take to hold
	// the agent's statuses once the link is stable: the agent's
	// reconnect (three keepalives at most after a long cut) and the
	// bridge's writes, on a busy machine.
	flapConvergeWithin = 90 * time.Second
	// flapMaxPause is the longest the broker stays down in a
	// restart.
	flapMaxPause = 5 * time.Second
)

// soakBrokerFlapping is trial 6 of docs/soak.md: an MQTT node's broker
// restarted and its link cut (every packet dropped, no FIN, no RST), in
// random order (a quarter of the cuts with a broker restart behind
// them), while its pods' statuses change on their own (containers
// that exit and are restarted, readiness probes that flip with the
// clock) and by the test (a readiness flipped during each fault). After
// each round (sampled at full scale) the API server must hold each pod's
// status as the agent has it, the Node must be Ready and its Lease
// renewed after the link came back; a watch on the pods during the
// whole trial checks that nothing older was delivered after something
// newer (restart counts, condition transition times and container start
// and finish times never go back); the pods that do not exit keep their
// containers.
func soakBrokerFlapping(t *testing.T, sc soakScale, r *soakResult) {
	restarts, cuts := sc.n(5, 50), sc.n(5, 50)
	every := sc.n(1, 10) // rounds between the checks of convergence
	// A long cut lasts from past the broker's wait for the node (1.5
	// keepalives, then its Last Will) to past the agent's (3 keepalives,
	// then it gives the connection up and dials again).
	longCut := [2]time.Duration{2 * nodeKeepalive, sc.d(18*time.Second, 20*time.Second)}
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)

	s := newMQTTSetup(t, "e2e-soak-broker")
	n := s.node
	n.outside()
	order := watchFlapOrder(t, s.adm, n.name)
	n.start()
	s.nodeReady(90 * time.Second)

	ctl := t.TempDir()
	steady := []string{"ctl", "flip-3", "flip-5"}
	crashing := []string{"crash-2", "crash-4"}
	s.adm.create("pods", ctlPod("ctl", n.name, ctl))
	for _, name := range steady[1:] {
		s.adm.create("pods", clockFlipPod(name, n.name))
	}
	for _, name := range crashing {
		p := apiPod(name, n.name, fmt.Sprintf("sleep %s; exit 1", strings.TrimPrefix(name, "crash-")))
		s.adm.create("pods", p)
	}
	all := append(slices.Clone(steady), crashing...)
	for _, name := range all {
		within(90*time.Second).For(t, name+" started in the API", func() (bool, string) {
			p, err := s.adm.pod(name)
			if err != nil {
				return false, err.Error()
			}
			return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && len(p.Status.ContainerStatuses) == 1, asJSON(p.Status)
		})
	}
	before := containerIDs(t, n, steady...)

	// The rounds, in random order: true restarts the broker, false cuts
	// the link.
	rounds := make([]bool, 0, restarts+cuts)
	for i := range restarts + cuts {
		rounds = append(rounds, i < restarts)
	}
	rng.Shuffle(len(rounds), func(i, j int) { rounds[i], rounds[j] = rounds[j], rounds[i] })
	port := brokerPort(t, s.broker)
	var took []time.Duration
	did, cut, long, both, exits := 0, 0, 0, 0, 0
	report := func() {
		seen, bad := order.counts()
		r.set("%d of %d broker restarts, %d of %d link cuts (%d past the keepalive, %d with a restart behind); %d pods, %d container restarts; %d statuses seen by the watch, %d out of order; converged %d times, median %v, max %v",
			did, restarts, cut, cuts, long, both, len(all), exits, seen, bad, len(took), flapMedian(took), slices.Max(append([]time.Duration{0}, took...)).Round(100*time.Millisecond))
	}
	report()
	notReady := false
	for i, restart := range rounds {
		// The ctl pod changes during every fault: the change must reach
		// the API server after it.
		notReady = !notReady
		if restart {
			pause := time.Duration(rng.Int64N(int64(flapMaxPause)))
			s.broker.Stop(t)
			setCtl(t, ctl, "ctl", notReady)
			time.Sleep(pause)
			s.broker.Start(t)
			did++
		} else {
			// Two of three cuts are shorter than the keepalive (the
			// connection survives them), the others long.
			d := time.Duration(500+rng.IntN(3500)) * time.Millisecond
			if rng.IntN(3) == 0 {
				d = longCut[0] + time.Duration(rng.Int64N(int64(longCut[1]-longCut[0])))
				long++
			}
			restore := n.cutTCP(t, port)
			setCtl(t, ctl, "ctl", notReady)
			if rng.IntN(4) == 0 {
				// The broker restarts behind the cut: the agent's
				// connection is to a broker that is no more.
				time.Sleep(d / 2)
				s.broker.Stop(t)
				s.broker.Start(t)
				both++
				d -= d / 2
			}
			time.Sleep(d)
			restore()
			cut++
		}
		if (i+1)%every == 0 || i == len(rounds)-1 {
			took = append(took, flapConverge(t, s, all, time.Now()))
		} else {
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Millisecond)
		}
		if seen, bad := order.counts(); bad > 0 {
			report()
			t.Fatalf("after round %d, %d of %d statuses out of order: %s", i+1, bad, seen, strings.Join(order.wrongs(), "; "))
		}
		report()
	}

	// Anything stale would come now.
	time.Sleep(5 * time.Second)
	flapConverge(t, s, all, time.Now())
	if seen, bad := order.counts(); bad > 0 {
		t.Errorf("%d of %d statuses out of order: %s", bad, seen, strings.Join(order.wrongs(), "; "))
	}
	if after := containerIDs(t, n, steady...); asJSON(after) != asJSON(before) {
		t.Errorf("containers changed across the broker's restarts and the link's cuts: %v -> %v", before, after)
	}
	for _, name := range crashing {
		p, err := s.adm.pod(name)
		if err != nil {
			t.Fatal(err)
		}
		if apiRestarts(p) < 1 {
			t.Errorf("%s: restart count %d in the API: the trial changed no restart count", name, apiRestarts(p))
		}
		exits += int(apiRestarts(p))
	}
	// The watch saw each pod change, or its check means nothing.
	for _, name := range all {
		if c := order.seenOf(name); c < 3 {
			t.Errorf("the watch saw %d statuses of %s, want 3 or more", c, name)
		}
	}
	report()
}

// clockFlipPod is an apiPod whose readiness probe flips with the clock: ready
// for N seconds, then not for N, where its name is flip-N.
func clockFlipPod(name, node string) *corev1.Pod {
	p := apiPod(name, node, "while true; do sleep 1; done")
	period := strings.TrimPrefix(name, "flip-")
	p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 1,
		ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", fmt.Sprintf("test $(( $(date +%%s) / %s %% 2 )) -eq 0", period)}}}}
	return p
}

// flapConverge waits until the API server holds, for each of the pods
// named, the status the agent computes (read before and after the API
// server's, the same both times), the Node is Ready in the API and its
// Lease renewed after since. It returns how long the statuses took from
// since.
func flapConverge(t *testing.T, s *mqttSetup, names []string, since time.Time) time.Duration {
	t.Helper()
	left := map[string]bool{}
	for _, name := range names {
		left[name] = true
	}
	var took time.Duration
	leased := false
	within(flapConvergeWithin).For(t, "the pods' statuses in the API as on the node, the node Ready and its Lease renewed", func() (bool, string) {
		a1, err := s.node.status()
		if err != nil {
			return false, "agent status: " + err.Error()
		}
		ctx, cancel := s.adm.ctx()
		var list corev1.PodList
		err = s.adm.core.Get().Namespace("default").Resource("pods").
			VersionedParams(&metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", s.node.name).String()}, metav1.ParameterCodec).
			Do(ctx).Into(&list)
		cancel()
		if err != nil {
			return false, "list pods: " + err.Error()
		}
		a2, err := s.node.status()
		if err != nil {
			return false, "agent status: " + err.Error()
		}
		api := map[string]*corev1.PodStatus{}
		for i := range list.Items {
			api[list.Items[i].Name] = &list.Items[i].Status
		}
		var differ []string
		for _, name := range names {
			if !left[name] {
				continue
			}
			k1, k2 := flapAgentKey(a1, name), flapAgentKey(a2, name)
			var ka string
			if st := api[name]; st != nil {
				ka = flapStatusKey(st)
			}
			if k1 != "" && k1 == k2 && k1 == ka {
				delete(left, name)
				took = time.Since(since)
				continue
			}
			differ = append(differ, fmt.Sprintf("%s: node %q, API %q", name, k2, ka))
		}
		if !leased {
			leased = s.leaseRenewTime().After(since)
		}
		ready, msg := s.nodeReadyStatus()
		return len(left) == 0 && leased && ready == corev1.ConditionTrue,
			fmt.Sprintf("%s; lease renewed %v; node %s", strings.Join(differ, "; "), leased, msg)
	})
	return took
}

// flapAgentKey is flapStatusKey of the pod's status as the running agent
// computes it, "" when it has none.
func flapAgentKey(st agent.Status, name string) string {
	p := findPod(st, name)
	if st.From != "agent" || p == nil || p.Status == nil || !p.Synced {
		return ""
	}
	return flapStatusKey(p.Status)
}

// flapStatusKey is what of a pod's status the node must have delivered:
// phase, readiness, and each container's restart count, readiness and
// state (with its start time when running).
func flapStatusKey(st *corev1.PodStatus) string {
	var b strings.Builder
	ready := corev1.ConditionUnknown
	for _, c := range st.Conditions {
		if c.Type == corev1.PodReady {
			ready = c.Status
		}
	}
	fmt.Fprintf(&b, "%s ready=%s", st.Phase, ready)
	for _, c := range st.ContainerStatuses {
		state := "unknown"
		switch {
		case c.State.Running != nil:
			state = fmt.Sprintf("running@%d", c.State.Running.StartedAt.Unix())
		case c.State.Waiting != nil:
			state = "waiting:" + c.State.Waiting.Reason
		case c.State.Terminated != nil:
			state = fmt.Sprintf("terminated:%d", c.State.Terminated.ExitCode)
		}
		fmt.Fprintf(&b, " %s=%s,restarts=%d,ready=%v", c.Name, state, c.RestartCount, c.Ready)
	}
	return b.String()
}

// flapMedian is the middle of ds, 0 when empty.
func flapMedian(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(100 * time.Millisecond)
}

// flapOrder watches a node's pods in the API server and checks that each
// pod's statuses arrive in the order the agent made them: its restart
// counts, its conditions' transition times and its containers' start and
// finish times never go back.
type flapOrder struct {
	mu    sync.Mutex
	seen  int // statuses seen, each different from the pod's one before
	pods  map[string]*flapMarks
	wrong []string
}

// flapMarks are the highest values seen of one pod's status.
type flapMarks struct {
	uid    types.UID
	status string
	seen   int
	high   map[string]int64
}

// watchFlapOrder starts a flapOrder on node's pods, stopped in t's cleanup.
func watchFlapOrder(t *testing.T, adm *admin, node string) *flapOrder {
	o := &flapOrder{pods: map[string]*flapMarks{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		o.run(ctx, adm, node)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return o
}

// run lists and watches the pods until ctx ends, again after the watch
// ends, from where it was (or from a new list when that is too old).
func (o *flapOrder) run(ctx context.Context, adm *admin, node string) {
	selector := fields.OneTermEqualSelector("spec.nodeName", node).String()
	rv := ""
	for ctx.Err() == nil {
		if rv == "" {
			var list corev1.PodList
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := adm.core.Get().Namespace("default").Resource("pods").
				VersionedParams(&metav1.ListOptions{FieldSelector: selector}, metav1.ParameterCodec).Do(lctx).Into(&list)
			cancel()
			if err != nil {
				flapSleep(ctx, time.Second)
				continue
			}
			for i := range list.Items {
				o.observe(&list.Items[i])
			}
			rv = list.ResourceVersion
		}
		w, err := adm.core.Get().Namespace("default").Resource("pods").
			VersionedParams(&metav1.ListOptions{FieldSelector: selector, ResourceVersion: rv, Watch: true}, metav1.ParameterCodec).Watch(ctx)
		if err != nil {
			flapSleep(ctx, time.Second)
			continue
		}
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Added, watch.Modified:
				if p, ok := ev.Object.(*corev1.Pod); ok {
					o.observe(p)
					rv = p.ResourceVersion
				}
			case watch.Error:
				rv = "" // too old: list again
			}
		}
		w.Stop()
	}
}

// flapSleep waits for d or until ctx ends.
func flapSleep(ctx context.Context, d time.Duration) {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
	case <-tm.C:
	}
}

// observe takes one status of p.
func (o *flapOrder) observe(p *corev1.Pod) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.pods[p.Name]
	if m == nil || m.uid != p.UID {
		m = &flapMarks{uid: p.UID, high: map[string]int64{}}
		o.pods[p.Name] = m
	}
	status := asJSON(p.Status)
	if status == m.status {
		return
	}
	m.status = status
	m.seen++
	o.seen++
	marks := flapStatusMarks(&p.Status)
	keys := make([]string, 0, len(marks))
	for k := range marks {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := marks[k]
		if v < m.high[k] {
			o.wrong = append(o.wrong, fmt.Sprintf("%s %s went back from %d to %d (resourceVersion %s)", p.Name, k, m.high[k], v, p.ResourceVersion))
			continue
		}
		m.high[k] = v
	}
}

// flapStatusMarks are the values of a pod's status that only grow as the
// agent makes new ones: restart counts, the conditions' transition
// times, the containers' start and finish times (Unix seconds).
func flapStatusMarks(st *corev1.PodStatus) map[string]int64 {
	out := map[string]int64{}
	for _, c := range st.Conditions {
		if !c.LastTransitionTime.IsZero() {
			out["condition "+string(c.Type)+" lastTransitionTime"] = c.LastTransitionTime.Unix()
		}
	}
	for _, c := range st.ContainerStatuses {
		out["container "+c.Name+" restartCount"] = int64(c.RestartCount)
		if r := c.State.Running; r != nil && !r.StartedAt.IsZero() {
			out["container "+c.Name+" startedAt"] = r.StartedAt.Unix()
		}
		if f := c.LastTerminationState.Terminated; f != nil && !f.FinishedAt.IsZero() {
			out["container "+c.Name+" lastState finishedAt"] = f.FinishedAt.Unix()
		}
	}
	return out
}

// counts returns the statuses seen and how many values went back.
func (o *flapOrder) counts() (seen, wrong int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.seen, len(o.wrong)
}

// seenOf returns how many statuses of the pod name were seen.
func (o *flapOrder) seenOf(name string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	if m := o.pods[name]; m != nil {
		return m.seen
	}
	return 0
}

// wrongs describes the values that went back, the first ten.
func (o *flapOrder) wrongs() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.wrong[:min(len(o.wrong), 10)])
}

// TestFlapOrderFindsStaleStatuses shows BrokerFlapping's watch check
// failing: a pod's older status seen after a newer one (a lower restart
// count, an earlier transition or start time) is out of order, the same
// status seen twice and a newer one are not, and a pod made anew under
// the same name starts over.
func TestFlapOrderFindsStaleStatuses(t *testing.T) {
	at := func(sec int64) metav1.Time { return metav1.NewTime(time.Unix(sec, 0)) }
	pod := func(uid string, restarts int32, ready corev1.ConditionStatus, transition, started int64) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: types.UID(uid)}, Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready, LastTransitionTime: at(transition)}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "main", RestartCount: restarts,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: at(started)}}}},
		}}
	}
	for _, tc := range []struct {
		name  string
		pods  []*corev1.Pod
		seen  int
		wrong int
	}{
		{"in order", []*corev1.Pod{pod("a", 0, "True", 10, 5), pod("a", 0, "False", 12, 5), pod("a", 1, "True", 20, 19)}, 3, 0},
		{"the same twice", []*corev1.Pod{pod("a", 1, "True", 20, 19), pod("a", 1, "True", 20, 19)}, 1, 0},
		{"a restart count back", []*corev1.Pod{pod("a", 2, "True", 20, 19), pod("a", 1, "True", 20, 19)}, 2, 1},
		{"a transition back", []*corev1.Pod{pod("a", 0, "True", 10, 5), pod("a", 0, "False", 12, 5), pod("a", 0, "True", 10, 5)}, 3, 1},
		{"an older attempt", []*corev1.Pod{pod("a", 1, "True", 20, 19), pod("a", 0, "False", 12, 5)}, 2, 3},
		{"a new pod", []*corev1.Pod{pod("a", 3, "True", 20, 19), pod("b", 0, "False", 12, 5)}, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &flapOrder{pods: map[string]*flapMarks{}}
			for _, p := range tc.pods {
				o.observe(p)
			}
			if seen, wrong := o.counts(); seen != tc.seen || wrong != tc.wrong {
				t.Errorf("seen %d, out of order %d, want %d and %d: %v", seen, wrong, tc.seen, tc.wrong, o.wrongs())
			}
		})
	}
}
