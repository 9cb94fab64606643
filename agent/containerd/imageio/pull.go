package imageio

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/unpack"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Pull resolves, fetches (only the content for platform; nil is this
// machine's), records (images.Store Create, or Update if it exists) and
// unpacks the image named ref (already normalized), as the client's Pull
// with WithPullUnpack and WithPullSnapshotter does: the layers are
// unpacked while they are fetched, and a layer whose snapshot is there is
// not fetched.
func Pull(ctx context.Context, s Stores, ref string, resolver remotes.Resolver, platform platforms.MatchComparer) (images.Image, error) {
	if err := s.check(); err != nil {
		return images.Image{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	if resolver == nil {
		return images.Image{}, fmt.Errorf("pull %s: no resolver", ref)
	}
	ctx, done, err := withLease(ctx, s.Leases)
	if err != nil {
		return images.Image{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	defer done()
	img, err := pull(ctx, s, ref, resolver, orDefault(platform))
	if err != nil {
		return images.Image{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	return img, nil
}

// pull is Pull under a lease: client/pull.go's Pull and fetch.
func pull(ctx context.Context, s Stores, ref string, resolver remotes.Resolver, platform platforms.MatchComparer) (_ images.Image, retErr error) {
	// The unpacker's goroutines end with its Wait, which every return
	// waits for; on an error, cancelling its ctx first ends its fetches
	// and unpacks at once instead of when they are done.
	uctx, cancel := context.WithCancel(ctx)
	defer cancel()
	unpacker, err := unpack.NewUnpacker(uctx, s.Content, unpack.WithUnpackPlatform(unpack.Platform{
		// The client checks no platform support of the snapshotter
		// without WithSnapshotterPlatformCheck.
		Platform:       platforms.All,
		SnapshotterKey: s.SnapshotterName,
		Snapshotter:    s.Snapshotter,
		Applier:        s.Applier,
	}))
	if err != nil {
		return images.Image{}, fmt.Errorf("unpacker: %w", err)
	}
	waited := false
	defer func() {
		if waited {
			return
		}
		if retErr != nil {
			cancel()
		}
		if _, err := unpacker.Wait(); err != nil && retErr == nil {
			retErr = fmt.Errorf("unpack: %w", err)
		}
	}()

	name, desc, err := resolver.Resolve(uctx, ref)
	if err != nil {
		return images.Image{}, fmt.Errorf("resolve: %w", err)
	}
	fetcher, err := resolver.Fetcher(uctx, name)
	if err != nil {
		return images.Image{}, fmt.Errorf("fetcher for %s: %w", name, err)
	}
	if desc.MediaType == images.MediaTypeDockerSchema1Manifest {
		return images.Image{}, fmt.Errorf("media type %s: %w: no longer supported since containerd v2.1", desc.MediaType, errdefs.ErrNotImplemented)
	}

	// Labels on an index for all its manifests, then only the manifest
	// for platform, the best match, is fetched.
	children := images.SetChildrenMappedLabels(s.Content, checkedChildren(s.Content), nil)
	children = images.FilterPlatforms(children, platform)
	children = images.LimitManifests(children, platform, 1)
	// A config of media type application/octet-stream marks a manifest
	// to convert (docker.ConvertManifest); handlers run concurrently.
	var convertible atomic.Bool
	findConvertible := images.HandlerFunc(func(_ context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		if desc.MediaType == docker.LegacyConfigMediaType {
			convertible.Store(true)
		}
		return nil, nil
	})
	distSource, err := docker.AppendDistributionSourceLabel(s.Content, ref)
	if err != nil {
		return images.Image{}, fmt.Errorf("distribution source label: %w", err)
	}
	handler := unpacker.Unpack(images.Handlers(
		remotes.FetchHandler(s.Content, fetcher),
		findConvertible,
		children,
		distSource,
	))
	if err := images.Dispatch(uctx, handler, nil, desc); err != nil {
		return images.Image{}, err
	}
	if convertible.Load() {
		if desc, err = docker.ConvertManifest(uctx, s.Content, desc); err != nil {
			return images.Image{}, fmt.Errorf("convert manifest: %w", err)
		}
	}
	// The unpacker fetches the layers it unpacks: the image is recorded
	// once they are in.
	waited = true
	res, err := unpacker.Wait()
	if err != nil {
		return images.Image{}, fmt.Errorf("unpack: %w", err)
	}

	img, err := createOrUpdate(ctx, s.Images, images.Image{Name: name, Target: desc})
	if err != nil {
		return images.Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	if res.Unpacks == 0 {
		// Nothing was unpacked on the way (a manifest without layers):
		// unpack as Unpack does.
		if err := unpackImage(ctx, s, img, platform); err != nil {
			return images.Image{}, fmt.Errorf("unpack: %w", err)
		}
	}
	return img, nil
}

// createOrUpdate records img, replacing an image of its name (the
// client's createNewImage).
func createOrUpdate(ctx context.Context, is images.Store, img images.Image) (images.Image, error) {
	for {
		created, err := is.Create(ctx, img)
		if err == nil {
			return created, nil
		}
		if !errdefs.IsAlreadyExists(err) {
			return images.Image{}, err
		}
		updated, err := is.Update(ctx, img)
		if err == nil {
			return updated, nil
		}
		// Removed in between: create it again.
		if !errdefs.IsNotFound(err) {
			return images.Image{}, err
		}
	}
}
