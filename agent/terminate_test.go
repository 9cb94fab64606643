package agent_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/agent/runtimetest"
	"github.com/outpost-edge/outpost/store"
)

// markDeleted stores p as the API watch does when the pod is deleted: with
// a deletionTimestamp and the deletion's grace period.
func (h *harness) markDeleted(p *corev1.Pod, grace int64) {
	h.t.Helper()
	d := p.DeepCopy()
	now := metav1.NewTime(h.clk.Now())
	d.DeletionTimestamp, d.DeletionGracePeriodSeconds = &now, &grace
	if err := h.st.Pods().Put(store.SourceAPI, d); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) putAPI(p *corev1.Pod) {
	h.t.Helper()
	if err := h.st.Pods().Put(store.SourceAPI, p); err != nil {
		h.t.Fatal(err)
	}
}

func TestTerminateUsesDeletionGracePeriodAndReportsTerminalStatus(t *testing.T) {
	h := newHarness(t)
	p := newPod("web", corev1.RestartPolicyAlways, ctr("app"), ctr("sidecar"))
	spec := int64(30)
	p.Spec.TerminationGracePeriodSeconds = &spec
	h.rt.SetHandlesSIGTERM(id(p, "app", 0), true)
	h.putAPI(p)
	h.start()
	h.synced(0, "running", func() bool {
		return h.running(id(p, "app", 0)) && h.running(id(p, "sidecar", 0)) && h.phase(p) == corev1.PodRunning
	})

	h.markDeleted(p, 5)
	h.eventually("terminal status journaled", func() bool { return h.phase(p) == corev1.PodFailed })
	calls := h.rt.Calls()
	for _, want := range []string{"stop " + id(p, "app", 0) + " 5s", "stop " + id(p, "sidecar", 0) + " 5s"} {
		if !slices.Contains(calls, want) {
			t.Errorf("no %q (the deletion's grace period, not the spec's 30 s) in %q", want, calls)
		}
	}
	if got := h.state(p, "app"); got != "terminated:143" {
		t.Errorf("app %s, want terminated:143 (its SIGTERM handler)", got)
	}
	if got := h.state(p, "sidecar"); got != "terminated:137" {
		t.Errorf("sidecar %s, want terminated:137", got)
	}
	st, _, _ := h.status(p)
	for _, c := range st.Conditions {
		if (c.Type == corev1.PodReady || c.Type == corev1.ContainersReady) && (c.Status != corev1.ConditionFalse || c.Reason != "PodFailed") {
			t.Errorf("condition %s = %s (%s), want False (PodFailed)", c.Type, c.Status, c.Reason)
		}
	}
	// Stopped, not removed: the pod is still in the store until the API
	// server deletes it for good.
	if _, ok := h.rt.Container(id(p, "app", 0)); !ok {
		t.Error("containers removed while the pod is still desired")
	}
	if slices.ContainsFunc(h.rt.Calls(), func(c string) bool { return c == "start "+id(p, "app", 1) }) {
		t.Error("a container of a pod being deleted was restarted")
	}
}

func TestTerminateAllExitedZeroIsSucceeded(t *testing.T) {
	h := newHarness(t)
	p := newPod("graceful", corev1.RestartPolicyAlways, ctr("app"))
	h.putAPI(p)
	h.start()
	h.synced(0, "running", func() bool { return h.running(id(p, "app", 0)) })
	// The container exits 0 on its own during the grace period, before
	// the stop reaches it.
	if err := h.rt.Exit(id(p, "app", 0), 0); err != nil {
		t.Fatal(err)
	}
	h.markDeleted(p, 30)
	h.eventually("succeeded", func() bool { return h.phase(p) == corev1.PodSucceeded })
	if got := h.state(p, "app"); got != "terminated:0" {
		t.Errorf("app %s, want terminated:0 (not waiting to restart)", got)
	}
	if c := h.condition(p, corev1.PodReady); c != corev1.ConditionFalse {
		t.Errorf("Ready %s", c)
	}
}

// TestTerminateJournalsEvenAnUnchangedStatus: a pod that completed and
// whose status was sent is deleted; the sink needs a status from after the
// deletion to delete it for good, though it reads the same.
func TestTerminateJournalsEvenAnUnchangedStatus(t *testing.T) {
	h := newHarness(t)
	p := newPod("job", corev1.RestartPolicyNever, ctr("app"))
	h.putAPI(p)
	h.start()
	h.synced(0, "running", func() bool { return h.running(id(p, "app", 0)) })
	h.exit(id(p, "app", 0), 0, "succeeded", func() bool { return h.phase(p) == corev1.PodSucceeded })
	// The sink sends it and acknowledges it.
	for _, e := range h.entries() {
		if _, err := h.st.Ack(e); err != nil {
			t.Fatal(err)
		}
	}
	h.markDeleted(p, 30)
	h.eventually("terminal status journaled again", func() bool { return h.phase(p) == corev1.PodSucceeded })
}

func TestTerminateNeverStartedContainerIsUnknown(t *testing.T) {
	h := newHarness(t)
	p := newPod("noimage", corev1.RestartPolicyAlways, ctr("app"), corev1.Container{Name: "missing", Image: "nowhere:1", ImagePullPolicy: corev1.PullNever})
	h.putAPI(p)
	h.start()
	h.synced(0, "app running, missing waiting", func() bool {
		return h.running(id(p, "app", 0)) && h.state(p, "missing") == "waiting:ErrImageNeverPull"
	})
	h.markDeleted(p, 0)
	h.eventually("failed", func() bool { return h.phase(p) == corev1.PodFailed })
	cs := h.container(p, "missing")
	if term := cs.State.Terminated; term == nil || term.ExitCode != 137 || term.Reason != "ContainerStatusUnknown" {
		t.Errorf("never-started container %+v, want terminated 137 ContainerStatusUnknown", cs.State)
	}
	if !slices.Contains(h.rt.Calls(), "stop "+id(p, "app", 0)+" 0s") {
		t.Errorf("not stopped with grace 0: %q", h.rt.Calls())
	}
}

func TestTerminateBeforeInitIsFailedWithContainersWaiting(t *testing.T) {
	h := newHarness(t)
	p := newPod("init", corev1.RestartPolicyAlways, ctr("app"))
	p.Spec.InitContainers = []corev1.Container{ctr("init1"), ctr("init2")}
	h.putAPI(p)
	h.start()
	h.synced(0, "init1 running", func() bool { return h.running(id(p, "init1", 0)) })
	h.markDeleted(p, 1)
	h.eventually("failed", func() bool { return h.phase(p) == corev1.PodFailed })
	// As kubelet: the init containers up to the last that ran are
	// terminated, the rest and the regular containers keep waiting.
	if got := h.state(p, "init1"); got != fmt.Sprintf("terminated:%d", runtimetest.ExitKilled) {
		t.Errorf("init1 %s", got)
	}
	if got := h.state(p, "init2"); got != "waiting:ContainerCreating" && got != "waiting:PodInitializing" {
		t.Errorf("init2 %s, want still waiting", got)
	}
	if got := h.state(p, "app"); got != "waiting:PodInitializing" {
		t.Errorf("app %s, want waiting:PodInitializing", got)
	}
	h.advance(time.Minute) // a resync changes nothing
	if h.running(id(p, "init2", 0)) || h.running(id(p, "app", 0)) {
		t.Error("a container of a pod being deleted was started")
	}
}
