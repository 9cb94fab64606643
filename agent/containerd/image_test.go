package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/agent/containerd/ctrd"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/waittest"
)

// noImages is an image store with no image, counting its lookups.
type noImages struct {
	images.Store // methods the test does not expect panic
	mu           sync.Mutex
	gets         int
}

func (s *noImages) Get(_ context.Context, name string) (images.Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gets++
	return images.Image{}, fmt.Errorf("image %q: %w", name, errdefs.ErrNotFound)
}

// TestEnsureImageSharesALookupUnderWay: callers that ask for an image
// while a lookup of it is under way take its result and do not ask
// containerd; when that lookup was cancelled with its caller's pod, they
// look for themselves.
func TestEnsureImageSharesALookupUnderWay(t *testing.T) {
	store := &noImages{}
	cl := &ctrd.Client{Images: store}
	r := &Runtime{
		cfg:    Config{Namespace: "test"},
		deps:   Deps{Clock: clock.Real{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		client: cl, images: map[string]cachedImage{},
	}
	const ref = "docker.io/library/busybox:1.36"
	key := string(corev1.PullNever) + " " + ref
	ensureAll := func(n int) []error {
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				img, err := r.EnsureImage(context.Background(), ref, corev1.PullNever)
				if err == nil && img.Pulled {
					err = errors.New("reported as pulled for this caller")
				}
				errs[i] = err
			})
		}
		return func() []error { wg.Wait(); return errs }()
	}

	// finish ends a lookup as its caller does, once n callers joined it.
	finish := func(l *imageLookup, n int) {
		waittest.Poll{Timeout: 10 * time.Second, Every: time.Millisecond}.For(t, "callers joining the lookup", func() (bool, string) {
			r.mu.Lock()
			defer r.mu.Unlock()
			return l.waiters == n, fmt.Sprintf("%d joined", l.waiters)
		})
		r.mu.Lock()
		delete(r.looking, key)
		r.mu.Unlock()
		close(l.done)
	}

	// A lookup under way that succeeds.
	l := &imageLookup{done: make(chan struct{}), info: agent.Image{Ref: ref, ID: ref + "@sha256:00", Pulled: true}}
	r.looking = map[string]*imageLookup{key: l}
	var errs []error
	done := make(chan struct{})
	go func() { errs = ensureAll(5); close(done) }()
	finish(l, 5)
	<-done
	for i, err := range errs {
		if err != nil {
			t.Errorf("caller %d: %v", i, err)
		}
	}
	if store.gets != 0 {
		t.Errorf("%d lookups in containerd while one was under way; want 0", store.gets)
	}

	// A lookup under way whose caller went away.
	l = &imageLookup{done: make(chan struct{}), err: fmt.Errorf("image %s: %w", ref, context.Canceled)}
	r.looking = map[string]*imageLookup{key: l}
	done = make(chan struct{})
	go func() { errs = ensureAll(3); close(done) }()
	finish(l, 3)
	<-done
	for i, err := range errs {
		if !errors.Is(err, agent.ErrImageNeverPull) {
			t.Errorf("caller %d: %v; want its own lookup's error", i, err)
		}
	}
	if store.gets == 0 {
		t.Error("no caller looked for itself after the shared lookup was cancelled")
	}
}
