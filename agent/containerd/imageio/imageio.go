// Package imageio is what the agent does with images in containerd —
// pull, import a tarball, unpack, read the config — over containerd's
// service interfaces instead of its Go client, which links packages
// (go-cmp, distribution/reference, pkg/protobuf) whose init-time
// allocations a 512 MB board pays for. It follows the client of
// containerd v2.2.9 (client/pull.go, client/import.go, client/image.go,
// core/images/archive), parts of which it copies (Apache-2.0).
//
// Every function that writes to containerd's stores does so under a lease
// it creates and deletes when it returns (as the client's WithLease), so
// that containerd's garbage collector removes nothing under way and, once
// the lease is gone, keeps exactly what an image reaches through its gc
// labels: the gc.ref.content labels on index and manifest blobs, and the
// gc.ref.snapshot label on the config. A ctx that already carries a lease
// (leases.WithLease) is used as is, as the client does.
package imageio

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/containerd/v2/pkg/rootfs"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Stores are the containerd services the image functions use; ctx passed
// to every function carries the containerd namespace (pkg/namespaces).
type Stores struct {
	Content         content.Store
	Images          images.Store
	Snapshotter     snapshots.Snapshotter
	SnapshotterName string // e.g. "overlayfs", for the gc label
	Applier         diff.Applier
	Leases          leases.Manager
}

// leaseExpiration is how long a lease outlives a call that could not
// delete it: the client's default.
const leaseExpiration = 24 * time.Hour

// withLease returns ctx with a new lease and a func that deletes it, as
// the client's WithLease does; a ctx with a lease is returned as is. The
// delete does not heed ctx's cancellation, so that a cancelled call does
// not leave its content held for leaseExpiration.
func withLease(ctx context.Context, lm leases.Manager) (context.Context, func(), error) {
	if _, ok := leases.FromContext(ctx); ok {
		return ctx, func() {}, nil
	}
	l, err := lm.Create(ctx, leases.WithRandomID(), leases.WithExpiration(leaseExpiration))
	if err != nil {
		return ctx, nil, fmt.Errorf("create lease: %w", err)
	}
	return leases.WithLease(ctx, l.ID), func() {
		// A failed delete is left to the lease's expiration, which
		// releases what it holds then: the call's own result stands.
		_ = lm.Delete(context.WithoutCancel(ctx), l)
	}, nil
}

// orDefault returns platform, or this machine's platform when nil (the
// client's default).
func orDefault(platform platforms.MatchComparer) platforms.MatchComparer {
	if platform == nil {
		return platforms.Default()
	}
	return platform
}

// Config returns img's OCI config for platform and the chain ID of its
// layers (identity.ChainID of RootFS.DiffIDs). A nil platform is this
// machine's.
func Config(ctx context.Context, cs content.Provider, img images.Image, platform platforms.MatchComparer) (ocispec.Image, digest.Digest, error) {
	desc, err := images.Config(ctx, cs, img.Target, orDefault(platform))
	if err != nil {
		return ocispec.Image{}, "", fmt.Errorf("image %s: config: %w", img.Name, err)
	}
	var spec ocispec.Image
	if err := readJSON(ctx, cs, desc, &spec); err != nil {
		return ocispec.Image{}, "", fmt.Errorf("image %s: config %s: %w", img.Name, desc.Digest, err)
	}
	return spec, identity.ChainID(spec.RootFS.DiffIDs), nil
}

// readJSON reads the blob desc names and decodes it into v.
func readJSON(ctx context.Context, cs content.Provider, desc ocispec.Descriptor, v any) error {
	p, err := content.ReadBlob(ctx, cs, desc)
	if err != nil {
		return err
	}
	return json.Unmarshal(p, v)
}

// Unpack unpacks img's layers for platform into the snapshotter, as the
// client's image Unpack does (rootfs.ApplyLayerWithOpts per layer, then
// the containerd.io/gc.ref.snapshot.<snapshotter> label on the config
// blob), unless its chain ID's snapshot is already there; the label is
// set either way, as the client sets it. A nil platform is this
// machine's.
func Unpack(ctx context.Context, s Stores, img images.Image, platform platforms.MatchComparer) error {
	if err := s.check(); err != nil {
		return fmt.Errorf("unpack %s: %w", img.Name, err)
	}
	ctx, done, err := withLease(ctx, s.Leases)
	if err != nil {
		return fmt.Errorf("unpack %s: %w", img.Name, err)
	}
	defer done()
	if err := unpackImage(ctx, s, img, orDefault(platform)); err != nil {
		return fmt.Errorf("unpack %s: %w", img.Name, err)
	}
	return nil
}

