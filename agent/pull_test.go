package agent_test

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
)

// pullPod is a pod of one container of image with policy.
func pullPod(name, image string, policy corev1.PullPolicy) *corev1.Pod {
	c := ctr("app")
	c.Image, c.ImagePullPolicy = image, policy
	return newPod(name, corev1.RestartPolicyAlways, c)
}

// pullTimes advances the fake clock a second at a time for d and returns
// the offsets from the first advance at which a pull of ref was tried.
// After each try the container shows ErrImagePull, and a second later
// ImagePullBackOff.
func (h *harness) pullTimes(p *corev1.Pod, container, ref string, d time.Duration) []time.Duration {
	h.t.Helper()
	var out []time.Duration
	n := h.rt.PullAttempts(ref)
	for at := time.Second; at <= d; at += time.Second {
		h.advance(time.Second)
		if got := h.rt.PullAttempts(ref); got != n {
			n = got
			out = append(out, at)
			h.eventually("ErrImagePull after the pull", func() bool { return h.state(p, container) == "waiting:ErrImagePull" })
			continue
		}
		if len(out) > 0 && at == out[len(out)-1]+time.Second {
			h.eventually("ImagePullBackOff after ErrImagePull", func() bool { return h.state(p, container) == "waiting:ImagePullBackOff" })
		}
	}
	return out
}

func TestImagePullBackoffDoublesToFiveMinutesAndResetsOnSuccess(t *testing.T) {
	h := newHarness(t)
	p := pullPod("remote", "remote:1", corev1.PullAlways)
	h.put(p)
	h.start()
	h.synced(0, "first pull failed", func() bool { return h.state(p, "app") == "waiting:ErrImagePull" })
	if n := h.rt.PullAttempts("remote:1"); n != 1 {
		t.Fatalf("%d pull attempts, want 1", n)
	}
	// Tries at 10 s, then 20, 40, 80, 160 and 300 s after the one before.
	got := h.pullTimes(p, "app", "remote:1", 910*time.Second)
	want := []time.Duration{10, 30, 70, 150, 310, 610, 910}
	if len(got) != len(want) {
		t.Fatalf("pulls at %v, want at %v s", got, want)
	}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Fatalf("pulls at %v, want at %v s", got, want)
		}
	}
	h.advance(time.Second)
	h.eventually("backing off", func() bool { return h.state(p, "app") == "waiting:ImagePullBackOff" })
	w := h.container(p, "app").State.Waiting
	if !strings.Contains(w.Message, `Back-off pulling image "remote:1"`) || !strings.Contains(w.Message, "not in the fake registry") {
		t.Fatalf("backoff message %q", w.Message)
	}
	var backoffEvents int
	for _, e := range h.m.Events(string(p.UID)) {
		if e.Reason == "BackOff" && strings.Contains(e.Message, "remote:1") {
			backoffEvents++
		}
	}
	if backoffEvents == 0 {
		t.Fatalf("no BackOff event: %+v", h.m.Events(string(p.UID)))
	}

	// The image shows up in the registry: pulled at the next try, 300 s
	// after the last.
	h.rt.AddToRegistry("remote:1")
	h.pullTimes(p, "app", "remote:1", 298*time.Second)
	if n := h.rt.PullAttempts("remote:1"); n != 8 {
		t.Fatalf("%d pull attempts before the backoff ended, want 8", n)
	}
	h.advance(time.Second)
	h.eventually("running", func() bool { return h.running(id(p, "app", 0)) && h.state(p, "app") == "running" })

	// The success reset the backoff: a pull failing after the next
	// crash waits 10 s again, not 5 min.
	h.rt.RemoveFromRegistry("remote:1")
	h.rt.RemoveImage("remote:1")
	h.exit(id(p, "app", 0), 1, "crash loop back-off", func() bool { return h.state(p, "app") == "waiting:CrashLoopBackOff" })
	n := h.rt.PullAttempts("remote:1")
	h.advance(10 * time.Second)
	h.eventually("pull after the crash backoff", func() bool {
		return h.rt.PullAttempts("remote:1") == n+1 && h.state(p, "app") == "waiting:ErrImagePull"
	})
	if got := h.pullTimes(p, "app", "remote:1", 10*time.Second); len(got) != 1 || got[0] != 10*time.Second {
		t.Fatalf("after a reset, next pull at %v, want [10s]", got)
	}
}

func TestImagePullBackoffIsPerImage(t *testing.T) {
	h := newHarness(t)
	a := pullPod("a", "remote:a", corev1.PullIfNotPresent)
	c := ctr("other")
	c.Image = "remote:b"
	a.Spec.Containers = append(a.Spec.Containers, c)
	h.put(a)
	h.start()
	h.synced(0, "both pulls failed", func() bool {
		return h.state(a, "app") == "waiting:ErrImagePull" && h.state(a, "other") == "waiting:ErrImagePull"
	})
	// remote:b fails twice more, remote:a becomes pullable at once.
	h.rt.AddToRegistry("remote:a")
	h.pullTimes(a, "other", "remote:b", 30*time.Second)
	if n := h.rt.PullAttempts("remote:b"); n != 3 {
		t.Fatalf("remote:b pulled %d times in 30 s, want 3 (0, 10, 30 s)", n)
	}
	if n := h.rt.PullAttempts("remote:a"); n != 2 {
		t.Fatalf("remote:a pulled %d times, want 2 (failed, then pulled at 10 s)", n)
	}
	if !h.running(id(a, "app", 0)) {
		t.Fatalf("app not running:\n%s", h.rt.Dump())
	}
}

