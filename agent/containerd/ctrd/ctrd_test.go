package ctrd_test

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/image-spec/identity"

	"github.com/outpost-edge/outpost/agent/containerd/ctrd"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// syncBuffer is a bytes.Buffer safe for the IO copy and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startContainerd starts a containerd for t, which -short skips: under
// qemu (make test-arm) the test binary's platform is not the daemon's.
func startContainerd(t *testing.T) *env.Containerd {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: not starting containerd")
	}
	env.RequireRoot(t)
	return env.StartContainerd(t)
}

// TestContainerTaskAndProcess drives a real containerd through the
// client: a container on a snapshot of the test image, its task with its
// output, an exec'd process with its own, the task's exit as an event and
// as a wait, and the container's removal with its snapshot. The stores
// read what containerd's own client reads.
func TestContainerTaskAndProcess(t *testing.T) {
	cd := startContainerd(t)
	const ns = "ctrd-test"
	v2 := cd.Client(t, ns)
	img := cd.ImportTestImage(t, ns)
	ctx := namespaces.WithNamespace(context.Background(), ns)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()

	cl, err := ctrd.New(cd.Address, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if v, err := cl.Version(ctx); err != nil || v != cd.Version {
		t.Fatalf("version %q, %v; want %q", v, err, cd.Version)
	}

	// The stores see what the v2 client's see.
	rec, err := cl.Images.Get(ctx, img.Name())
	if err != nil || rec.Target.Digest != img.Target().Digest {
		t.Fatalf("image %s: %+v, %v; want target %s", img.Name(), rec, err, img.Target().Digest)
	}
	var ours, theirs []string
	walk := func(cs content.Store, into *[]string) {
		if err := cs.Walk(ctx, func(i content.Info) error { *into = append(*into, i.Digest.String()); return nil }); err != nil {
			t.Fatal(err)
		}
		slices.Sort(*into)
	}
	walk(cl.Content, &ours)
	walk(v2.ContentStore(), &theirs)
	if len(ours) == 0 || !slices.Equal(ours, theirs) {
		t.Fatalf("content: %v; the v2 client's: %v", ours, theirs)
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	chainID := identity.ChainID(diffIDs).String()
	sn := cl.SnapshotService("overlayfs")
	if _, err := sn.Stat(ctx, chainID); err != nil {
		t.Fatalf("stat the image's snapshot %s: %v", chainID, err)
	}

	// A container under a lease, as the agent creates one.
	l, err := cl.Leases.Create(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	lctx := leases.WithLease(ctx, l.ID)
	const id = "c1"
	if _, err := sn.Prepare(lctx, id, chainID); err != nil {
		t.Fatal(err)
	}
	info := containers.Container{
		ID: id, Labels: map[string]string{"app": "ctrd", "keep": "1"}, Snapshotter: "overlayfs", SnapshotKey: id,
		Image: img.Name(), Runtime: containers.RuntimeInfo{Name: defaults.DefaultRuntime},
	}
	spec, err := oci.GenerateSpec(lctx, cl, &info, oci.WithProcessArgs("/bin/sh", "-c", "echo out; read line; echo got $line; exit 3"),
		oci.WithHostNamespace("network"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.CreateContainer(lctx, info, spec); err != nil {
		t.Fatal(err)
	}
	if err := cl.Leases.Delete(ctx, l); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.CreateContainer(ctx, info, spec); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second create: %v, want already exists", err)
	}
	c, err := cl.LoadContainer(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Spec()
	if err != nil || strings.Join(got.Process.Args, " ") != strings.Join(spec.Process.Args, " ") {
		t.Fatalf("spec read back: %+v, %v", got, err)
	}
	all, err := c.SetLabels(ctx, map[string]string{"app": "changed", "new": "x"})
	if err != nil || all["app"] != "changed" || all["new"] != "x" || all["keep"] != "1" {
		t.Fatalf("labels after SetLabels: %v, %v", all, err)
	}
	if cs, err := cl.ListContainers(ctx, `labels."new"==x`); err != nil || len(cs) != 1 || cs[0].ID() != id {
		t.Fatalf("list by label: %v, %v", cs, err)
	}
	if cs, err := cl.ListContainers(ctx, `labels."new"==y`); err != nil || len(cs) != 0 {
		t.Fatalf("list by another label: %v, %v", cs, err)
	}
	if _, err := c.Task(ctx, nil); !errdefs.IsNotFound(err) {
		t.Fatalf("task before NewTask: %v, want not found", err)
	}

	evctx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	envs, errs := cl.Subscribe(evctx, `topic=="/tasks/exit"`)

	pr, pw := io.Pipe()
	out := &syncBuffer{}
	task, err := c.NewTask(ctx, cio.NewCreator(cio.WithStreams(pr, out, out), cio.WithFIFODir(t.TempDir())), ctrd.TaskOpts{})
	if err != nil {
		t.Fatal(err)
	}
	exited, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := task.Status(ctx); err != nil || st != tasktypes.Status_RUNNING {
		t.Fatalf("status %v, %v; want running", st, err)
	}

	// An exec'd process with output of its own, and its exit code.
	execOut := &syncBuffer{}
	pspec := *spec.Process
	pspec.Args = []string{"/bin/sh", "-c", "echo exec; exit 7"}
	p, err := task.Exec(ctx, "e1", &pspec, cio.NewCreator(cio.WithStreams(nil, execOut, execOut), cio.WithFIFODir(t.TempDir())))
	if err != nil {
		t.Fatal(err)
	}
	pexit, _ := p.Wait(ctx)
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if st := <-pexit; st.Err != nil || st.Code != 7 {
		t.Fatalf("exec exit %+v, want 7", st)
	}
	p.IO().Wait()
	if _, err := p.Delete(ctx, true); err != nil {
		t.Fatal(err)
	}
	if execOut.String() != "exec\n" {
		t.Fatalf("exec output %q", execOut.String())
	}

	// The task reads a line from its stdin and exits 3.
	pw.Write([]byte("line\n"))
	pw.Close()
	select {
	case st := <-exited:
		if st.Err != nil || st.Code != 3 {
			t.Fatalf("task exit %+v, want 3", st)
		}
	case <-ctx.Done():
		t.Fatal("task did not exit")
	}
	// The exec'd process's exit comes first, then the task's.
	for _, want := range []struct {
		id   string
		code uint32
	}{{"e1", 7}, {id, 3}} {
		select {
		case e := <-envs:
			v, err := typeurl.UnmarshalAny(e.Event)
			if ex, ok := v.(*eventstypes.TaskExit); err != nil || !ok || ex.ContainerID != id || ex.ID != want.id || ex.ExitStatus != want.code {
				t.Fatalf("event %v: %+v, %v; want %s's exit %d", e.Topic, v, err, want.id, want.code)
			}
		case err := <-errs:
			t.Fatalf("events: %v", err)
		case <-ctx.Done():
			t.Fatal("no exit event")
		}
	}
	if err := c.Delete(ctx); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete of a container with a task: %v, want failed precondition", err)
	}
	st, err := task.Delete(ctx, false)
	if err != nil || st.Code != 3 {
		t.Fatalf("delete task: %+v, %v; want exit 3", st, err)
	}
	if o := out.String(); o != "out\ngot line\n" {
		t.Fatalf("task output %q", o)
	}
	if err := c.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Stat(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("snapshot after the container's delete: %v, want not found", err)
	}
	if _, err := cl.LoadContainer(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("load after delete: %v, want not found", err)
	}
}

// TestKillAndDelete: a running task deleted with kill is killed, waited
// for and deleted; Kill of a signal reaches the process.
func TestKillAndDelete(t *testing.T) {
	cd := startContainerd(t)
	const ns = "ctrd-test"
	img := cd.ImportTestImage(t, ns)
	ctx := namespaces.WithNamespace(context.Background(), ns)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cl, err := ctrd.New(cd.Address, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sn := cl.SnapshotService("overlayfs")
	start := func(id string, args ...string) (*ctrd.Container, *ctrd.Task) {
		t.Helper()
		// Under a lease until the container holds its snapshot, as the
		// agent creates one: containerd's collector, which the image
		// import's end may set off, takes a snapshot nothing refers to.
		l, err := cl.Leases.Create(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Leases.Delete(ctx, l)
		lctx := leases.WithLease(ctx, l.ID)
		if _, err := sn.Prepare(lctx, id, identity.ChainID(diffIDs).String()); err != nil {
			t.Fatal(err)
		}
		info := containers.Container{ID: id, Snapshotter: "overlayfs", SnapshotKey: id, Runtime: containers.RuntimeInfo{Name: defaults.DefaultRuntime}}
		spec, err := oci.GenerateSpec(lctx, cl, &info, oci.WithProcessArgs(args...), oci.WithHostNamespace("network"))
		if err != nil {
			t.Fatal(err)
		}
		c, err := cl.CreateContainer(lctx, info, spec)
		if err != nil {
			t.Fatal(err)
		}
		task, err := c.NewTask(ctx, cio.NullIO, ctrd.TaskOpts{})
		if err != nil {
			t.Fatal(err)
		}
		if err := task.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return c, task
	}

	c1, t1 := start("k1", "/bin/sleep", "1000")
	if _, err := t1.Delete(ctx, false); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete of a running task: %v, want failed precondition", err)
	}
	if _, err := t1.Delete(ctx, true); err != nil {
		t.Fatalf("delete with kill: %v", err)
	}
	if _, err := c1.Task(ctx, nil); !errdefs.IsNotFound(err) {
		t.Fatalf("task after delete: %v", err)
	}

	_, t2 := start("k2", "/bin/sh", "-c", "trap 'exit 5' TERM; while true; do sleep 0.1; done")
	exited, _ := t2.Wait(ctx)
	// The shell is the container's init, which ignores SIGTERM until its
	// trap is set: signal until it exits.
	var st ctrd.ExitStatus
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
signal:
	for {
		if err := t2.Kill(ctx, syscall.SIGTERM, false); err != nil && !errdefs.IsNotFound(err) {
			t.Fatal(err) // not found: it has just exited
		}
		select {
		case st = <-exited:
			break signal
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("no exit after SIGTERM")
		}
	}
	if st.Code != 5 {
		t.Fatalf("exit after SIGTERM: %+v, want 5 (the trap's)", st)
	}
	if _, err := t2.Delete(ctx, false); err != nil {
		t.Fatal(err)
	}
}
