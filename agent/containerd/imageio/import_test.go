package imageio

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

var (
	amd64 = platforms.Only(ocispec.Platform{OS: "linux", Architecture: "amd64"})
	arm64 = platforms.Only(ocispec.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"})
)

// TestLoadOCILayout: an OCI layout's named index is recorded with its
// index.json entry as its target, and the gc labels lead from it to the
// blobs of the platform's manifest, and to no other platform's.
func TestLoadOCILayout(t *testing.T) {
	ctx := context.Background()
	im := newTestImage(t, "amd64", "arm64")
	name := "outpost.test/busybox:1.35"
	annotations := map[string]string{images.AnnotationImageName: name, ocispec.AnnotationRefName: "1.35"}
	cs, is := newContentStore(t), newMemImages()
	imgs, err := load(ctx, cs, is, bytes.NewReader(im.ociLayout(t, annotations)), amd64)
	if err != nil {
		t.Fatal(err)
	}
	target := im.index
	target.Annotations = annotations
	want := []images.Image{{Name: name, Target: target}}
	if !reflect.DeepEqual(imgs, want) {
		t.Fatalf("loaded %+v, want %+v", imgs, want)
	}
	if got, _ := is.Get(ctx, name); !reflect.DeepEqual(got, want[0]) {
		t.Errorf("recorded %+v, want %+v", got, want[0])
	}

	// From index.json down to the amd64 layer.
	var indexJSON digest.Digest
	cs.Walk(ctx, func(info content.Info) error {
		if info.Labels["containerd.io/gc.ref.content.0"] == im.index.Digest.String() {
			indexJSON = info.Digest
		}
		return nil
	})
	if indexJSON == "" {
		t.Fatal("no blob (index.json) labelled containerd.io/gc.ref.content.0 = the index")
	}
	for _, c := range []struct {
		blob digest.Digest
		want map[string]string
	}{
		{im.index.Digest, map[string]string{"containerd.io/gc.ref.content.m.0": im.manifests["amd64"].Digest.String()}},
		{im.manifests["amd64"].Digest, map[string]string{
			"containerd.io/gc.ref.content.config": im.configs["amd64"].Digest.String(),
			"containerd.io/gc.ref.content.l.0":    im.layers["amd64"].Digest.String(),
		}},
		{im.manifests["arm64"].Digest, nil},
		{im.configs["amd64"].Digest, nil},
	} {
		if got := labelsOf(t, cs, c.blob); !equalLabels(got, c.want) {
			t.Errorf("labels of %s: %v, want %v", c.blob, got, c.want)
		}
	}

	// Loaded again: the image is updated in place.
	if _, err := load(ctx, cs, is, bytes.NewReader(im.ociLayout(t, annotations)), amd64); err != nil {
		t.Fatalf("second load: %v", err)
	}
	if all, _ := is.List(ctx); len(all) != 1 {
		t.Errorf("after a second load: %d images, want 1", len(all))
	}
}

func equalLabels(a, b map[string]string) bool {
	return len(a) == 0 && len(b) == 0 || reflect.DeepEqual(a, b)
}

// TestLoadNames: names come from io.containerd.image.name, else
// org.opencontainers.image.ref.name, normalized; an entry with neither is
// not recorded.
func TestLoadNames(t *testing.T) {
	im := newTestImage(t, "amd64")
	for _, tt := range []struct {
		annotations map[string]string
		want        string // "" for none
	}{
		{map[string]string{images.AnnotationImageName: "docker.io/library/busybox:1"}, "docker.io/library/busybox:1"},
		{map[string]string{images.AnnotationImageName: "busybox:1", ocispec.AnnotationRefName: "1"}, "docker.io/library/busybox:1"},
		{map[string]string{ocispec.AnnotationRefName: "registry.test/app:2"}, "registry.test/app:2"},
		{map[string]string{ocispec.AnnotationRefName: "app"}, "docker.io/library/app:latest"},
		{nil, ""},
	} {
		t.Run(fmt.Sprint(tt.annotations), func(t *testing.T) {
			imgs, err := load(context.Background(), newContentStore(t), newMemImages(), bytes.NewReader(im.ociLayout(t, tt.annotations)), amd64)
			if err != nil {
				t.Fatal(err)
			}
			var got string
			if len(imgs) > 0 {
				got = imgs[0].Name
			}
			if len(imgs) > 1 || got != tt.want {
				t.Errorf("loaded %+v, want the one image %q", imgs, tt.want)
			}
		})
	}
}

// TestLoadDockerArchive: a docker-archive gets a docker manifest per
// image with the platform of its config, an image per tag named by the
// normalized tag, and the annotations containerd's importer gives.
func TestLoadDockerArchive(t *testing.T) {
	ctx := context.Background()
	im := newTestImage(t, "arm64")
	cs, is := newContentStore(t), newMemImages()
	imgs, err := load(ctx, cs, is, bytes.NewReader(im.dockerArchive(t, "arm64", "busybox:1", "registry.test/a/b:2")), arm64)
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 2 || imgs[0].Name != "docker.io/library/busybox:1" || imgs[1].Name != "registry.test/a/b:2" {
		t.Fatalf("loaded %+v, want docker.io/library/busybox:1 and registry.test/a/b:2", imgs)
	}
	for i, ref := range []string{"1", "2"} {
		want := map[string]string{images.AnnotationImageName: imgs[i].Name, ocispec.AnnotationRefName: ref}
		if !reflect.DeepEqual(imgs[i].Target.Annotations, want) {
			t.Errorf("%s: annotations %v, want %v", imgs[i].Name, imgs[i].Target.Annotations, want)
		}
		if p := imgs[i].Target.Platform; p == nil || p.Architecture != "arm64" || p.OS != "linux" {
			t.Errorf("%s: platform %v, want linux/arm64", imgs[i].Name, p)
		}
	}
	target := imgs[0].Target
	if target.MediaType != images.MediaTypeDockerSchema2Manifest || target.Digest != imgs[1].Target.Digest {
		t.Errorf("targets %+v and %+v, want one docker manifest", target, imgs[1].Target)
	}
	p, err := content.ReadBlob(ctx, cs, target)
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(p, &m); err != nil {
		t.Fatal(err)
	}
	layerTar := im.layerTars["arm64"]
	wantLayer := ocispec.Descriptor{MediaType: images.MediaTypeDockerSchema2Layer, Digest: digest.FromBytes(layerTar), Size: int64(len(layerTar))}
	if m.Config.MediaType != images.MediaTypeDockerSchema2Config || m.Config.Digest != im.configs["arm64"].Digest ||
		len(m.Layers) != 1 || !reflect.DeepEqual(m.Layers[0], wantLayer) {
		t.Errorf("manifest %s, want config %s and layer %+v", p, im.configs["arm64"].Digest, wantLayer)
	}
	if l := labelsOf(t, cs, target.Digest); l["containerd.io/gc.ref.content.l.0"] != wantLayer.Digest.String() {
		t.Errorf("manifest labels %v: no gc label for the layer", l)
	}
	spec, chainID, err := Config(ctx, cs, imgs[0], arm64)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Architecture != "arm64" || chainID != identity.ChainID([]digest.Digest{digest.FromBytes(layerTar)}) {
		t.Errorf("config: %s, chain ID %s", spec.Architecture, chainID)
	}
}

// TestLoadDockerArchiveLayerKinds: a gzip layer file is a gzip layer; a
// symlink to a layer file (docker save's for a layer two images share)
// is that layer; an uncompressed layer whose gzip form is in the store
// (labelled containerd.io/uncompressed, as an unpack leaves it) is
// replaced by the gzip blob, as containerd's importer does.
func TestLoadDockerArchiveLayerKinds(t *testing.T) {
	ctx := context.Background()
	im := newTestImage(t, "amd64")
	layerTar, gz := im.layerTars["amd64"], im.blobs[im.layers["amd64"].Digest]
	config := tarEntry{name: "config.json", data: im.blobs[im.configs["amd64"].Digest]}
	manifest := func(layers ...string) tarEntry {
		return tarEntry{name: "manifest.json", data: mustJSON(t, []dockerManifest{{Config: "config.json", RepoTags: []string{"x:1"}, Layers: layers}})}
	}
	gzipLayer := ocispec.Descriptor{MediaType: images.MediaTypeDockerSchema2LayerGzip, Digest: digest.FromBytes(gz), Size: int64(len(gz))}
	plainLayer := ocispec.Descriptor{MediaType: images.MediaTypeDockerSchema2Layer, Digest: digest.FromBytes(layerTar), Size: int64(len(layerTar))}
	for _, tt := range []struct {
		name       string
		archive    []byte
		compressed bool // the gzip form in the store beforehand
		want       []ocispec.Descriptor
	}{
		{"gzip", tarball(t, config, tarEntry{name: "l/layer.tar", data: gz}, manifest("l/layer.tar")), false, []ocispec.Descriptor{gzipLayer}},
		{"symlink", tarball(t, config, tarEntry{name: "a/layer.tar", data: layerTar}, tarEntry{name: "b/layer.tar", link: "../a/layer.tar"}, manifest("a/layer.tar", "b/layer.tar")),
			false, []ocispec.Descriptor{plainLayer, plainLayer}},
		{"compressed in the store", tarball(t, config, tarEntry{name: "l/layer.tar", data: layerTar}, manifest("l/layer.tar")), true, []ocispec.Descriptor{gzipLayer}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cs := newContentStore(t)
			if tt.compressed {
				err := content.WriteBlob(ctx, cs, "gz", bytes.NewReader(gz), gzipLayer, content.WithLabels(map[string]string{labels.LabelUncompressed: plainLayer.Digest.String()}))
				if err != nil {
					t.Fatal(err)
				}
			}
			imgs, err := load(ctx, cs, newMemImages(), bytes.NewReader(tt.archive), amd64)
			if err != nil {
				t.Fatal(err)
			}
			m, err := images.Manifest(ctx, cs, imgs[0].Target, amd64)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(m.Layers, tt.want) {
				t.Errorf("layers %+v, want %+v", m.Layers, tt.want)
			}
		})
	}
}