func TestImageAppearingDuringBackoffStartsPodWhenWoken(t *testing.T) {
	h := newHarness(t)
	ifNot := pullPod("ifnot", "late:1", corev1.PullIfNotPresent)
	never := pullPod("never", "late:1", corev1.PullNever)
	h.put(ifNot, never)
	h.start()
	h.synced(1, "both waiting", func() bool {
		return h.state(ifNot, "app") == "waiting:ErrImagePull" && h.state(never, "app") == "waiting:ErrImageNeverPull"
	})
	h.advance(time.Second)
	h.eventually("backing off", func() bool { return h.state(ifNot, "app") == "waiting:ImagePullBackOff" })
	if n := h.rt.PullAttempts("late:1"); n != 1 {
		t.Fatalf("%d pulls of late:1, want 1 (the Never pod pulls nothing)", n)
	}
	// The image is imported (from the image directory) and the workers
	// woken: both pods start with no time passing and no pull.
	h.rt.AddImage("late:1")
	h.m.WakeAll()
	h.eventually("both running", func() bool {
		return h.running(id(ifNot, "app", 0)) && h.running(id(never, "app", 0)) &&
			h.state(ifNot, "app") == "running" && h.state(never, "app") == "running"
	})
	if n := h.rt.PullAttempts("late:1"); n != 1 {
		t.Fatalf("%d pulls of late:1, want still 1", n)
	}
}

func TestImagePullPolicies(t *testing.T) {
	for _, tc := range []struct {
		name      string
		policy    corev1.PullPolicy
		present   bool
		registry  bool
		wantState string
		wantPulls int
	}{
		{"always pulls a present image", corev1.PullAlways, true, true, "running", 1},
		{"always runs a present image when the pull fails", corev1.PullAlways, true, false, "running", 1},
		{"if-not-present uses a present image without pulling", corev1.PullIfNotPresent, true, false, "running", 0},
		{"if-not-present pulls a missing image", corev1.PullIfNotPresent, false, true, "running", 1},
		{"never uses a present image", corev1.PullNever, true, true, "running", 0},
		{"never fails on a missing image without pulling", corev1.PullNever, false, true, "waiting:ErrImageNeverPull", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			p := pullPod("p", "img:1", tc.policy)
			if tc.present {
				h.rt.AddImage("img:1")
			}
			if tc.registry {
				h.rt.AddToRegistry("img:1")
			}
			h.put(p)
			h.start()
			h.synced(0, tc.wantState, func() bool { return h.state(p, "app") == tc.wantState })
			if n := h.rt.PullAttempts("img:1"); n != tc.wantPulls {
				t.Fatalf("%d pull attempts, want %d", n, tc.wantPulls)
			}
		})
	}
}

func TestDefaultPullPolicy(t *testing.T) {
	for _, tc := range []struct {
		image string
		want  corev1.PullPolicy
	}{
		{"busybox", corev1.PullAlways},
		{"busybox:latest", corev1.PullAlways},
		{"127.0.0.1:5000/busybox", corev1.PullAlways},
		{"127.0.0.1:5000/busybox:latest", corev1.PullAlways},
		{"busybox:1.35", corev1.PullIfNotPresent},
		{"127.0.0.1:5000/busybox:1.35", corev1.PullIfNotPresent},
		{"busybox@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", corev1.PullIfNotPresent},
		{"busybox:latest@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", corev1.PullAlways},
	} {
		if got := agent.PullPolicy(&corev1.Container{Image: tc.image}); got != tc.want {
			t.Errorf("default pull policy of %s = %s, want %s", tc.image, got, tc.want)
		}
	}
	if got := agent.PullPolicy(&corev1.Container{Image: "busybox", ImagePullPolicy: corev1.PullNever}); got != corev1.PullNever {
		t.Errorf("a set policy was replaced: %s", got)
	}
}

// Each container start records a Pulled event, as kubelet does: saying the
// image was pulled, or that it was already on the node.
func TestPulledEvents(t *testing.T) {
	h := newHarness(t)
	h.rt.AddToRegistry("remote:2")
	h.rt.AddImage("local:2")
	fetched := pullPod("fetched", "remote:2", corev1.PullIfNotPresent)
	local := pullPod("local", "local:2", corev1.PullIfNotPresent)
	h.put(fetched)
	h.put(local)
	h.start()
	h.synced(0, "both running", func() bool { return h.state(fetched, "app") == "running" && h.state(local, "app") == "running" })
	pulled := func(p *corev1.Pod) []string {
		var msgs []string
		for _, e := range h.m.Events(string(p.UID)) {
			if e.Reason == "Pulled" {
				msgs = append(msgs, e.Message)
			}
		}
		return msgs
	}
	if got := pulled(fetched); len(got) != 1 || got[0] != `Successfully pulled image "remote:2"` {
		t.Errorf("fetched pod's Pulled events = %q", got)
	}
	if got := pulled(local); len(got) != 1 || got[0] != `Container image "local:2" already present on machine` {
		t.Errorf("local pod's Pulled events = %q", got)
	}
}
