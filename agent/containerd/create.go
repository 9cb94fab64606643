package containerd

import (
	"context"
	"slices"
	"time"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// For every container, the v2 client's NewContainer (with WithNewSnapshot
// and oci.WithImageConfig) asks containerd for more than the container's
// snapshot and record: a lease created and deleted around the create (two
// synced writes to containerd's store), the snapshotter's capabilities,
// the image's manifest and config (read once for the snapshot's parent and
// again for the spec), and a read-only mount of the new rootfs to read
// /etc/group for the process's additional groups. After a reboot the 30
// creates come at once, each with all of it. An image's content does not
// change under its digest, so the runtime reads it once per image, and the
// creates under way at one time share a lease.

// imageSpec is what oci.WithImageConfig makes of an image on a new
// spec: the process's environment, arguments, working directory and
// user (with the additional groups from the image's /etc/group).
type imageSpec struct {
	env, args []string
	cwd       string
	user      specs.User
}

// imageSpecOf keeps the image's part of s, just after WithImageConfig.
func imageSpecOf(s *oci.Spec) *imageSpec {
	u := s.Process.User
	u.AdditionalGids = slices.Clone(u.AdditionalGids)
	return &imageSpec{env: slices.Clone(s.Process.Env), args: slices.Clone(s.Process.Args), cwd: s.Process.Cwd, user: u}
}

// apply sets on s what WithImageConfig would.
func (is *imageSpec) apply(s *oci.Spec) {
	if s.Process == nil {
		s.Process = &specs.Process{}
	}
	s.Process.Env = slices.Clone(is.env)
	s.Process.Args = slices.Clone(is.args)
	s.Process.Cwd = is.cwd
	u := is.user
	u.AdditionalGids = slices.Clone(u.AdditionalGids)
	s.Process.User = u
}

// imageFacts is what the runtime read of an image, by its digest: the
// chain ID of its layers, the parent of each container's snapshot, and
// the spec read for its first container.
type imageFacts struct {
	chainID string
	call    *imageSpecCall // the read under way or done; under Runtime.mu
}

// imageSpecCall is one read of an image's spec: done is closed once spec
// is set, or left nil by a read that failed.
type imageSpecCall struct {
	done    chan struct{}
	spec    *imageSpec
	waiters int // creates that joined it, under Runtime.mu
}

// withImageConfig applies read, oci.WithImageConfig of the image, for
// the first container of an image, and copies what it made for the
// others. The first one's rootfs is a fresh snapshot of the image, as
// theirs are, so its /etc/group is the image's. When that read fails,
// the creates that waited for it read the image themselves, and the next
// create leads a new one.
func (r *Runtime) withImageConfig(read oci.SpecOpts, f *imageFacts) oci.SpecOpts {
	return func(ctx context.Context, cl oci.Client, c *containers.Container, s *oci.Spec) error {
		r.mu.Lock()
		call, lead := f.call, false
		if call == nil {
			call, lead = &imageSpecCall{done: make(chan struct{})}, true
			f.call = call
		} else {
			call.waiters++
		}
		r.mu.Unlock()
		if !lead {
			select {
			case <-call.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			if call.spec != nil {
				call.spec.apply(s)
				return nil
			}
			return read(ctx, cl, c, s)
		}
		err := read(ctx, cl, c, s)
		if err == nil {
			call.spec = imageSpecOf(s)
		} else {
			r.mu.Lock()
			if f.call == call {
				f.call = nil
			}
			r.mu.Unlock()
		}
		close(call.done)
		return err
	}
}

// withNewSnapshot prepares the container's snapshot on the image's chain
// ID, read with the image, as the v2 client's WithNewSnapshot does
// without asking the snapshotter's capabilities (outpost maps no user
// namespaces).
func (r *Runtime) withNewSnapshot(id string, img images.Image, f *imageFacts) func(context.Context, *containers.Container) ([]mount.Mount, error) {
	return func(ctx context.Context, c *containers.Container) ([]mount.Mount, error) {
		mounts, err := r.client.SnapshotService(c.Snapshotter).Prepare(ctx, id, f.chainID)
		if err != nil {
			return nil, err
		}
		c.SnapshotKey = id
		c.Image = img.Name
		return mounts, nil
	}
}

// createLeaseExpiry is the expiry the client gives the lease of a create,
// for containerd to drop it if the agent dies before it does.
const createLeaseExpiry = 24 * time.Hour

// withCreateLease returns ctx with the lease that keeps a new snapshot
// from containerd's garbage collector until the container that uses it
// is recorded, and the release of it. The creates under way at one time
// share one lease; the last to finish deletes it.
func (r *Runtime) withCreateLease(ctx context.Context) (context.Context, func(), error) {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	if r.leaseUsers == 0 {
		l, err := r.client.Leases.Create(ctx, leases.WithRandomID(), leases.WithExpiration(createLeaseExpiry))
		if err != nil {
			return ctx, nil, err
		}
		r.lease = l
	}
	r.leaseUsers++
	l := r.lease
	return leases.WithLease(ctx, l.ID), func() {
		r.leaseMu.Lock()
		defer r.leaseMu.Unlock()
		if r.leaseUsers--; r.leaseUsers > 0 {
			return
		}
		// Not with the create's context, which may be cancelled; an
		// undeleted lease expires.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := r.client.Leases.Delete(dctx, l); err != nil {
			r.deps.Log.Debug("delete create lease", "lease", l.ID, "err", err)
		}
	}, nil
}
