package containerd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/agent/containerd/ctrd"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/internal/waittest"
)

// staleTasks is containerd's task service as an agent killed while
// containerd created a task can leave it: the task is listed, so creating
// it again says it exists, but loading it says not found (its shim has no
// container). Deleting it by its ID takes it off the list.
type staleTasks struct {
	tasks.TasksClient // methods the test does not expect panic
	mu                sync.Mutex
	listed            bool
	creates, deletes  int
	killed            bool
}

func (s *staleTasks) Get(context.Context, *tasks.GetRequest, ...grpc.CallOption) (*tasks.GetResponse, error) {
	return nil, errgrpc.ToGRPC(fmt.Errorf("container not created: %w", errdefs.ErrNotFound))
}

func (s *staleTasks) Create(_ context.Context, r *tasks.CreateTaskRequest, _ ...grpc.CallOption) (*tasks.CreateTaskResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.creates++
	if s.listed {
		return nil, errgrpc.ToGRPC(fmt.Errorf("task %s: %w", r.ContainerID, errdefs.ErrAlreadyExists))
	}
	s.listed = true
	return &tasks.CreateTaskResponse{ContainerID: r.ContainerID, Pid: noPID}, nil
}

func (s *staleTasks) Kill(context.Context, *tasks.KillRequest, ...grpc.CallOption) (*emptypb.Empty, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killed = true
	return &emptypb.Empty{}, nil
}

func (s *staleTasks) Delete(_ context.Context, r *tasks.DeleteTaskRequest, _ ...grpc.CallOption) (*tasks.DeleteResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.listed {
		return nil, errgrpc.ToGRPC(fmt.Errorf("task %s: %w", r.ContainerID, errdefs.ErrNotFound))
	}
	s.listed = false
	s.deletes++
	return &tasks.DeleteResponse{ID: r.ContainerID}, nil
}

func (s *staleTasks) Start(context.Context, *tasks.StartRequest, ...grpc.CallOption) (*tasks.StartResponse, error) {
	return &tasks.StartResponse{Pid: noPID}, nil
}

// noPID is above the kernel's highest process ID (pid_max is at most
// 2^22), so no process has it.
const noPID = 1<<22 + 1

// oneContainer is a container store holding one container.
type oneContainer struct {
	mu sync.Mutex
	c  containers.Container
}

