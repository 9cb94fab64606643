package imageio

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// newContentStore returns a content store in a temp dir of t's, with
// labels kept in memory.
func newContentStore(t testing.TB) content.Store {
	t.Helper()
	return newEmptiableStore(t, t.TempDir()).Store
}

// emptiableStore is a content store in a directory, with labels kept in
// memory, that can be emptied: a new local store leaks a file descriptor
// (containerd's fsverity.IsSupported, on a file system without
// fs-verity), which a fuzz target cannot afford per input.
type emptiableStore struct {
	content.Store
	labels *memLabels
}

func newEmptiableStore(t testing.TB, dir string) emptiableStore {
	t.Helper()
	labels := &memLabels{m: map[digest.Digest]map[string]string{}}
	cs, err := local.NewLabeledStore(dir, labels)
	if err != nil {
		t.Fatal(err)
	}
	return emptiableStore{cs, labels}
}

// empty deletes every blob, ingest and label of the store.
func (s emptiableStore) empty(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	var blobs []digest.Digest
	if err := s.Walk(ctx, func(info content.Info) error {
		blobs = append(blobs, info.Digest)
		return nil
	}); err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	for _, d := range blobs {
		if err := s.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	ingests, err := s.ListStatuses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range ingests {
		if err := s.Abort(ctx, st.Ref); err != nil {
			t.Fatal(err)
		}
	}
	s.labels.mu.Lock()
	clear(s.labels.m)
	s.labels.mu.Unlock()
}

// memLabels is a local.LabelStore in memory.
type memLabels struct {
	mu sync.Mutex
	m  map[digest.Digest]map[string]string
}

func (s *memLabels) Get(d digest.Digest) (map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.m[d]), nil
}

func (s *memLabels) Set(d digest.Digest, labels map[string]string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[d] = maps.Clone(labels)
	return nil
}

func (s *memLabels) Update(d digest.Digest, update map[string]string) (map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.m[d]
	if l == nil {
		l = map[string]string{}
	}
	for k, v := range update {
		if v == "" {
			delete(l, k)
		} else {
			l[k] = v
		}
	}
	s.m[d] = l
	return maps.Clone(l), nil
}

// memImages is an images.Store in memory.
type memImages struct {
	mu sync.Mutex
	m  map[string]images.Image
}

func newMemImages() *memImages { return &memImages{m: map[string]images.Image{}} }

func (s *memImages) Get(_ context.Context, name string) (images.Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.m[name]
	if !ok {
		return images.Image{}, fmt.Errorf("image %q: %w", name, errdefs.ErrNotFound)
	}
	return img, nil
}

func (s *memImages) List(context.Context, ...string) ([]images.Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Values(s.m)), nil
}

func (s *memImages) Create(_ context.Context, img images.Image) (images.Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if img.Name == "" {
		return images.Image{}, fmt.Errorf("image name must not be empty: %w", errdefs.ErrInvalidArgument)
	}
	if _, ok := s.m[img.Name]; ok {
		return images.Image{}, fmt.Errorf("image %q: %w", img.Name, errdefs.ErrAlreadyExists)
	}
	s.m[img.Name] = img
	return img, nil
}

func (s *memImages) Update(_ context.Context, img images.Image, fieldpaths ...string) (images.Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.m[img.Name]
	if !ok {
		return images.Image{}, fmt.Errorf("image %q: %w", img.Name, errdefs.ErrNotFound)
	}
	if len(fieldpaths) == 0 {
		s.m[img.Name] = img
		return img, nil
	}
	for _, f := range fieldpaths {
		switch f {
		case "target":
			old.Target = img.Target
		case "labels":
			old.Labels = img.Labels
		default:
			return images.Image{}, fmt.Errorf("field %q: %w", f, errdefs.ErrNotImplemented)
		}
	}
	s.m[img.Name] = old
	return old, nil
}

func (s *memImages) Delete(_ context.Context, name string, _ ...images.DeleteOpt) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[name]; !ok {
		return fmt.Errorf("image %q: %w", name, errdefs.ErrNotFound)
	}
	delete(s.m, name)
	return nil
}

// memLeases is a leases.Manager that keeps the leases' IDs, and counts
// what it was asked.
type memLeases struct {
	leases.Manager // methods the tests do not expect panic
	mu             sync.Mutex
	live           map[string]bool
	created        int
}

func newMemLeases() *memLeases { return &memLeases{live: map[string]bool{}} }

func (m *memLeases) Create(_ context.Context, opts ...leases.Opt) (leases.Lease, error) {
	var l leases.Lease
	for _, o := range opts {
		if err := o(&l); err != nil {
			return leases.Lease{}, err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.live[l.ID] = true
	m.created++
	return l, nil
}

func (m *memLeases) Delete(ctx context.Context, l leases.Lease, _ ...leases.DeleteOpt) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.live, l.ID)
	return nil
}

// noSnapshots is a snapshotter with no snapshot that prepares none.
type noSnapshots struct {
	snapshots.Snapshotter // methods the tests do not expect panic
}

var errNoSnapshots = errors.New("fake snapshotter: no snapshots")