// unpackImage is Unpack under a lease: client/image.go's Unpack and
// getLayers, with the snapshot's presence checked once up front.
func unpackImage(ctx context.Context, s Stores, img images.Image, platform platforms.MatchComparer) error {
	cs := s.Content
	manifest, err := images.Manifest(ctx, cs, img.Target, platform)
	if err != nil {
		return err
	}
	var config struct {
		RootFS ocispec.RootFS `json:"rootfs"`
	}
	if err := readJSON(ctx, cs, manifest.Config, &config); err != nil {
		return fmt.Errorf("config %s: %w", manifest.Config.Digest, err)
	}
	diffIDs := config.RootFS.DiffIDs
	// The manifest's image layers, without an artifact's other blobs.
	var blobs []ocispec.Descriptor
	for _, l := range manifest.Layers {
		if images.IsLayerType(l.MediaType) {
			blobs = append(blobs, l)
		}
	}
	if len(diffIDs) != len(blobs) {
		return fmt.Errorf("config %s: rootfs.diff_ids: %d for the %d layers of the manifest", manifest.Config.Digest, len(diffIDs), len(blobs))
	}
	for i, d := range diffIDs {
		if err := d.Validate(); err != nil {
			return fmt.Errorf("config %s: rootfs.diff_ids[%d] %q: %w", manifest.Config.Digest, i, d, err)
		}
	}
	chainID := identity.ChainID(diffIDs)
	present := false
	if len(diffIDs) > 0 {
		_, err := s.Snapshotter.Stat(ctx, chainID.String())
		if err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("snapshot %s: %w", chainID, err)
		}
		present = err == nil
	}
	if !present {
		var chain []digest.Digest
		for i, blob := range blobs {
			layer := rootfs.Layer{
				// The client's TODO too: the media type is not derived
				// from the blob's compression.
				Diff: ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: diffIDs[i]},
				Blob: blob,
			}
			unpacked, err := rootfs.ApplyLayerWithOpts(ctx, layer, chain, s.Snapshotter, s.Applier, nil, nil)
			if err != nil {
				return fmt.Errorf("layer %s: %w", blob.Digest, err)
			}
			if unpacked {
				// The uncompressed digest is verified by the apply.
				info := content.Info{Digest: blob.Digest, Labels: map[string]string{labels.LabelUncompressed: diffIDs[i].String()}}
				if _, err := cs.Update(ctx, info, "labels."+labels.LabelUncompressed); err != nil {
					return fmt.Errorf("layer %s: label: %w", blob.Digest, err)
				}
			}
			chain = append(chain, diffIDs[i])
		}
	}
	return setSnapshotLabel(ctx, cs, manifest.Config.Digest, s.SnapshotterName, chainID)
}

// setSnapshotLabel puts the gc label on the config blob that keeps the
// image's snapshot (its chain ID's) from containerd's garbage collector.
func setSnapshotLabel(ctx context.Context, cs content.Manager, config digest.Digest, snapshotter string, chainID digest.Digest) error {
	key := "containerd.io/gc.ref.snapshot." + snapshotter
	info := content.Info{Digest: config, Labels: map[string]string{key: chainID.String()}}
	if _, err := cs.Update(ctx, info, "labels."+key); err != nil {
		return fmt.Errorf("config %s: label %s: %w", config, key, err)
	}
	return nil
}

// check reports a Stores field the functions need that is unset.
func (s Stores) check() error {
	var missing []string
	for _, f := range []struct {
		name  string
		unset bool
	}{
		{"Content", s.Content == nil}, {"Images", s.Images == nil}, {"Snapshotter", s.Snapshotter == nil},
		{"SnapshotterName", s.SnapshotterName == ""}, {"Applier", s.Applier == nil}, {"Leases", s.Leases == nil},
	} {
		if f.unset {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("stores: %s unset", strings.Join(missing, ", "))
	}
	return nil
}
