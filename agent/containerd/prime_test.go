package containerd

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	apitask "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/internal/clock/clocktest"
)

// podStore is a container store of containers of several pods, which
// counts its lists and filters them by pod UID as containerd does.
type podStore struct {
	containers.Store // methods the test does not expect panic
	mu               sync.Mutex
	cs               []containers.Container
	lists            int
}

func (s *podStore) List(_ context.Context, filters ...string) ([]containers.Container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lists++
	var out []containers.Container
	for _, c := range s.cs {
		for _, f := range filters {
			if _, want, ok := strings.Cut(f, "=="); !ok || fmt.Sprintf("%q", c.Labels[agent.LabelPodUID]) == want {
				out = append(out, c)
				break
			}
		}
	}
	return out, nil
}

// runningTasks is a task service with a running task for each container
// it names, which counts its lists and lookups.
type runningTasks struct {
	tasks.TasksClient // methods the test does not expect panic
	mu                sync.Mutex
	running           map[string]bool
	lists, gets       int
}

func (t *runningTasks) process(id string) *apitask.Process {
	return &apitask.Process{ID: id, Pid: noPID, Status: apitask.Status_RUNNING}
}

func (t *runningTasks) Get(_ context.Context, r *tasks.GetRequest, _ ...grpc.CallOption) (*tasks.GetResponse, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gets++
	if !t.running[r.ContainerID] {
		return nil, errgrpc.ToGRPC(fmt.Errorf("task %s: %w", r.ContainerID, errdefs.ErrNotFound))
	}
	return &tasks.GetResponse{Process: t.process(r.ContainerID)}, nil
}

func (t *runningTasks) List(context.Context, *tasks.ListTasksRequest, ...grpc.CallOption) (*tasks.ListTasksResponse, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lists++
	var out []*apitask.Process
	for id := range t.running {
		out = append(out, t.process(id))
	}
	return &tasks.ListTasksResponse{Tasks: out}, nil
}

func (t *runningTasks) calls() (lists, gets int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lists, t.gets
}

// TestPrimeServesEachPodsFirstList: after Prime, each pod's first List
// is answered from its one listing, the same as containerd would answer
// it (a running container, one never started, one whose task was lost
// with the node), and asks containerd nothing; a pod's second List, and
// any once the listing is older than primedFor, ask containerd.
func TestPrimeServesEachPodsFirstList(t *testing.T) {
	dir := t.TempDir()
	pod := func(uid, id string, started bool) containers.Container {
		labels := map[string]string{agent.LabelPodUID: uid, agent.LabelLogPath: dir + "/" + id + ".log"}
		if started {
			labels[agent.LabelStartedAt] = "2026-12-07T03:00:00Z"
		}
		return containers.Container{ID: id, Labels: labels, Runtime: containers.RuntimeInfo{Name: "io.containerd.runc.v2"}}
	}
	store := &podStore{cs: []containers.Container{
		pod("aaaaaaaaaaaa", "aaaaaaaaaaaa-web-1", true),   // running
		pod("aaaaaaaaaaaa", "aaaaaaaaaaaa-side-0", false), // created, never started
		pod("bbbbbbbbbbbb", "bbbbbbbbbbbb-web-0", true),   // its task lost with the node
		pod("cccccccccccc", "cccccccccccc-web-0", true),   // running
	}}
	ts := &runningTasks{running: map[string]bool{"aaaaaaaaaaaa-web-1": true, "cccccccccccc-web-0": true}}
	clk := clocktest.New(time.Date(2026, 12, 7, 4, 0, 0, 0, time.UTC))
	ctx := context.Background()

	// The running containers' output is copied already (reattach asks
	// for their tasks otherwise): the task lookups counted are the
	// lists'.
	attached := func(r *Runtime) *Runtime {
		for id := range ts.running {
			r.attached[id] = true
		}
		return r
	}
	// What containerd answers each pod, without a listing.
	live := attached(testRuntime(t, dir, clk, ts, store))
	want := map[string][]agent.Container{}
	for _, uid := range []string{"aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc", "dddddddddddd"} {
		cs, err := live.List(ctx, uid)
		if err != nil {
			t.Fatal(err)
		}
		want[uid] = cs
	}
	if len(want["aaaaaaaaaaaa"]) != 2 || len(want["bbbbbbbbbbbb"]) != 1 || want["bbbbbbbbbbbb"][0].State != agent.StateExited {
		t.Fatalf("containerd's answers are not the test's: %+v", want)
	}

	r := attached(testRuntime(t, dir, clk, ts, store))
	store.lists, ts.lists, ts.gets = 0, 0, 0
	r.Prime(ctx)
	for _, uid := range []string{"aaaaaaaaaaaa", "bbbbbbbbbbbb", "dddddddddddd"} {
		got, err := r.List(ctx, uid)
		if err != nil {
			t.Fatal(err)
		}
		// The lost container's time of death is the clock's, the same.
		if !reflect.DeepEqual(got, want[uid]) {
			t.Errorf("pod %s from the listing: %+v\nwant, as containerd answers: %+v", uid, got, want[uid])
		}
	}
	if lists, gets := ts.calls(); store.lists != 1 || lists != 1 || gets != 0 {
		t.Errorf("three pods' first lists after Prime: %d container lists, %d task lists, %d task lookups; want 1, 1, 0", store.lists, lists, gets)
	}
	all, err := r.List(ctx, "")
	if err != nil || len(all) != 4 {
		t.Errorf("every pod's containers from the listing: %d, %v; want 4", len(all), err)
	}

	if _, err := r.List(ctx, "aaaaaaaaaaaa"); err != nil {
		t.Fatal(err)
	}
	if lists, gets := ts.calls(); store.lists != 2 || lists != 1 || gets != 2 {
		t.Errorf("a pod's second list: %d container lists, %d task lists, %d task lookups in all; want 2, 1, 2", store.lists, lists, gets)
	}

	clk.Advance(primedFor + time.Second)
	got, err := r.List(ctx, "cccccccccccc")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want["cccccccccccc"]) {
		t.Errorf("pod cccccccccccc after the listing went stale: %+v, want %+v", got, want["cccccccccccc"])
	}
	if lists, gets := ts.calls(); store.lists != 3 || lists != 1 || gets != 3 {
		t.Errorf("a first list after primedFor: %d container lists, %d task lists, %d task lookups in all; want 3, 1, 3", store.lists, lists, gets)
	}
}