// TestLoadMalformed: each fault of an archive is an error that names the
// file or field at fault.
func TestLoadMalformed(t *testing.T) {
	im := newTestImage(t, "amd64")
	layout := tarEntry{name: "oci-layout", data: []byte(`{"imageLayoutVersion":"1.0.0"}`)}
	index := func(descs ...ocispec.Descriptor) tarEntry {
		return tarEntry{name: "index.json", data: mustJSON(t, ocispec.Index{Versioned: specsVersioned(), Manifests: descs})}
	}
	blob := func(d ocispec.Descriptor) tarEntry {
		return tarEntry{name: "blobs/sha256/" + d.Digest.Encoded(), data: im.blobs[d.Digest]}
	}
	config := tarEntry{name: "config.json", data: im.blobs[im.configs["amd64"].Digest]}
	layer := tarEntry{name: "l/layer.tar", data: im.layerTars["amd64"]}
	docker := func(m string) tarEntry { return tarEntry{name: "manifest.json", data: []byte(m)} }
	badManifest := im.add(ocispec.MediaTypeImageManifest, mustJSON(t, ocispec.Manifest{
		Versioned: specsVersioned(), Config: im.configs["amd64"], Layers: []ocispec.Descriptor{{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: "sha256:00", Size: 1}},
	}))
	whole := tarball(t, layout, index(im.index), blob(im.index), blob(im.manifests["amd64"]))
	for _, tt := range []struct {
		name    string
		archive []byte
		want    string
	}{
		{"not a tar", []byte("this is not a tarball, not at all, and it goes on for a while to be more than a block long" + strings.Repeat(".", 512)), "read tar: "},
		{"truncated", whole[:len(whole)-1024-200], "blobs/sha256/" + im.manifests["amd64"].Digest.Encoded() + ": "},
		{"empty", tarball(t), "neither an OCI layout (oci-layout) nor a docker archive (manifest.json)"},
		{"layout version", tarball(t, tarEntry{name: "oci-layout", data: []byte(`{"imageLayoutVersion":"2.0.0"}`)}, index()), `oci-layout: imageLayoutVersion "2.0.0": want "1.0.0"`},
		{"layout not JSON", tarball(t, tarEntry{name: "oci-layout", data: []byte(`{`)}), "oci-layout: unexpected EOF"},
		{"no index.json", tarball(t, layout), "index.json: not in the OCI layout"},
		{"index.json not JSON", tarball(t, layout, tarEntry{name: "index.json", data: []byte("[")}), "index.json: unexpected end of JSON input"},
		{"index.json empty", tarball(t, layout, index()), "index.json: no image for the platform"},
		{"index.json digest", tarball(t, layout, index(ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: "sha256:zz", Size: 2})),
			`index.json: manifests[0].digest "sha256:zz": `},
		{"referrer digest", tarball(t, layout, index(ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: "x", Size: 2,
			Annotations: map[string]string{images.AnnotationManifestSubject: "sha256:" + hex64}})),
			`index.json: manifests[0].digest "x": `},
		{"index.json name", tarball(t, layout, index(ocispec.Descriptor{MediaType: ocispec.MediaTypeImageIndex, Digest: im.index.Digest, Size: im.index.Size,
			Annotations: map[string]string{images.AnnotationImageName: "Bad Name"}})),
			`index.json: manifests[0].annotations: image reference "Bad Name": repository name must be lowercase`},
		{"blob missing", tarball(t, layout, index(im.index)), "index " + im.index.Digest.String() + ": "},
		{"layer digest", tarball(t, layout, index(badManifest), blob(badManifest)), "manifest " + badManifest.Digest.String() + `: layers[0].digest "sha256:00": `},
		{"manifest.json not JSON", tarball(t, docker("{")), "manifest.json: unexpected EOF"},
		{"manifest.json empty", tarball(t, docker("[]")), "manifest.json: no image for the platform"},
		{"Config missing", tarball(t, docker(`[{"Config":"c.json"}]`)), `manifest.json: [0].Config "c.json": not in the archive`},
		{"Config not JSON", tarball(t, tarEntry{name: "c.json", data: []byte("x")}, docker(`[{"Config":"c.json"}]`)), `manifest.json: [0].Config "c.json": platform: `},
		{"Layers missing", tarball(t, config, docker(`[{"Config":"config.json","Layers":["l/layer.tar","m/layer.tar"]}]`), layer), `manifest.json: [0].Layers[1] "m/layer.tar": not in the archive`},
		{"RepoTags", tarball(t, config, layer, docker(`[{"Config":"config.json","RepoTags":["ok:1","Not OK"],"Layers":["l/layer.tar"]}]`)),
			`manifest.json: [0].RepoTags[1]: image reference "Not OK": repository name must be lowercase`},
		{"symlink dangling", tarball(t, config, tarEntry{name: "a/layer.tar", link: "../b/layer.tar"}, docker(`[{"Config":"config.json","Layers":["a/layer.tar"]}]`)),
			"symlink a/layer.tar: no file b/layer.tar"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			imgs, err := load(context.Background(), newContentStore(t), newMemImages(), bytes.NewReader(tt.archive), amd64)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("load: %v, %v; want an error with %q", imgs, err, tt.want)
			}
		})
	}
}

