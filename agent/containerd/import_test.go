package containerd

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"

	"github.com/outpost-edge/outpost/agent/containerd/ctrd"
)

// memImages is an image store in memory: List ignores filters.
type memImages struct {
	mu   sync.Mutex
	imgs map[string]images.Image
}

func (m *memImages) Get(_ context.Context, name string) (images.Image, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	img, ok := m.imgs[name]
	if !ok {
		return images.Image{}, errdefs.ErrNotFound
	}
	return img, nil
}

func (m *memImages) List(context.Context, ...string) ([]images.Image, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []images.Image
	for _, img := range m.imgs {
		out = append(out, img)
	}
	return out, nil
}

func (m *memImages) Create(_ context.Context, img images.Image) (images.Image, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.imgs[img.Name]; ok {
		return images.Image{}, errdefs.ErrAlreadyExists
	}
	m.imgs[img.Name] = img
	return img, nil
}

func (m *memImages) Update(_ context.Context, img images.Image, _ ...string) (images.Image, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.imgs[img.Name]; !ok {
		return images.Image{}, errdefs.ErrNotFound
	}
	m.imgs[img.Name] = img
	return img, nil
}

func (m *memImages) Delete(_ context.Context, name string, _ ...images.DeleteOpt) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.imgs, name)
	return nil
}

// TestImportedOnlyWhenAllImagesAreAsImported: a tarball's version counts
// as imported while every image its import brought is there, with the
// target the import gave it.
func TestImportedOnlyWhenAllImagesAreAsImported(t *testing.T) {
	store := &memImages{imgs: map[string]images.Image{}}
	r := quietRuntime()
	r.client = &ctrd.Client{Images: store}
	ctx := context.Background()
	add := func(name, file, version string, n int, target digest.Digest) {
		img := images.Image{Name: name}
		img.Target.Digest = target
		if file != "" {
			img.Labels = map[string]string{labelTarball: file, labelTarballImport: tarballImport(version, n, target)}
		}
		store.imgs[name] = img
	}
	d1, d2 := digest.FromString("one"), digest.FromString("two")
	add("example.com/a:1", "x.tar", "10@1", 2, d1)
	add("example.com/b:1", "x.tar", "10@1", 2, d2)
	add("example.com/c:1", "", "", 0, d1)

	names, ok := r.Imported(ctx, "x.tar", "10@1")
	slices.Sort(names)
	if !ok || !slices.Equal(names, []string{"example.com/a:1", "example.com/b:1"}) {
		t.Fatalf("Imported(x.tar) = %q, %v; want a and b, true", names, ok)
	}
	for _, tt := range []struct {
		what          string
		file, version string
		change        func()
	}{
		{what: "another version", file: "x.tar", version: "11@1"},
		{what: "a tarball never imported", file: "y.tar", version: "10@1"},
		{what: "an image retargeted since", file: "x.tar", version: "10@1", change: func() {
			img := store.imgs["example.com/b:1"]
			img.Target.Digest = d1
			store.imgs[img.Name] = img
		}},
		{what: "an image removed since", file: "x.tar", version: "10@1", change: func() { delete(store.imgs, "example.com/b:1") }},
	} {
		if tt.change != nil {
			tt.change()
		}
		if names, ok := r.Imported(ctx, tt.file, tt.version); ok {
			t.Errorf("%s: Imported(%s, %s) = %q, true; want false", tt.what, tt.file, tt.version, names)
		}
	}
}
