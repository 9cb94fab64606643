package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/outpost-edge/outpost/agent/containerd/ctrd"
	"github.com/outpost-edge/outpost/internal/clock"
)

// imageRead is a stand-in for oci.WithImageConfig that counts its reads;
// each waits for gate when there is one, and fails while fail is set.
type imageRead struct {
	mu    sync.Mutex
	reads int
	fail  bool
	gate  chan struct{}
}

func (ir *imageRead) opt(ctx context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	ir.mu.Lock()
	ir.reads++
	fail, gate := ir.fail, ir.gate
	ir.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if fail {
		return errors.New("mount rootfs: no such device")
	}
	s.Process.Env = append(s.Process.Env, "IMAGE=1")
	s.Process.Args = []string{"httpd", "-f"}
	s.Process.Cwd = "/srv"
	s.Process.User = specs.User{UID: 0, GID: 0, AdditionalGids: []uint32{0, 10}}
	return nil
}

func (ir *imageRead) count() int {
	ir.mu.Lock()
	defer ir.mu.Unlock()
	return ir.reads
}

func newSpec() *oci.Spec {
	return &oci.Spec{Process: &specs.Process{Env: []string{"PATH=/bin"}}}
}

func quietRuntime() *Runtime {
	return &Runtime{deps: Deps{Clock: clock.Real{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}}
}

// TestImageConfigReadOnceForItsCreates: the creates of one image under
// way at once read its config and /etc/group once, and each gets a spec
// of its own, equal to what the read made.
func TestImageConfigReadOnceForItsCreates(t *testing.T) {
	r := quietRuntime()
	ir := &imageRead{gate: make(chan struct{})}
	f := &imageFacts{chainID: "sha256:chain"}
	const n = 8
	specsOut := make([]*oci.Spec, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		specsOut[i] = newSpec()
		wg.Go(func() {
			errs[i] = r.withImageConfig(ir.opt, f)(context.Background(), nil, &containers.Container{}, specsOut[i])
		})
	}
	close(ir.gate)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
	}
	if got := ir.count(); got != 1 {
		t.Fatalf("image read %d times for %d creates, want once", got, n)
	}
	want := newSpec()
	ir.gate = nil
	ir.opt(context.Background(), nil, nil, want)
	for i, s := range specsOut {
		if !slices.Equal(s.Process.Env, want.Process.Env) || !slices.Equal(s.Process.Args, want.Process.Args) ||
			s.Process.Cwd != want.Process.Cwd || !slices.Equal(s.Process.User.AdditionalGids, want.Process.User.AdditionalGids) {
			t.Fatalf("create %d: process %+v, want %+v", i, s.Process, want.Process)
		}
	}
	// A create that changes its spec changes no other's, nor the next.
	specsOut[0].Process.User.AdditionalGids[1] = 99
	specsOut[0].Process.Env[0] = "PATH=/changed"
	next := newSpec()
	if err := r.withImageConfig(ir.opt, f)(context.Background(), nil, &containers.Container{}, next); err != nil {
		t.Fatal(err)
	}
	if specsOut[1].Process.User.AdditionalGids[1] != 10 || next.Process.User.AdditionalGids[1] != 10 || next.Process.Env[0] != "PATH=/bin" {
		t.Fatalf("one create's change reached others: %+v, next %+v", specsOut[1].Process, next.Process)
	}
	if got := ir.count(); got != 2 { // the one for want above
		t.Fatalf("image read %d times, want no more after the first create", got-1)
	}
}

// TestImageConfigFailedReadIsNotKept: a create whose read failed fails,
// the creates that waited for it read for themselves, and the next
// create reads again.
func TestImageConfigFailedReadIsNotKept(t *testing.T) {
	r := quietRuntime()
	ir := &imageRead{fail: true, gate: make(chan struct{})}
	f := &imageFacts{chainID: "sha256:chain"}
	lead := make(chan error, 1)
	go func() {
		lead <- r.withImageConfig(ir.opt, f)(context.Background(), nil, &containers.Container{}, newSpec())
	}()
	for ir.count() == 0 { // the first create leads
		runtime.Gosched()
	}
	// One waits for the failing read, and then reads itself (and succeeds).
	waited := make(chan error, 1)
	s := newSpec()
	go func() {
		waited <- r.withImageConfig(ir.opt, f)(context.Background(), nil, &containers.Container{}, s)
	}()
	for joined := false; !joined; runtime.Gosched() {
		r.mu.Lock()
		joined = f.call != nil && f.call.waiters == 1
		r.mu.Unlock()
	}
	ir.mu.Lock()
	ir.fail = false
	ir.mu.Unlock()
	close(ir.gate)
	if err := <-lead; err == nil {
		t.Fatal("the create whose read failed did not fail")
	}
	if err := <-waited; err != nil {
		t.Fatalf("a create that waited for a failed read: %v", err)
	}
	if s.Process.Cwd != "/srv" {
		t.Fatalf("a create that waited for a failed read has process %+v", s.Process)
	}
	before := ir.count()
	next := newSpec()
	if err := r.withImageConfig(ir.opt, f)(context.Background(), nil, &containers.Container{}, next); err != nil {
		t.Fatal(err)
	}
	if ir.count() != before+1 || next.Process.Cwd != "/srv" {
		t.Fatalf("after a failed read the next create did not read again (reads %d → %d)", before, ir.count())
	}
}

// countingLeases is a lease manager that counts creates and deletes and
// keeps the leases that exist.
type countingLeases struct {
	leases.Manager // methods the test does not expect panic
	mu             sync.Mutex
	created        int
	deleted        int
	live           map[string]bool
}

func (m *countingLeases) Create(_ context.Context, opts ...leases.Opt) (leases.Lease, error) {
	var l leases.Lease
	for _, o := range opts {
		if err := o(&l); err != nil {
			return l, err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.created++
	l.ID = fmt.Sprintf("lease-%d", m.created)
	m.live[l.ID] = true
	return l, nil
}

func (m *countingLeases) Delete(_ context.Context, l leases.Lease, _ ...leases.DeleteOpt) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.live[l.ID] {
		return fmt.Errorf("lease %s: not found", l.ID)
	}
	delete(m.live, l.ID)
	m.deleted++
	return nil
}

// TestCreatesUnderWayShareALease: creates under way at once hold one
// lease, deleted when the last is done; a later create makes a new one.
func TestCreatesUnderWayShareALease(t *testing.T) {
	ls := &countingLeases{live: map[string]bool{}}
	r := quietRuntime()
	r.client = &ctrd.Client{Leases: ls}
	var releases []func()
	ids := map[string]bool{}
	for range 5 {
		ctx, release, err := r.withCreateLease(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		id, ok := leases.FromContext(ctx)
		if !ok {
			t.Fatal("a create's context has no lease")
		}
		ids[id] = true
		releases = append(releases, release)
	}
	if len(ids) != 1 || ls.created != 1 {
		t.Fatalf("5 creates under way: leases %v, %d created; want one", ids, ls.created)
	}
	for i, release := range releases {
		release()
		if want := i == len(releases)-1; (ls.deleted == 1) != want {
			t.Fatalf("after %d of 5 creates done: %d leases deleted", i+1, ls.deleted)
		}
	}
	ctx, release, err := r.withCreateLease(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := leases.FromContext(ctx); ids[id] || ls.created != 2 {
		t.Fatalf("a later create has lease %q (created %d), want a new one", id, ls.created)
	}
	release()
	if len(ls.live) != 0 {
		t.Fatalf("leases left: %v", ls.live)
	}
}