// TestLoadRefusesSparseFiles: a file of an archive that reads as a
// terabyte from a few kilobytes of sparse file is refused, not written
// to the content store (as containerd's importer would).
func TestLoadRefusesSparseFiles(t *testing.T) {
	const size int64 = 1 << 40
	name := "blobs/sha256/" + hex64
	archive := sparseTar(name, size)
	h, err := tar.NewReader(bytes.NewReader(archive)).Next()
	if err != nil || h.Size != size || h.Typeflag != tar.TypeReg {
		t.Fatalf("the sparse tarball of %d bytes reads as %+v, %v; want a regular file of %d bytes", len(archive), h, err, size)
	}
	cs := newContentStore(t)
	_, err = load(context.Background(), cs, newMemImages(), bytes.NewReader(archive), amd64)
	if want := name + ": a sparse file (PAX record GNU.sparse."; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("load: %v; want an error with %q", err, want)
	}
	if st, _ := cs.ListStatuses(context.Background()); len(st) != 0 {
		t.Errorf("ingests %+v, want none", st)
	}
}

// TestUnpackNamesAMismatchedConfig: a config with a diff ID per layer
// fewer than its manifest's layers is an error naming the config.
func TestUnpackNamesAMismatchedConfig(t *testing.T) {
	ctx := context.Background()
	im := newTestImage(t, "amd64")
	config := im.add(ocispec.MediaTypeImageConfig, mustJSON(t, ocispec.Image{Platform: ocispec.Platform{Architecture: "amd64", OS: "linux"}}))
	manifest := im.add(ocispec.MediaTypeImageManifest, mustJSON(t, ocispec.Manifest{
		Versioned: specsVersioned(), Config: config, Layers: []ocispec.Descriptor{im.layers["amd64"]},
	}))
	manifest.Annotations = map[string]string{images.AnnotationImageName: "x.test/mismatch:1"}
	layout := tarball(t, tarEntry{name: "oci-layout", data: []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		tarEntry{name: "index.json", data: mustJSON(t, ocispec.Index{Versioned: specsVersioned(), Manifests: []ocispec.Descriptor{manifest}})},
		tarEntry{name: "m", data: im.blobs[manifest.Digest]}, tarEntry{name: "c", data: im.blobs[config.Digest]})
	s := Stores{Content: newContentStore(t), Images: newMemImages(), Snapshotter: noSnapshots{}, SnapshotterName: "fake", Applier: noApplier{}, Leases: newMemLeases()}
	_, err := Import(ctx, s, bytes.NewReader(layout), amd64)
	want := "import: unpack x.test/mismatch:1: config " + config.Digest.String() + ": rootfs.diff_ids: 0 for the 1 layers of the manifest"
	if err == nil || err.Error() != want {
		t.Errorf("import: %v; want %q", err, want)
	}
}

// TestImportDeletesItsLease: Import's lease is gone when it returns, also
// when it fails and when its ctx was cancelled; a ctx with a lease has
// none made.
func TestImportDeletesItsLease(t *testing.T) {
	im := newTestImage(t, "amd64")
	archive := im.ociLayout(t, map[string]string{images.AnnotationImageName: "x.test/a:1"})
	for _, tt := range []struct {
		name   string
		cancel bool
	}{{"returns", false}, {"cancelled", true}} {
		t.Run(tt.name, func(t *testing.T) {
			ls := newMemLeases()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var sn snapshots.Snapshotter = noSnapshots{}
			if tt.cancel {
				// ctx is cancelled as the unpack starts: the import
				// fails, then deletes its lease.
				sn = cancelOnPrepare{cancel: cancel}
			}
			s := Stores{Content: newContentStore(t), Images: newMemImages(), Snapshotter: sn, SnapshotterName: "fake", Applier: noApplier{}, Leases: ls}
			_, err := Import(ctx, s, bytes.NewReader(archive), amd64)
			if !errors.Is(err, errNoSnapshots) && !errors.Is(err, context.Canceled) {
				t.Errorf("import: %v; want the fake snapshotter's error or ctx's", err)
			}
			if ls.created != 1 || len(ls.live) != 0 {
				t.Errorf("%d leases created, %d left; want 1 created, none left", ls.created, len(ls.live))
			}
		})
	}
	ls := newMemLeases()
	s := Stores{Content: newContentStore(t), Images: newMemImages(), Snapshotter: noSnapshots{}, SnapshotterName: "fake", Applier: noApplier{}, Leases: ls}
	Import(leases.WithLease(context.Background(), "caller's"), s, bytes.NewReader(archive), amd64)
	if ls.created != 0 {
		t.Errorf("%d leases created under the caller's; want none", ls.created)
	}
}

// cancelOnPrepare is noSnapshots that cancels a ctx when asked to
// prepare a snapshot.
type cancelOnPrepare struct {
	noSnapshots
	cancel context.CancelFunc
}

func (c cancelOnPrepare) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	c.cancel()
	return c.noSnapshots.Prepare(ctx, key, parent, opts...)
}

