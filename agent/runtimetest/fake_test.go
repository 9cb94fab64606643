package runtimetest

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/internal/clock/clocktest"
)

func spec(id, pod string, attempt string) agent.ContainerSpec {
	return agent.ContainerSpec{
		ID:     id,
		Labels: map[string]string{agent.LabelPodUID: pod, agent.LabelContainer: "c", agent.LabelAttempt: attempt},
		Image:  agent.Image{Ref: "busybox:1", ID: "busybox:1@sha256:x"},
	}
}

func TestEnsureImage(t *testing.T) {
	for _, tc := range []struct {
		name              string
		present, registry bool
		policy            corev1.PullPolicy
		want              error
		pulled            bool
	}{
		{name: "present, never", present: true, policy: corev1.PullNever},
		{name: "missing, never", policy: corev1.PullNever, want: agent.ErrImageNeverPull},
		{name: "missing, if not present, no registry", policy: corev1.PullIfNotPresent, want: agent.ErrImagePull},
		{name: "missing, if not present, in registry", registry: true, policy: corev1.PullIfNotPresent, pulled: true},
		{name: "missing, never, in registry", registry: true, policy: corev1.PullNever, want: agent.ErrImageNeverPull},
		{name: "present, always, in registry", present: true, registry: true, policy: corev1.PullAlways, pulled: true},
		{name: "present, always, offline", present: true, policy: corev1.PullAlways},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := New(clocktest.New(time.Unix(0, 0)))
			if tc.present {
				f.AddImage("busybox:1")
			}
			if tc.registry {
				f.AddToRegistry("busybox:1")
			}
			img, err := f.EnsureImage(context.Background(), "busybox:1", tc.policy)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if err == nil && (img.Ref != "busybox:1" || img.ID == "") {
				t.Fatalf("image = %+v", img)
			}
			if pulled := len(f.Calls()) == 1; pulled != tc.pulled {
				t.Fatalf("calls = %q, want pulled=%v", f.Calls(), tc.pulled)
			}
			if present := len(f.Images()) == 1; present != (err == nil) {
				t.Fatalf("images = %q after err %v", f.Images(), err)
			}
		})
	}
}