func (noSnapshots) Stat(_ context.Context, key string) (snapshots.Info, error) {
	return snapshots.Info{}, fmt.Errorf("snapshot %s: %w", key, errdefs.ErrNotFound)
}

func (noSnapshots) Prepare(context.Context, string, string, ...snapshots.Opt) ([]mount.Mount, error) {
	return nil, errNoSnapshots
}

// noApplier is a diff.Applier the tests do not expect to be called.
type noApplier struct{}

func (noApplier) Apply(context.Context, ocispec.Descriptor, []mount.Mount, ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	return ocispec.Descriptor{}, errors.New("fake applier: not expected")
}

// memFetcher serves blobs from memory by digest, as a registry would.
type memFetcher map[digest.Digest][]byte

func (f memFetcher) Fetch(_ context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	p, ok := f[desc.Digest]
	if !ok {
		return nil, fmt.Errorf("blob %s: %w", desc.Digest, errdefs.ErrNotFound)
	}
	return io.NopCloser(bytes.NewReader(p)), nil
}

// memSnapshots is a snapshotter that keeps which snapshots there are and
// their parents, with nothing in them, and counts the prepares.
type memSnapshots struct {
	snapshots.Snapshotter // methods the tests do not expect panic
	mu                    sync.Mutex
	snaps                 map[string]snapshots.Info
	prepares              int
}

func newMemSnapshots() *memSnapshots { return &memSnapshots{snaps: map[string]snapshots.Info{}} }

func (s *memSnapshots) Stat(_ context.Context, key string) (snapshots.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	info, ok := s.snaps[key]
	if !ok {
		return snapshots.Info{}, fmt.Errorf("snapshot %s: %w", key, errdefs.ErrNotFound)
	}
	return info, nil
}

func (s *memSnapshots) Prepare(_ context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prepares++
	// As containerd's metadata snapshotter: a snapshot to be committed
	// as the name of one there already exists.
	var info snapshots.Info
	for _, o := range opts {
		if err := o(&info); err != nil {
			return nil, err
		}
	}
	if ref := info.Labels["containerd.io/snapshot.ref"]; ref != "" {
		if _, ok := s.snaps[ref]; ok {
			return nil, fmt.Errorf("snapshot %s: %w", ref, errdefs.ErrAlreadyExists)
		}
	}
	if _, ok := s.snaps[key]; ok {
		return nil, fmt.Errorf("snapshot %s: %w", key, errdefs.ErrAlreadyExists)
	}
	if p, ok := s.snaps[parent]; parent != "" && (!ok || p.Kind != snapshots.KindCommitted) {
		return nil, fmt.Errorf("parent snapshot %s: %w", parent, errdefs.ErrNotFound)
	}
	s.snaps[key] = snapshots.Info{Kind: snapshots.KindActive, Name: key, Parent: parent}
	return []mount.Mount{{Type: "fake", Source: key}}, nil
}

func (s *memSnapshots) Commit(_ context.Context, name, key string, _ ...snapshots.Opt) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	active, ok := s.snaps[key]
	if !ok || active.Kind != snapshots.KindActive {
		return fmt.Errorf("active snapshot %s: %w", key, errdefs.ErrNotFound)
	}
	if _, ok := s.snaps[name]; ok {
		return fmt.Errorf("snapshot %s: %w", name, errdefs.ErrAlreadyExists)
	}
	delete(s.snaps, key)
	s.snaps[name] = snapshots.Info{Kind: snapshots.KindCommitted, Name: name, Parent: active.Parent}
	return nil
}

func (s *memSnapshots) Remove(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.snaps[key]; !ok {
		return fmt.Errorf("snapshot %s: %w", key, errdefs.ErrNotFound)
	}
	delete(s.snaps, key)
	return nil
}

// digestApplier "applies" a layer by computing its diff ID: the digest
// of its uncompressed content, read from cs.
type digestApplier struct{ cs content.Provider }

func (a digestApplier) Apply(ctx context.Context, desc ocispec.Descriptor, _ []mount.Mount, _ ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	ra, err := a.cs.ReaderAt(ctx, desc)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer ra.Close()
	var r io.Reader = content.NewReader(ra)
	if strings.HasSuffix(desc.MediaType, "gzip") {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return ocispec.Descriptor{}, err
		}
		r = zr
	}
	d := digest.Canonical.Digester()
	n, err := io.Copy(d.Hash(), r)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: d.Digest(), Size: n}, nil
}

// memResolver resolves any reference to one descriptor and fetches from
// memory.
type memResolver struct {
	remotes.Resolver // methods the tests do not expect panic
	desc             ocispec.Descriptor
	blobs            memFetcher
}

func (r memResolver) Resolve(_ context.Context, ref string) (string, ocispec.Descriptor, error) {
	return ref, r.desc, nil
}

func (r memResolver) Fetcher(context.Context, string) (remotes.Fetcher, error) { return r.blobs, nil }

// tmpfsDir returns a new directory on /dev/shm, removed in t's cleanup, or
// else in t's temp dir: the local content store syncs its timestamp files
// as it writes, ten times slower on a disk.
func tmpfsDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "imageio-test-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
