package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

func init() { addSoakTrial(40, "APIServerAway", soakAPIServerAway) }

// soakAPIServerAway is trial 4 of docs/soak.md: the API server goes away
// while the node churns (a container exiting every 20 s, a readiness
// probe flipping, a static manifest added and one removed), then comes
// back: no steady container restarted, the API server's statuses and
// mirror pods converge to the agent's, and the agent's writes after the
// return are at most one per changed object. Then the API server is
// rebuilt from a wiped etcd: the node registers again, the mirror pods
// of its static pods are made again with their status, the API pods the
// new API server does not have are stopped and removed, and a pod
// created through it runs.
func soakAPIServerAway(t *testing.T, sc soakScale, r *soakResult) {
	away := sc.d(time.Minute, 10*time.Minute)
	// The crash loop's backoff reaches 5 min at full scale: the churn
	// stops early enough for the container to be running again before
	// the API server returns.
	churn := away - sc.d(15*time.Second, 5*time.Minute)
	api := env.StartAPIServer(t)
	adm := newAdmin(t, api)
	n := newNode(t, "soak-away")
	n.connect(api)
	ctl := filepath.Join(n.dir, "ctl")
	if err := os.Mkdir(ctl, 0o755); err != nil {
		t.Fatal(err)
	}
	touch := func(name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(ctl, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	touch("ready")
	n.write("sensor.yaml", sensorPod)
	n.write("gone.yaml", podManifest("gone", "Always", "while true; do sleep 1; done"))
	n.start()

	withCtl := func(p *corev1.Pod) *corev1.Pod {
		dir := corev1.HostPathDirectory
		p.Spec.Volumes = []corev1.Volume{{Name: "ctl", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: ctl, Type: &dir}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "ctl", MountPath: "/ctl"}}
		return p
	}
	adm.create("pods", apiPod("steady", n.name, "while true; do sleep 1; done"))
	// blinker exits every 20 s while /ctl/churn exists.
	adm.create("pods", withCtl(apiPod("blinker", n.name, "i=0; while true; do sleep 1; i=$((i+1)); if [ $i -ge 20 ] && [ -e /ctl/churn ]; then exit 1; fi; done")))
	// flipper is ready while /ctl/ready exists.
	flipper := withCtl(apiPod("flipper", n.name, "while true; do sleep 1; done"))
	flipper.Spec.Containers[0].ReadinessProbe = &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 1,
		ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-e", "/ctl/ready"}}}}
	adm.create("pods", flipper)

	sensor, gone, late := "sensor-"+n.name, "gone-"+n.name, "late-"+n.name
	steadyPods := []string{"steady", "flipper", sensor}
	for _, name := range append([]string{"blinker", gone}, steadyPods...) {
		within(3*time.Minute).For(t, name+" Running and Ready in the API", func() (bool, string) {
			p, err := adm.pod(name)
			if err != nil {
				return false, err.Error()
			}
			return p.Status.Phase == corev1.PodRunning && podCondition(p, corev1.PodReady) == corev1.ConditionTrue, asJSON(p.Status)
		})
	}
	before := containerIDs(t, n, steadyPods...)
	blinkBase := agentRestarts(n.waitPod("blinker", 30*time.Second, "running", running))
	r.set("part 1: 5 pods running; API server away for %v", away)

	// Part one: the API server goes away during churn.
	t0 := time.Now()
	api.Stop()
	within(90*time.Second).For(t, "the link offline", func() (bool, string) {
		s, err := n.status()
		if err != nil || s.Agent == nil || s.Agent.Link == nil {
			return false, fmt.Sprint(err)
		}
		return !s.Agent.Link.Connected, asJSON(s.Agent.Link)
	})
	touch("churn")
	os.Remove(filepath.Join(n.manifests, "gone.yaml"))
	n.write("late.yaml", podManifest("late", "Always", "while true; do sleep 1; done"))
	flips := 0
	for time.Since(t0) < churn {
		if flips%2 == 0 {
			os.Remove(filepath.Join(ctl, "ready"))
		} else {
			touch("ready")
		}
		flips++
		want := flips%2 == 1 // not ready after an odd flip
		n.waitPod("flipper", 60*time.Second, fmt.Sprintf("ready=%v after flip %d", !want, flips), func(p *agent.PodInfo) bool { return ready(p) != want })
		time.Sleep(5 * time.Second)
	}
	if flips%2 == 0 {
		// End not ready, a state the API server has not seen before.
		os.Remove(filepath.Join(ctl, "ready"))
		flips++
	}
	n.waitPod("flipper", 60*time.Second, "not ready at the end of the churn", func(p *agent.PodInfo) bool { return !ready(p) })
	os.Remove(filepath.Join(ctl, "churn"))
	// A container that saw the file just before it went may be exiting:
	// the agent notices within a few seconds, and blinker runs again
	// within its backoff (at most 5 min), for good.
	time.Sleep(3 * time.Second)
	blink := n.waitPod("blinker", 6*time.Minute, "running after the churn", running)
	n.waitPod(late, 60*time.Second, "running", running)
	if d := away - time.Since(t0); d > 0 {
		time.Sleep(d)
	}
	blinks := agentRestarts(blink) - blinkBase
	if blinks < 1 {
		t.Errorf("blinker restarted %d times while the API server was away; want at least 1", blinks)
	}
	s := mustStatus(t, n)
	if findPod(s, gone) != nil {
		t.Errorf("%s still on the node after its manifest was removed", gone)
	}
	if s.JournalBacklog == 0 {
		t.Errorf("journal backlog 0 while the API server was away; want the statuses journaled")
	}
	r.set("part 1: away %v; blinker restarted %d times, %d readiness flips, 1 static pod added, 1 removed", time.Since(t0).Round(time.Second), blinks, flips)

	seen := len(api.AuditEvents(t))
	api.Start(t)
	back := time.Now()
	converge := func(names []string, absent ...string) {
		t.Helper()
		within(3*time.Minute).For(t, "the API server's statuses converged to the agent's", func() (bool, string) {
			s, err := n.status()
			if err != nil {
				return false, err.Error()
			}
			if s.JournalBacklog != 0 {
				return false, fmt.Sprintf("journal backlog %d", s.JournalBacklog)
			}
			for _, name := range names {
				p, err := adm.pod(name)
				if err != nil {
					return false, name + ": " + err.Error()
				}
				if d := statusDiff(findPod(s, name), p); d != "" {
					return false, name + ": " + d
				}
			}
			for _, name := range absent {
				if _, err := adm.pod(name); !apierrors.IsNotFound(err) {
					return false, fmt.Sprintf("%s in the API server: %v", name, err)
				}
			}
			return true, ""
		})
	}
	converge([]string{"steady", "blinker", "flipper", sensor, late}, gone)
	took := time.Since(back)
	if p, _ := adm.pod("flipper"); podCondition(p, corev1.PodReady) != corev1.ConditionFalse {
		t.Errorf("flipper in the API server: Ready %q, want False", podCondition(p, corev1.PodReady))
	}
	if after := containerIDs(t, n, steadyPods...); asJSON(after) != asJSON(before) {
		t.Errorf("steady containers changed across the outage:\n before %v\n after  %v", before, after)
	}
	// Writes that would follow the convergence (a second replay) are
	// given a moment to show.
	time.Sleep(5 * time.Second)
	w := countWrites(api.AuditEvents(t)[seen:], n.name)
	for obj, c := range w.objects {
		if c > 1 {
			t.Errorf("%s: %d writes after the API server returned, want at most 1 (all: %v)", obj, c, w.objects)
		}
	}
	for _, obj := range []string{"pods/status default/blinker", "pods/status default/flipper", "pods default/" + late, "pods default/" + gone} {
		if w.objects[obj] != 1 {
			t.Errorf("%s: %d writes after the API server returned, want 1 (all: %v)", obj, w.objects[obj], w.objects)
		}
	}
	if w.node > 2 {
		t.Errorf("%d Node writes after the API server returned, want at most 2 (the status at the connect, and one change)", w.node)
	}
	t.Logf("writes after the return: %v; node %d, lease %d, events %d", w.objects, w.node, w.lease, w.events)
	part1 := fmt.Sprintf("away %v: blinker restarted %d times, %d readiness flips, converged in %v, 0 steady restarts, %d pod writes for %d objects (+%d node, %d lease, %d events)",
		back.Sub(t0).Round(time.Second), blinks, flips, took.Round(time.Second), w.total, len(w.objects), w.node, w.lease, w.events)
	r.set("part 1: %s", part1)

	// Part two: the API server rebuilt from a wiped etcd.
	staticBefore := containerIDs(t, n, sensor, late)
	t1 := time.Now()
	// Counted from before the wipe: the agent may be registered again
	// before /readyz answers. Nothing of part one is left to write.
	seen = len(api.AuditEvents(t))
	api.Wipe(t)
	adm = newAdmin(t, api)
	node := adm.nodeReady(n.name, 3*time.Minute) // registered again
	if node.Labels[corev1.LabelHostname] != n.name || node.Labels[corev1.LabelOSStable] != "linux" {
		t.Errorf("node labels after the wipe = %v", node.Labels)
	}
	if len(node.Status.Addresses) == 0 || node.Status.Capacity.Cpu().IsZero() || node.Status.Capacity.Pods().IsZero() {
		t.Errorf("node after the wipe: addresses %v, capacity %v", node.Status.Addresses, node.Status.Capacity)
	}
	within(3*time.Minute).For(t, "the API pods the new API server lacks gone from the node", func() (bool, string) {
		s := mustStatus(t, n)
		var left []string
		for _, name := range []string{"steady", "blinker", "flipper"} {
			if findPod(s, name) != nil {
				left = append(left, name)
			}
		}
		return len(left) == 0, fmt.Sprint("still on the node: ", left)
	})
	within(60*time.Second).For(t, "their containers removed", func() (bool, string) {
		ls := run(t, "ctr", "-a", n.ctrd.Address, "-n", n.ns, "containers", "ls", "-q")
		for _, name := range []string{"steady", "blinker", "flipper"} {
			if strings.Contains(ls, name) {
				return false, ls
			}
		}
		return true, ""
	})
	converge([]string{sensor, late}, gone)
	// Each mirror pod is made once and given its status once.
	time.Sleep(5 * time.Second)
	w = countWrites(api.AuditEvents(t)[seen:], n.name)
	for obj, c := range w.objects {
		if c > 1 {
			t.Errorf("%s: %d writes after the wipe, want at most 1 (all: %v)", obj, c, w.objects)
		}
	}
	t.Logf("writes after the wipe: %v; node %d, lease %d, events %d", w.objects, w.node, w.lease, w.events)
	for _, name := range []string{sensor, late} {
		p, _ := adm.pod(name)
		if len(p.OwnerReferences) != 1 || p.OwnerReferences[0].UID != node.UID {
			t.Errorf("mirror pod %s: owner references %s, want the new Node %s", name, asJSON(p.OwnerReferences), node.UID)
		}
	}
	if after := containerIDs(t, n, sensor, late); asJSON(after) != asJSON(staticBefore) {
		t.Errorf("static pods' containers changed across the wipe:\n before %v\n after  %v", staticBefore, after)
	}
	adm.create("pods", apiPod("fresh", n.name, "while true; do sleep 1; done"))
	within(3*time.Minute).For(t, "fresh Running in the new API server", func() (bool, string) {
		p, err := adm.pod("fresh")
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning, asJSON(p.Status)
	})
	r.set("part 1: %s; part 2 (wiped etcd): node registered again, 2 mirror pods made again with their status (%d pod writes for %d objects), 3 API pods removed, 0 static restarts, a new pod running, in %v",
		part1, w.total, len(w.objects), time.Since(t1).Round(time.Second))
}

// statusDiff says how the API server's status of a pod differs from the
// agent's (phase, readiness, and each container's ID, state, readiness
// and restart count), or returns "" when it does not.
func statusDiff(a *agent.PodInfo, p *corev1.Pod) string {
	if a == nil || a.Status == nil {
		return "not on the node"
	}
	type cs struct {
		Name, ID, State string
		Ready           bool
		Restarts        int32
	}
	conv := func(st *corev1.PodStatus) (string, corev1.ConditionStatus, []cs) {
		var out []cs
		for _, c := range st.ContainerStatuses {
			state := "waiting"
			switch {
			case c.State.Running != nil:
				state = "running"
			case c.State.Terminated != nil:
				state = "terminated"
			}
			out = append(out, cs{c.Name, c.ContainerID, state, c.Ready, c.RestartCount})
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		var rd corev1.ConditionStatus
		for _, c := range st.Conditions {
			if c.Type == corev1.PodReady {
				rd = c.Status
			}
		}
		return string(st.Phase), rd, out
	}
	ap, ar, ac := conv(a.Status)
	pp, pr, pc := conv(&p.Status)
	if ap != pp || ar != pr || asJSON(ac) != asJSON(pc) {
		return fmt.Sprintf("agent %s ready=%s %s; API %s ready=%s %s", ap, ar, asJSON(ac), pp, pr, asJSON(pc))
	}
	return ""
}

// writes are the requests that changed something, by one client.
type writes struct {
	// objects counts the writes (create, update, patch, delete) to
	// each pod and pod status ("pods/status default/web") and any
	// other object but the node's own.
	objects map[string]int
	total   int
	// node, lease and events count the writes of the Node (and its
	// status), its Lease and events apart: a Lease renewal is not a
	// status write, and each event is an object of its own.
	node, lease, events int
}

// countWrites counts node's writes in events.
func countWrites(events []env.AuditEvent, node string) writes {
	w := writes{objects: map[string]int{}}
	for _, e := range events {
		if e.User.Username != "system:node:"+node {
			continue
		}
		switch e.Verb {
		case "create", "update", "patch", "delete":
		default:
			continue
		}
		switch e.ObjectRef.Resource {
		case "leases":
			w.lease++
		case "nodes":
			w.node++
		case "events":
			w.events++
		default:
			res := e.ObjectRef.Resource
			if e.ObjectRef.Subresource != "" {
				res += "/" + e.ObjectRef.Subresource
			}
			w.objects[res+" "+e.ObjectRef.Namespace+"/"+e.ObjectRef.Name]++
			w.total++
		}
	}
	return w
}
