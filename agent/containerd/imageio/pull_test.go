package imageio

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// fakeStores are Stores of fakes, with a content store in a temp dir.
func fakeStores(t *testing.T) (Stores, *memSnapshots, *memLeases) {
	t.Helper()
	cs, sn, ls := newContentStore(t), newMemSnapshots(), newMemLeases()
	return Stores{Content: cs, Images: newMemImages(), Snapshotter: sn, SnapshotterName: "fake", Applier: digestApplier{cs}, Leases: ls}, sn, ls
}

// TestPullFetchesThePlatformAndUnpacks: Pull records the image as
// resolved, fetches the blobs of the platform's manifest and of no other,
// labels the index for all its manifests (as the client does), unpacks
// the layers with the gc label on the config, and deletes its lease.
func TestPullFetchesThePlatformAndUnpacks(t *testing.T) {
	ctx := context.Background()
	im := newTestImage(t, "amd64", "arm64")
	s, sn, ls := fakeStores(t)
	const ref = "registry.test/busybox:1.35"
	img, err := Pull(ctx, s, ref, memResolver{desc: im.index, blobs: im.blobs}, amd64)
	if err != nil {
		t.Fatal(err)
	}
	if want := (images.Image{Name: ref, Target: im.index}); img.Name != want.Name || !reflect.DeepEqual(img.Target, want.Target) {
		t.Errorf("pulled %+v, want %+v", img, want)
	}
	if got, err := s.Images.Get(ctx, ref); err != nil || !reflect.DeepEqual(got, img) {
		t.Errorf("recorded %+v, %v; want %+v", got, err, img)
	}
	for arch, want := range map[string]bool{"amd64": true, "arm64": false} {
		for _, d := range []ocispec.Descriptor{im.manifests[arch], im.configs[arch], im.layers[arch]} {
			if _, err := s.Content.Info(ctx, d.Digest); (err == nil) != want {
				t.Errorf("%s blob %s (%s): in the store %v, want %v", arch, d.Digest, d.MediaType, err == nil, want)
			}
		}
	}
	diffID := digest.FromBytes(im.layerTars["amd64"])
	chainID := identity.ChainID([]digest.Digest{diffID})
	for blob, want := range map[digest.Digest]map[string]string{
		im.index.Digest: {
			"containerd.io/gc.ref.content.m.0": im.manifests["amd64"].Digest.String(),
			"containerd.io/gc.ref.content.m.1": im.manifests["arm64"].Digest.String(),
		},
		im.manifests["amd64"].Digest: {
			"containerd.io/gc.ref.content.config": im.configs["amd64"].Digest.String(),
			"containerd.io/gc.ref.content.l.0":    im.layers["amd64"].Digest.String(),
		},
		im.configs["amd64"].Digest: {"containerd.io/gc.ref.snapshot.fake": chainID.String()},
		im.layers["amd64"].Digest:  {labels.LabelUncompressed: diffID.String()},
	} {
		got := labelsOf(t, s.Content, blob)
		for k, v := range want {
			if got[k] != v {
				t.Errorf("blob %s: label %s = %q, want %q (labels %v)", blob, k, got[k], v, got)
			}
		}
	}
	if info, err := sn.Stat(ctx, chainID.String()); err != nil || info.Kind.String() != "Committed" {
		t.Errorf("snapshot %s: %+v, %v; want it committed", chainID, info, err)
	}
	if ls.created != 1 || len(ls.live) != 0 {
		t.Errorf("%d leases created, %d left; want 1 created, none left", ls.created, len(ls.live))
	}

	// Pulled again: the image is updated, nothing is unpacked again.
	before := len(sn.snaps)
	if _, err := Pull(ctx, s, ref, memResolver{desc: im.index, blobs: im.blobs}, amd64); err != nil {
		t.Fatalf("second pull: %v", err)
	}
	if len(sn.snaps) != before {
		t.Errorf("second pull: %d snapshots, want %d", len(sn.snaps), before)
	}
}

// TestPullReferrerWithBadDigestIsAnError: a registry's index whose
// referrer entry has a digest too short for its gc label fails the pull,
// where containerd's handler (SetChildrenMappedLabels) panics.
func TestPullReferrerWithBadDigestIsAnError(t *testing.T) {
	ctx := context.Background()
	im := newTestImage(t, "amd64")
	referrer := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: "sha256:00", Size: 2,
		Annotations: map[string]string{images.AnnotationManifestSubject: im.manifests["amd64"].Digest.String()}}
	index := im.add(ocispec.MediaTypeImageIndex, mustJSON(t, ocispec.Index{
		Versioned: specsVersioned(), MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{im.manifests["amd64"], referrer},
	}))
	s, _, ls := fakeStores(t)

	// What the client does with it.
	if err := content.WriteBlob(ctx, s.Content, "index", bytes.NewReader(im.blobs[index.Digest]), index); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("containerd's SetChildrenMappedLabels did not panic on the referrer: this guard may go")
			}
		}()
		images.SetChildrenMappedLabels(s.Content, images.ChildrenHandler(s.Content), nil)(ctx, index)
	}()

	_, err := Pull(ctx, s, "registry.test/x:1", memResolver{desc: index, blobs: im.blobs}, amd64)
	want := fmt.Sprintf(`pull registry.test/x:1: index %s: manifests[1].digest "sha256:00": `, index.Digest)
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("pull: %v; want an error starting %q", err, want)
	}
	if len(ls.live) != 0 {
		t.Errorf("%d leases left, want none", len(ls.live))
	}
}