func (o *oneContainer) Get(_ context.Context, id string) (containers.Container, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if id != o.c.ID {
		return containers.Container{}, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	return o.c, nil
}

func (o *oneContainer) List(context.Context, ...string) ([]containers.Container, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return []containers.Container{o.c}, nil
}

func (o *oneContainer) Create(_ context.Context, c containers.Container) (containers.Container, error) {
	return c, errdefs.ErrNotImplemented
}

func (o *oneContainer) Update(_ context.Context, c containers.Container, _ ...string) (containers.Container, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k, v := range c.Labels {
		o.c.Labels[k] = v
	}
	return o.c, nil
}

func (o *oneContainer) Delete(context.Context, string) error { return errdefs.ErrNotImplemented }

// testContainer is a container store holding container id of pod
// 0123456789ab, its log under dir, with extra labels.
func testContainer(dir, id string, extra map[string]string) *oneContainer {
	labels := map[string]string{agent.LabelLogPath: filepath.Join(dir, "log", "0.log"), agent.LabelPodUID: "0123456789ab"}
	for k, v := range extra {
		labels[k] = v
	}
	return &oneContainer{c: containers.Container{ID: id, Runtime: containers.RuntimeInfo{Name: "io.containerd.runc.v2"}, Labels: labels}}
}

// testRuntime is a Runtime over the task service ts and the container
// store, with clk and its FIFOs under dir; its label writer is not
// running.
func testRuntime(t *testing.T, dir string, clk clock.Clock, ts tasks.TasksClient, store containers.Store) *Runtime {
	t.Helper()
	cl := &ctrd.Client{Tasks: ts, Containers: store}
	return &Runtime{
		cfg:    Config{Namespace: "test", FIFODir: filepath.Join(dir, "fifo")},
		deps:   Deps{Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		client: cl, poll: testPoller(t), attached: map[string]bool{}, stdin: map[string]io.WriteCloser{}, outputs: map[string]*output{},
		oom: map[string]bool{}, images: map[string]cachedImage{}, created: map[string]fresh{},
		toWrite: make(chan struct{}, 1), writerDone: make(chan struct{}),
	}
}

// TestStartReplacesStaleTask: a task containerd lists but cannot load is
// deleted by its ID and the container started; the soak trial AgentKilled
// found a pod left in RunContainerError ("create task: … already
// exists") after the agent was killed while containerd created its task.
func TestStartReplacesStaleTask(t *testing.T) {
	dir := t.TempDir()
	id := "0123456789ab-main-0"
	ts := &staleTasks{listed: true}
	r := testRuntime(t, dir, clock.Real{}, ts, testContainer(dir, id, nil))
	if err := r.Start(context.Background(), id); err != nil {
		t.Fatalf("start with a stale task: %v", err)
	}
	if !ts.killed || ts.deletes != 1 || ts.creates != 2 {
		t.Errorf("task service: killed %v, %d deletes, %d creates; want the stale task killed, deleted once and the task created again", ts.killed, ts.deletes, ts.creates)
	}
	if r.pending(id)[agent.LabelStartedAt] == "" {
		t.Error("the container's start time was not kept")
	}
}

// askedTasks is a task service with no task, which counts the tasks it
// was asked for and keeps the rootfs of the creates.
type askedTasks struct {
	staleTasks
	gets   int
	rootfs [][]*types.Mount
}

func (a *askedTasks) Get(ctx context.Context, r *tasks.GetRequest, o ...grpc.CallOption) (*tasks.GetResponse, error) {
	a.mu.Lock()
	a.gets++
	a.mu.Unlock()
	return a.staleTasks.Get(ctx, r, o...)
}

func (a *askedTasks) Create(ctx context.Context, r *tasks.CreateTaskRequest, o ...grpc.CallOption) (*tasks.CreateTaskResponse, error) {
	a.mu.Lock()
	a.rootfs = append(a.rootfs, r.Rootfs)
	a.listed = false // each create makes a task anew
	a.mu.Unlock()
	return a.staleTasks.Create(ctx, r, o...)
}

// countedContainers is a container store that counts its Gets.
type countedContainers struct {
	*oneContainer
	gets int
}

func (c *countedContainers) Get(ctx context.Context, id string) (containers.Container, error) {
	c.gets++
	return c.oneContainer.Get(ctx, id)
}

// TestStartOfAContainerJustCreated: a container this runtime created is
// started with the record and mounts its create left, asking containerd
// for nothing but the task's create and start; one it did not create
// (an earlier agent's), or whose first start is over, is read again: its
// record, and a task it may have left.
func TestStartOfAContainerJustCreated(t *testing.T) {
	dir := t.TempDir()
	id := "0123456789ab-main-0"
	ts := &askedTasks{}
	store := &countedContainers{oneContainer: testContainer(dir, id, nil)}
	r := testRuntime(t, dir, clock.Real{}, ts, store)
	rootfs := []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/l", "upperdir=/u", "workdir=/w"}}}
	r.client.Containers = store
	created, err := r.client.LoadContainer(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	store.gets = 0
	r.created[id] = fresh{c: created.WithoutSpec(), rootfs: rootfs}

	if err := r.Start(context.Background(), id); err != nil {
		t.Fatalf("start: %v", err)
	}
	if store.gets != 0 || ts.gets != 0 {
		t.Errorf("start of a container just created: %d container reads, %d task reads; want none", store.gets, ts.gets)
	}
	if len(ts.rootfs) != 1 || len(ts.rootfs[0]) != 1 || ts.rootfs[0][0].Type != "overlay" || !slices.Equal(ts.rootfs[0][0].Options, rootfs[0].Options) {
		t.Errorf("task created on rootfs %v; want the create's %v", ts.rootfs, rootfs)
	}
	if _, ok := r.created[id]; ok {
		t.Error("the create's record is still kept after the start")
	}

	// Started again (a restart of the container): read from containerd.
	if err := r.Start(context.Background(), id); err != nil {
		t.Fatalf("second start: %v", err)
	}
	if store.gets != 1 || ts.gets != 1 {
		t.Errorf("second start: %d container reads, %d task reads; want one each", store.gets, ts.gets)
	}

	// Removed before its start: the record goes with it.
	r.created[id] = fresh{c: created.WithoutSpec(), rootfs: rootfs}
	r.Remove(context.Background(), id)
	if _, ok := r.created[id]; ok {
		t.Error("the create's record is still kept after the container's remove")
	}
}

// TestStartTimeWrittenAfterALull: Start keeps the start time in memory and
// the writer puts it in the container's labels once writes have paused
// for writeLull, not before.
func TestStartTimeWrittenAfterALull(t *testing.T) {
	dir := t.TempDir()
	id := "0123456789ab-main-0"
	store := testContainer(dir, id, nil)
	clk := clocktest.New(time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC))
	r := testRuntime(t, dir, clk, &staleTasks{}, store)
	ctx, stop := context.WithCancel(context.Background())
	go r.writeLabels(ctx)
	defer func() { stop(); <-r.writerDone }()
	if err := r.Start(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	label := func() string {
		store.mu.Lock()
		defer store.mu.Unlock()
		return store.c.Labels[agent.LabelStartedAt]
	}
	want := clk.Now().UTC().Format(time.RFC3339Nano)
	if got := r.pending(id)[agent.LabelStartedAt]; got != want {
		t.Fatalf("start time in memory: %q; want %q", got, want)
	}
	waittest.Poll{Timeout: 5 * time.Second, Every: time.Millisecond}.For(t, "the writer waiting for a lull", func() (bool, string) {
		return clk.Waiters() == 1, fmt.Sprintf("%d timers", clk.Waiters())
	})
	clk.Advance(writeLull - time.Millisecond)
	if got := label(); got != "" {
		t.Fatalf("start time written before the lull: %q", got)
	}
	clk.Advance(time.Millisecond)
	// The writer lets go of what it held just after the write returns:
	// the label can be seen in between.
	waittest.Poll{Timeout: 5 * time.Second, Every: time.Millisecond}.For(t, "the start time written and no longer held in memory", func() (bool, string) {
		p := r.pending(id)
		return label() == want && p == nil, fmt.Sprintf("label %q, held %v", label(), p)
	})
}

// TestLostExitRecordedOnceBehind: a started container whose task is gone
// is exited with the node, found dead at the first look; later looks give
// the same time before it is written, and the writer writes that time.
func TestLostExitRecordedOnceBehind(t *testing.T) {
	dir := t.TempDir()
	id := "0123456789ab-main-0"
	store := testContainer(dir, id, map[string]string{agent.LabelStartedAt: "2026-12-06T02:00:00Z"})
	clk := clocktest.New(time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC))
	r := testRuntime(t, dir, clk, &staleTasks{}, store)
	look := func() agent.Container {
		t.Helper()
		cs, err := r.List(context.Background(), "")
		if err != nil || len(cs) != 1 {
			t.Fatalf("list: %v, %v", cs, err)
		}
		return cs[0]
	}
	first := look()
	if first.State != agent.StateExited || first.ExitCode != 255 || first.Reason != agent.ReasonLost || !first.FinishedAt.Equal(clk.Now()) {
		t.Fatalf("first look: %+v; want exited 255 %s at %v", first, agent.ReasonLost, clk.Now())
	}
	store.mu.Lock()
	wrote := store.c.Labels[labelFinishedAt]
	store.mu.Unlock()
	if wrote != "" {
		t.Errorf("the lost exit was written on the look that found it: %s", wrote)
	}
	clk.Advance(3 * time.Second)
	if again := look(); !again.FinishedAt.Equal(first.FinishedAt) || again.State != agent.StateExited {
		t.Errorf("second look: %s at %v; want exited at %v", again.State, again.FinishedAt, first.FinishedAt)
	}
	if !r.flushLabels(context.Background(), 0) {
		t.Fatal("flush failed")
	}
	store.mu.Lock()
	wrote = store.c.Labels[labelFinishedAt]
	store.mu.Unlock()
	if want := first.FinishedAt.UTC().Format(time.RFC3339Nano); wrote != want {
		t.Errorf("finished label %q; want %q", wrote, want)
	}
	if again := look(); !again.FinishedAt.Equal(first.FinishedAt) {
		t.Errorf("look after the write: at %v; want %v", again.FinishedAt, first.FinishedAt)
	}
}

// TestStopSignal: an image's stop signal is taken by name, with or
// without SIG, or by number; none, or one not known, is SIGTERM.
func TestStopSignal(t *testing.T) {
	for in, want := range map[string]syscall.Signal{
		"": syscall.SIGTERM, "SIGINT": syscall.SIGINT, "quit": syscall.SIGQUIT, "SIGRTMIN+3": syscall.Signal(37), "RTMAX-1": syscall.Signal(63), "SIGRTMIN-1": syscall.SIGTERM, "RTMIN+40": syscall.SIGTERM, "SIGRTMIN": syscall.Signal(34), "rtmax": syscall.Signal(64), "SIGRTMIN+": syscall.SIGTERM, "SIGRTMAX--1": syscall.SIGTERM,
		"9": syscall.SIGKILL, "SIGUSR1": syscall.SIGUSR1, "NOPE": syscall.SIGTERM, "0": syscall.SIGTERM, "99": syscall.SIGTERM,
	} {
		if got := stopSignal(in); got != want {
			t.Errorf("stopSignal(%q) = %v, want %v", in, got, want)
		}
	}
}
