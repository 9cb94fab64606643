package agent_test

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// callsSince returns the runtime calls made after the first n.
func (h *harness) callsSince(n int) []string {
	return h.rt.Calls()[n:]
}

// spared runs a pod of one container, app, whose restart policy is
// Always, until its spare is made 10 s after its start.
func spared(t *testing.T, name string) (*harness, *corev1.Pod) {
	t.Helper()
	h := newHarness(t)
	h.spareAfter = 10 * time.Second
	p := newPod(name, corev1.RestartPolicyAlways, ctr("app"))
	h.put(p)
	h.start()
	h.synced(0, "app running", func() bool { return h.running(id(p, "app", 0)) })
	h.advance(10 * time.Second)
	h.eventually("spare made", func() bool { _, ok := h.rt.Container(id(p, "app", 1)); return ok })
	return h, p
}

func TestSpareIsMadeOnceTheContainerHasRunAndStartedAfterAReboot(t *testing.T) {
	h := newHarness(t)
	h.spareAfter = 10 * time.Second
	p := newPod("spared", corev1.RestartPolicyAlways, ctr("app"))
	h.put(p)
	h.start()
	h.synced(0, "app running", func() bool { return h.running(id(p, "app", 0)) })
	h.advance(9 * time.Second)
	h.wantDump(id(p, "app", 0) + " running attempt=0\n")
	h.advance(time.Second)
	h.eventually("spare made", func() bool {
		return h.rt.Dump() == id(p, "app", 0)+" running attempt=0\n"+id(p, "app", 1)+" created attempt=1 spare\n"
	})
	// The spare is no attempt: the status is the running one's.
	if cs := h.container(p, "app"); stateOf(cs) != "running" || cs.RestartCount != 0 || cs.ContainerID != "containerd://"+id(p, "app", 0) {
		t.Fatalf("status with a spare: %+v", cs)
	}
	h.stopManager()

	h.clk.Advance(time.Hour)
	h.rt.Reboot()
	calls := len(h.rt.Calls())
	n := h.clk.syncs()
	h.start()
	h.synced(n, "the spare running after the reboot", func() bool {
		cs := h.container(p, "app")
		return h.running(id(p, "app", 1)) && stateOf(cs) == "running" && cs.RestartCount == 1
	})
	if got, want := h.callsSince(calls), []string{"start " + id(p, "app", 1)}; !slices.Equal(got, want) {
		t.Fatalf("calls after the reboot = %q, want %q", got, want)
	}
	// The next attempt gets its spare in turn.
	h.advance(10 * time.Second)
	h.eventually("attempt 2's spare", func() bool {
		c, ok := h.rt.Container(id(p, "app", 2))
		return ok && c.State.String() == "created"
	})
}

func TestSpareStartsTheRestartAfterACrash(t *testing.T) {
	h, p := spared(t, "crashy")
	calls := len(h.rt.Calls())
	h.exit(id(p, "app", 0), 1, "back-off", func() bool { return h.state(p, "app") == "waiting:CrashLoopBackOff" })
	h.advance(10 * time.Second)
	h.eventually("attempt 1 running", func() bool { return h.running(id(p, "app", 1)) })
	if got := h.callsSince(calls); slices.Contains(got, "create "+id(p, "app", 1)) {
		t.Fatalf("the restart created its container again: %q", got)
	}
	// Until the restart has run 10 s, it has no spare: a crash loop makes none.
	h.exit(id(p, "app", 1), 1, "back-off", func() bool { return h.state(p, "app") == "waiting:CrashLoopBackOff" })
	h.advance(20 * time.Second)
	h.eventually("attempt 2 running", func() bool { return h.running(id(p, "app", 2)) })
	if got := h.callsSince(calls); !slices.Contains(got, "create "+id(p, "app", 2)) {
		t.Fatalf("attempt 2 not created: %q", got)
	}
}

func TestSpareOfAnotherRuntimeIsMadeAnew(t *testing.T) {
	h, p := spared(t, "upgraded")
	h.stopManager()

	// The agent comes back after a reboot as another build: the spare is
	// not what it would make.
	h.rt.Reboot()
	h.rt.SetSpareKey("another build")
	calls := len(h.rt.Calls())
	n := h.clk.syncs()
	h.start()
	h.synced(n, "attempt 1 running", func() bool { return h.running(id(p, "app", 1)) })
	want := []string{"remove " + id(p, "app", 1), "create " + id(p, "app", 1), "start " + id(p, "app", 1)}
	if got := h.callsSince(calls); !slices.Equal(got, want) {
		t.Fatalf("calls after the reboot = %q, want %q", got, want)
	}
}

func TestSparesOnlyWhereAContainerRestarts(t *testing.T) {
	h := newHarness(t)
	h.spareAfter = 10 * time.Second
	once := newPod("once", corev1.RestartPolicyNever, ctr("app"))
	sidecar := ctr("proxy")
	sidecar.RestartPolicy = new(corev1.ContainerRestartPolicyAlways)
	withSidecar := newPod("with-sidecar", corev1.RestartPolicyNever, ctr("app"))
	withSidecar.Spec.InitContainers = []corev1.Container{sidecar}
	h.put(once, withSidecar)
	h.start()
	h.synced(1, "all running", func() bool {
		return h.running(id(once, "app", 0)) && h.running(id(withSidecar, "app", 0)) && h.running(id(withSidecar, "proxy", 0))
	})
	h.advance(time.Minute)
	h.eventually("the sidecar's spare", func() bool { _, ok := h.rt.Container(id(withSidecar, "proxy", 1)); return ok })
	for _, c := range []string{id(once, "app", 1), id(withSidecar, "app", 1)} {
		if _, ok := h.rt.Container(c); ok {
			t.Errorf("spare %s of a container that is never restarted:\n%s", c, h.rt.Dump())
		}
	}

	// The pod's removal removes its spare with its containers.
	if _, err := h.st.Pods().Delete(withSidecar.Namespace, withSidecar.Name); err != nil {
		t.Fatal(err)
	}
	h.eventually("the pod's containers removed", func() bool { return h.rt.Dump() == id(once, "app", 0)+" running attempt=0\n" })
}