// TestPullNotFound: a blob the registry does not have fails the pull,
// and no image is recorded.
func TestPullNotFound(t *testing.T) {
	ctx := context.Background()
	im := newTestImage(t, "amd64")
	blobs := memFetcher{}
	for d, p := range im.blobs {
		if d != im.layers["amd64"].Digest {
			blobs[d] = p
		}
	}
	s, _, ls := fakeStores(t)
	_, err := Pull(ctx, s, "registry.test/x:1", memResolver{desc: im.index, blobs: blobs}, amd64)
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), im.layers["amd64"].Digest.String()) {
		t.Errorf("pull: %v; want not found naming the layer", err)
	}
	if all, _ := s.Images.List(ctx); len(all) != 0 {
		t.Errorf("recorded %+v, want nothing", all)
	}
	if len(ls.live) != 0 {
		t.Errorf("%d leases left, want none", len(ls.live))
	}
}

// TestImportUnpacksOnce: Import unpacks each image for the platform with
// the gc label on its config; an Unpack of an image whose snapshot is
// there prepares nothing and sets the label again.
func TestImportUnpacksOnce(t *testing.T) {
	ctx := context.Background()
	im := newTestImage(t, "amd64", "arm64")
	s, sn, ls := fakeStores(t)
	name := "outpost.test/busybox:1.35"
	imgs, err := Import(ctx, s, bytes.NewReader(im.ociLayout(t, map[string]string{images.AnnotationImageName: name})), arm64)
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Name != name {
		t.Fatalf("imported %+v, want %s", imgs, name)
	}
	chainID := identity.ChainID([]digest.Digest{digest.FromBytes(im.layerTars["arm64"])}).String()
	if _, err := sn.Stat(ctx, chainID); err != nil {
		t.Fatalf("arm64 snapshot: %v", err)
	}
	label := "containerd.io/gc.ref.snapshot.fake"
	if got := labelsOf(t, s.Content, im.configs["arm64"].Digest)[label]; got != chainID {
		t.Errorf("config label %s = %q, want %q", label, got, chainID)
	}
	if _, err := s.Content.Update(ctx, content.Info{Digest: im.configs["arm64"].Digest}, "labels."+label); err != nil {
		t.Fatal(err)
	}
	prepares := sn.prepares
	if err := Unpack(ctx, s, imgs[0], arm64); err != nil {
		t.Fatal(err)
	}
	if sn.prepares != prepares {
		t.Errorf("unpack of an unpacked image prepared %d snapshots, want none", sn.prepares-prepares)
	}
	if got := labelsOf(t, s.Content, im.configs["arm64"].Digest)[label]; got != chainID {
		t.Errorf("after unpack: config label %s = %q, want %q", label, got, chainID)
	}
	if ls.created != 2 || len(ls.live) != 0 {
		t.Errorf("%d leases created, %d left; want 2 created, none left", ls.created, len(ls.live))
	}
}

// TestPullFetchesOneManifest: of an index's manifests that match the
// platform (linux/amd64 matches linux/386 too), only the best is fetched
// and unpacked, whatever their order.
func TestPullFetchesOneManifest(t *testing.T) {
	ctx := context.Background()
	im := newTestImage(t, "386", "amd64")
	s, sn, _ := fakeStores(t)
	if _, err := Pull(ctx, s, "registry.test/x:1", memResolver{desc: im.index, blobs: im.blobs}, amd64); err != nil {
		t.Fatal(err)
	}
	for arch, want := range map[string]bool{"amd64": true, "386": false} {
		for _, d := range []ocispec.Descriptor{im.manifests[arch], im.configs[arch], im.layers[arch]} {
			if _, err := s.Content.Info(ctx, d.Digest); (err == nil) != want {
				t.Errorf("%s blob %s (%s): in the store %v, want %v", arch, d.Digest, d.MediaType, err == nil, want)
			}
		}
	}
	if len(sn.snaps) != 1 {
		t.Errorf("snapshots %v, want the amd64 layer's alone", slices.Collect(maps.Keys(sn.snaps)))
	}
}