// FuzzImport loads any archive into a local content store (on a tmpfs
// when there is one, emptied after each input) and an in-memory image store, then reads each image's
// config and unpacks it as far as the first snapshot: never a panic,
// whatever the input, and every error says where.
func FuzzImport(f *testing.F) {
	im := newTestImage(f, "amd64", "arm64")
	f.Add(im.ociLayout(f, map[string]string{images.AnnotationImageName: "outpost.test/a:1"}))
	f.Add(im.dockerArchive(f, "amd64", "busybox:1"))
	f.Add(tarball(f, tarEntry{name: "config.json", data: im.blobs[im.configs["amd64"].Digest]},
		tarEntry{name: "a/layer.tar", data: im.layerTars["amd64"]}, tarEntry{name: "b/layer.tar", link: "../a/layer.tar"},
		tarEntry{name: "manifest.json", data: []byte(`[{"Config":"config.json","RepoTags":["x:1"],"Layers":["a/layer.tar","b/layer.tar"]}]`)}))
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(im.ociLayout(f, nil))
	zw.Close()
	f.Add(gz.Bytes())
	cs := newEmptiableStore(f, tmpfsDir(f))
	f.Fuzz(func(t *testing.T, archive []byte) {
		ctx := context.Background()
		defer cs.empty(t)
		imgs, err := load(ctx, cs, newMemImages(), bytes.NewReader(archive), amd64)
		if err != nil {
			if !strings.Contains(err.Error(), ": ") && !strings.HasPrefix(err.Error(), "neither") {
				t.Errorf("load: %q: an error without context", err)
			}
			return
		}
		s := Stores{Content: cs, Snapshotter: noSnapshots{}, SnapshotterName: "fake", Applier: noApplier{}}
		for _, img := range imgs {
			Config(ctx, cs, img, amd64)
			unpackImage(ctx, s, img, amd64)
		}
	})
}