func TestLifecycleAndDump(t *testing.T) {
	clk := clocktest.New(time.Unix(100, 0))
	f := New(clk)
	f.AddImage("busybox:1")
	ctx, cancel := context.WithCancel(context.Background())
	exits := f.Exits(ctx)

	if err := f.Create(ctx, spec("a-0", "pod-a", "0")); err != nil {
		t.Fatal(err)
	}
	if err := f.Create(ctx, spec("a-0", "pod-a", "0")); !errors.Is(err, agent.ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	if err := f.Create(ctx, spec("b-0", "pod-b", "0")); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if err := f.Start(ctx, "a-0"); err != nil {
		t.Fatal(err)
	}
	if err := f.Start(ctx, "a-0"); err == nil {
		t.Fatal("second start of a running container succeeded")
	}
	c, _ := f.Container("a-0")
	if !c.StartedAt.Equal(time.Unix(101, 0)) || c.Labels[agent.LabelStartedAt] == "" || c.Labels[agent.LabelImageRef] != "busybox:1@sha256:x" {
		t.Fatalf("started container = %+v", c)
	}
	cs, err := f.List(ctx, "pod-a")
	if err != nil || len(cs) != 1 || cs[0].ID != "a-0" {
		t.Fatalf("List(pod-a) = %+v, %v", cs, err)
	}

	clk.Advance(time.Second)
	if err := f.Exit("a-0", 3); err != nil {
		t.Fatal(err)
	}
	if id := <-exits; id != "a-0" {
		t.Fatalf("exit event for %q", id)
	}
	if err := f.Exit("b-0", 1); err == nil {
		t.Fatal("Exit of a created container succeeded")
	}
	want := "a-0 exited attempt=0 exit=3\nb-0 created attempt=0\n"
	if got := f.Dump(); got != want {
		t.Fatalf("dump:\n%s\nwant:\n%s", got, want)
	}
	c, _ = f.Container("a-0")
	if !c.FinishedAt.Equal(time.Unix(102, 0)) {
		t.Fatalf("finished at %v", c.FinishedAt)
	}

	cancel()
	if _, ok := <-exits; ok {
		t.Fatal("exits channel not closed after ctx ended")
	}
}

func TestStopExitCodes(t *testing.T) {
	f := New(clocktest.New(time.Unix(0, 0)))
	f.AddImage("busybox:1")
	ctx := context.Background()
	f.SetHandlesSIGTERM("term-0", true)
	for _, id := range []string{"kill-0", "term-0"} {
		if err := f.Create(ctx, spec(id, "p", "0")); err != nil {
			t.Fatal(err)
		}
		if err := f.Start(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := f.Stop(ctx, id, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := f.Stop(ctx, id, 5*time.Second); err != nil {
			t.Fatalf("stop of a stopped container: %v", err)
		}
	}
	if got, want := f.Dump(), "kill-0 exited attempt=0 exit=137\nterm-0 exited attempt=0 exit=143\n"; got != want {
		t.Fatalf("dump:\n%s\nwant:\n%s", got, want)
	}
	if err := f.Stop(ctx, "nope", time.Second); !errors.Is(err, agent.ErrNotFound) {
		t.Fatalf("stop of unknown: %v", err)
	}
	if err := f.Remove(ctx, "kill-0"); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(ctx, "kill-0"); err != nil {
		t.Fatalf("remove of unknown: %v", err)
	}
	if got, want := f.Dump(), "term-0 exited attempt=0 exit=143\n"; got != want {
		t.Fatalf("dump after remove:\n%s", got)
	}
}

func TestFailNextChangesNothing(t *testing.T) {
	f := New(clocktest.New(time.Unix(0, 0)))
	f.AddImage("busybox:1")
	ctx := context.Background()
	boom := errors.New("boom")
	f.FailNext(OpCreate, boom)
	if err := f.Create(ctx, spec("a-0", "p", "0")); !errors.Is(err, boom) {
		t.Fatalf("create: %v, want boom", err)
	}
	if f.Dump() != "" {
		t.Fatalf("failed create left %q", f.Dump())
	}
	if err := f.Create(ctx, spec("a-0", "p", "0")); err != nil {
		t.Fatalf("only the next call fails: %v", err)
	}
	f.FailNext(OpStart, boom)
	if err := f.Start(ctx, "a-0"); !errors.Is(err, boom) {
		t.Fatalf("start: %v", err)
	}
	if got := f.Dump(); got != "a-0 created attempt=0\n" {
		t.Fatalf("failed start changed state: %q", got)
	}
	f.FailNext(OpEnsureImage, boom)
	if _, err := f.EnsureImage(ctx, "busybox:1", corev1.PullIfNotPresent); !errors.Is(err, boom) {
		t.Fatalf("ensure image: %v", err)
	}
}

func TestExec(t *testing.T) {
	f := New(clocktest.New(time.Unix(0, 0)))
	f.AddImage("busybox:1")
	ctx := context.Background()
	f.Create(ctx, spec("a-0", "p", "0"))
	if _, _, err := f.Exec(ctx, "a-0", []string{"true"}); err == nil {
		t.Fatal("exec in a created container succeeded")
	}
	f.Start(ctx, "a-0")
	f.SetExec(func(_ context.Context, id string, cmd []string) (int, []byte, error) {
		return 7, []byte(id + ":" + cmd[0]), nil
	})
	code, out, err := f.Exec(ctx, "a-0", []string{"check"})
	if code != 7 || string(out) != "a-0:check" || err != nil {
		t.Fatalf("exec = %d %q %v", code, out, err)
	}
}

func TestRebootLeavesUnknownExits(t *testing.T) {
	clk := clocktest.New(time.Unix(0, 0))
	f := New(clk)
	f.AddImage("busybox:1")
	ctx := context.Background()
	exits := f.Exits(ctx)
	f.Create(ctx, spec("a-0", "p", "0"))
	f.Start(ctx, "a-0")
	f.Create(ctx, spec("b-0", "p", "0"))
	clk.Advance(time.Minute)
	f.Reboot()
	if got, want := f.Dump(), "a-0 exited attempt=0 exit=255 reason="+agent.ReasonLost+"\nb-0 created attempt=0\n"; got != want {
		t.Fatalf("dump:\n%s\nwant:\n%s", got, want)
	}
	if c, _ := f.Container("a-0"); !c.FinishedAt.Equal(time.Unix(60, 0)) {
		t.Fatalf("rebooted container finished at %v", c.FinishedAt)
	}
	select {
	case id := <-exits:
		t.Fatalf("exit event for %s after a reboot", id)
	default:
	}
}
