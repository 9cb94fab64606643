// Package containerd is the agent's Runtime over containerd, through its
// own client of containerd's API (ctrd, imageio), in one containerd namespace (default
// "outpost"). Tested against containerd 1.6 (Debian 12) and 2.3; 1.7
// serves the same API. Container output is copied from the shim's FIFOs
// into CRI-format log files; after an agent restart the copy is re-attached
// to the running tasks' FIFOs.
package containerd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/api/services/tasks/v1"
	apitask "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/agent/containerd/ctrd"
	"github.com/outpost-edge/outpost/agent/containerd/imageio"
	"github.com/outpost-edge/outpost/agent/crilog"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/outpoll"
)

// Labels the adapter keeps on a container once its task has ended; the
// task itself is deleted at once, so no shim lingers for a dead container.
const (
	labelExitCode   = "io.outpost.container.exit-code"
	labelFinishedAt = "io.outpost.container.finished"
	labelReason     = "io.outpost.container.reason"
)

// Labels the adapter puts on a container at create for Start, which must
// give the task FIFOs to match its spec: a terminal (the spec's
// process.terminal) and a stdin. Their value is "true" when set.
const (
	labelTTY       = "io.outpost.container.tty"
	labelStdin     = "io.outpost.container.stdin"
	labelStdinOnce = "io.outpost.container.stdin-once"
)

// labelStopSignal is the image's stop signal (its config's StopSignal,
// docker's STOPSIGNAL), which Stop sends instead of SIGTERM, as CRI's
// containerd does; the label is the one containerd's client gives it.
const labelStopSignal = "io.containerd.image.config.stop-signal"

// Config says which containerd to use and where container I/O goes.
type Config struct {
	Address     string
	Namespace   string
	Snapshotter string // default overlayfs
	// FIFODir holds the FIFOs between shims and the agent; on tmpfs, so
	// it survives an agent restart and not a reboot (default
	// /run/outpost/fifo).
	FIFODir string
	// ShimGroups is how many shims the pods share (see shimGroup).
	ShimGroups int
	// ShimStart is the runtime binary containerd runs to start a task's
	// shim (cmd/containerd-shim-outpost-v2, an absolute path); empty
	// leaves it to the container's runtime, containerd-shim-runc-v2.
	ShimStart string
	// OCIRuntime is the OCI runtime the runc shim runs for the tasks
	// (crun, or its path); empty is runc.
	OCIRuntime string
	// SpecVersion, if not empty, is the ociVersion the containers'
	// specs declare: the runtime-spec version OCIRuntime implements, as
	// its --version says, where the client's own may be one it refuses.
	SpecVersion string
	// AgentVersion is the agent's version, part of SpareKey: another
	// build may make its containers differently.
	AgentVersion string
	Log          crilog.Options
}

// Deps are the adapter's collaborators.
type Deps struct {
	Clock clock.Clock
	Log   *slog.Logger
}

// Runtime implements agent.Runtime over containerd.
type Runtime struct {
	cfg    Config
	deps   Deps
	client *ctrd.Client
	// poll copies every running container's output FIFOs to its log.
	poll *outpoll.Poller

	mu       sync.Mutex
	attached map[string]bool // containers whose output is being copied
	// stdin holds the writing end of the stdin FIFO of each running
	// container with stdin, by ID, for an attach to write to; it is
	// closed and dropped when the task ends.
	stdin map[string]io.WriteCloser
	// outputs are the output streams of each running container, by ID,
	// for an attach to join; done is closed when the task's IO ends.
	outputs map[string]*output
	oom     map[string]bool // containers the kernel OOM-killed
	// created holds each container this runtime created and has not
	// started yet, as the create left it, for its Start (see fresh).
	created map[string]fresh
	// images caches resolved, unpacked images by normalized reference, so
	// starting many containers of one image (a reboot) reads its config
	// from the content store once.
	images map[string]cachedImage
	// primed is the listing Prime took, for each pod's first List.
	primed *primedList
	// looking holds the image lookups under way, by reference and pull
	// policy: the pods that start at once after a reboot wait for the
	// first one's instead of each asking containerd the same.
	looking map[string]*imageLookup
	// groups serialises task creation and deletion per shim group (see
	// lockGroup).
	groups map[string]*sync.Mutex
	// lease is the lease the creates under way share, leaseUsers how
	// many (see withCreateLease).
	leaseMu    sync.Mutex
	lease      leases.Lease
	leaseUsers int
	// unwritten holds the labels not yet written to their containers
	// (see writeLull); toWrite wakes their writer.
	unwritten  map[string]map[string]string
	toWrite    chan struct{}
	stopWriter context.CancelFunc
	writerDone chan struct{}
	// boot is when the system booted, for processStart.
	bootOnce sync.Once
	boot     time.Time
	bootOK   bool
}

// fresh is a container as Create recorded it: the record containerd
// returned and the mounts of its snapshot (or, for a container never
// started that Prime's listing found, its record with no mounts, which
// the start reads). Its Start needs nothing else,
// where a container of an earlier agent is read from containerd again
// (its record, its snapshot's mounts, and a task it may have left):
// after a power cut that is four calls fewer for each of 30 containers,
// while containerd is busiest.
type fresh struct {
	c      *ctrd.Container
	rootfs []mount.Mount
}

// noteCreated keeps c, listed with no task and never started, for its
// Start, as Create keeps what it made; the mounts of its snapshot are
// the Start's to read.
func (r *Runtime) noteCreated(c *ctrd.Container) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.created[c.ID()]; !ok {
		r.created[c.ID()] = fresh{c: c.WithoutSpec()}
	}
}

// takeCreated returns and forgets what Create left of container id.
func (r *Runtime) takeCreated(id string) (fresh, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.created[id]
	delete(r.created, id)
	return f, ok
}

type cachedImage struct {
	info  agent.Image
	img   images.Image
	facts *imageFacts
}

// imageLookup is one EnsureImage under way; done is closed once info and
// err hold its result.
type imageLookup struct {
	done    chan struct{}
	info    agent.Image
	err     error
	waiters int // callers that joined it, under Runtime.mu
}

func (r *Runtime) cached(name string) (cachedImage, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.images[name]
	return c, ok
}

func (r *Runtime) forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.images, name)
}

var _ agent.Runtime = (*Runtime)(nil)

// New connects to containerd. It fails if containerd does not answer
// within ctx.
func New(ctx context.Context, cfg Config, deps Deps) (*Runtime, error) {
	if cfg.Namespace == "" {
		cfg.Namespace = "outpost"
	}
	if cfg.Snapshotter == "" {
		cfg.Snapshotter = "overlayfs"
	}
	if cfg.FIFODir == "" {
		cfg.FIFODir = "/run/outpost/fifo"
	}
	if err := os.MkdirAll(cfg.FIFODir, 0o700); err != nil {
		return nil, fmt.Errorf("containerd: fifo dir: %w", err)
	}
	cl, err := ctrd.New(cfg.Address, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("containerd %s: %w", cfg.Address, err)
	}
	poll, err := outpoll.New()
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("containerd: %w", err)
	}
	r := &Runtime{
		cfg: cfg, deps: deps, client: cl, poll: poll, attached: map[string]bool{}, stdin: map[string]io.WriteCloser{}, outputs: map[string]*output{},
		oom: map[string]bool{}, images: map[string]cachedImage{}, created: map[string]fresh{},
		unwritten: map[string]map[string]string{}, toWrite: make(chan struct{}, 1), writerDone: make(chan struct{}),
	}
	wctx, stop := context.WithCancel(context.Background())
	r.stopWriter = stop
	go r.writeLabels(wctx)
	if _, err := r.Version(ctx); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Close stops copying the containers' output and closes the connection;
// running containers are not touched, and an agent started after copies
// their output again from their FIFOs.
func (r *Runtime) Close() error {
	if r.stopWriter != nil {
		r.stopWriter()
		<-r.writerDone
	}
	r.poll.Close()
	return r.client.Close()
}

func (r *Runtime) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, r.cfg.Namespace)
}

// Version returns "containerd://<version>".
func (r *Runtime) Version(ctx context.Context) (string, error) {
	v, err := r.client.Version(r.ctx(ctx))
	if err != nil {
		return "", fmt.Errorf("containerd %s: version: %w", r.cfg.Address, err)
	}
	return "containerd://" + v, nil
}

// NormalizeRef returns the fully qualified form of an image reference
// (busybox → docker.io/library/busybox:latest).
func NormalizeRef(ref string) (string, error) {
	return imageio.Normalize(ref)
}

// stores are the containerd services imageio works with.
func (r *Runtime) stores() imageio.Stores {
	return imageio.Stores{
		Content: r.client.Content, Images: r.client.Images,
		Snapshotter: r.client.SnapshotService(r.cfg.Snapshotter), SnapshotterName: r.cfg.Snapshotter,
		Applier: r.client.Diff, Leases: r.client.Leases,
	}
}

// platform is the one platform whose images the agent pulls, unpacks
// and runs: this machine's.
var platform = platforms.Default()

// ociImage is an image as oci.WithImageConfig reads it.
type ociImage struct {
	cs  content.Store
	img images.Image
}

func (i ociImage) Config(ctx context.Context) (ocispec.Descriptor, error) {
	return i.img.Config(ctx, i.cs, platform)
}

func (i ociImage) ContentStore() content.Store { return i.cs }

// EnsureImage makes ref present per policy, unpacked for the snapshotter.
// Callers that ask for the same image with the same policy while a lookup
// is under way share its result; the first caller's ctx bounds it.
func (r *Runtime) EnsureImage(ctx context.Context, ref string, policy corev1.PullPolicy) (agent.Image, error) {
	ctx = r.ctx(ctx)
	name, err := NormalizeRef(ref)
	if err != nil {
		return agent.Image{}, err
	}
	if c, ok := r.cached(name); ok && policy != corev1.PullAlways {
		return c.info, nil
	}
	key := string(policy) + " " + name
	r.mu.Lock()
	for r.looking[key] != nil {
		l := r.looking[key]
		l.waiters++
		r.mu.Unlock()
		select {
		case <-l.done:
		case <-ctx.Done():
			return agent.Image{}, fmt.Errorf("image %s: %w", name, ctx.Err())
		}
		// The first caller's pod may have gone while its lookup ran; then
		// this caller looks for itself.
		if !errors.Is(l.err, context.Canceled) && !errors.Is(l.err, context.DeadlineExceeded) {
			info := l.info
			info.Pulled = false // fetched for another pod, present for this one
			return info, l.err
		}
		r.mu.Lock()
	}
	if r.looking == nil {
		r.looking = map[string]*imageLookup{}
	}
	l := &imageLookup{done: make(chan struct{})}
	r.looking[key] = l
	r.mu.Unlock()
	l.info, l.err = r.ensureImage(ctx, name, policy)
	r.mu.Lock()
	delete(r.looking, key)
	r.mu.Unlock()
	close(l.done)
	return l.info, l.err
}

// ensureImage is EnsureImage's lookup, and pull when the policy asks.
func (r *Runtime) ensureImage(ctx context.Context, name string, policy corev1.PullPolicy) (agent.Image, error) {
	img, err := r.client.Images.Get(ctx, name)
	present, fetched := err == nil, false
	if err != nil && !errdefs.IsNotFound(err) {
		return agent.Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	switch {
	case policy == corev1.PullNever && !present:
		return agent.Image{}, fmt.Errorf("image %s: %w", name, agent.ErrImageNeverPull)
	case !present || policy == corev1.PullAlways:
		pulled, perr := imageio.Pull(ctx, r.stores(), name, pullResolver(), platform)
		if perr != nil {
			if present {
				// Offline with a present image: run what we have.
				r.deps.Log.Warn("image pull failed; using the present image", "image", name, "err", perr)
				break
			}
			return agent.Image{}, fmt.Errorf("pull %s: %w: %v", name, agent.ErrImagePull, perr)
		}
		img, fetched = pulled, true
	}
	spec, chain, err := imageio.Config(ctx, r.client.Content, img, platform)
	if err != nil {
		return agent.Image{}, fmt.Errorf("image %s config: %w", name, err)
	}
	// The snapshot of the image's layers, the parent of its containers'.
	chainID := chain.String()
	if _, err := r.client.SnapshotService(r.cfg.Snapshotter).Stat(ctx, chainID); err != nil {
		if err := imageio.Unpack(ctx, r.stores(), img, platform); err != nil {
			return agent.Image{}, fmt.Errorf("unpack %s: %w", name, err)
		}
	}
	info := agent.Image{
		Ref: name, ID: img.Name + "@" + img.Target.Digest.String(),
		Entrypoint: spec.Config.Entrypoint, Cmd: spec.Config.Cmd, Env: spec.Config.Env,
		WorkingDir: spec.Config.WorkingDir, User: spec.Config.User, StopSignal: spec.Config.StopSignal,
	}
	digest := img.Target.Digest
	r.mu.Lock()
	// What the creates read of the image holds while its digest does
	// (the digest names the config, and so the chain ID).
	facts := &imageFacts{chainID: chainID}
	if prev, ok := r.images[name]; ok && prev.img.Target.Digest == digest {
		facts = prev.facts
	}
	r.images[name] = cachedImage{info: info, img: img, facts: facts}
	r.mu.Unlock()
	info.Pulled = fetched
	return info, nil
}

// Create creates a container from spec, with a fresh snapshot of its image.
func (r *Runtime) Create(ctx context.Context, s agent.ContainerSpec) error {
	ctx = r.ctx(ctx)
	// The image as EnsureImage left it, or as containerd has it.
	var (
		img      images.Image
		snapshot func(context.Context, *containers.Container) ([]mount.Mount, error)
		config   oci.SpecOpts
	)
	if c, ok := r.cached(s.Image.Ref); ok {
		img = c.img
		snapshot, config = r.withNewSnapshot(s.ID, img, c.facts), r.withImageConfig(oci.WithImageConfig(ociImage{r.client.Content, img}), c.facts)
	} else {
		var err error
		if img, err = r.client.Images.Get(ctx, s.Image.Ref); err != nil {
			return fmt.Errorf("create %s: image %s: %w", s.ID, s.Image.Ref, err)
		}
		_, chain, err := imageio.Config(ctx, r.client.Content, img, platform)
		if err != nil {
			return fmt.Errorf("create %s: image %s: %w", s.ID, s.Image.Ref, err)
		}
		snapshot, config = r.withNewSnapshot(s.ID, img, &imageFacts{chainID: chain.String()}), oci.WithImageConfig(ociImage{r.client.Content, img})
	}
	ctx, release, err := r.withCreateLease(ctx)
	if err != nil {
		return fmt.Errorf("create %s: lease: %w", s.ID, err)
	}
	defer release()
	labels := map[string]string{}
	for k, v := range s.Labels {
		labels[k] = v
	}
	labels[agent.LabelLogPath] = s.LogPath
	labels[agent.LabelImageRef] = s.Image.ID
	if s.TTY {
		labels[labelTTY] = "true"
	}
	if s.Stdin {
		labels[labelStdin] = "true"
	}
	if s.Stdin && s.StdinOnce {
		labels[labelStdinOnce] = "true"
	}
	if s.Image.StopSignal != "" {
		labels[labelStopSignal] = s.Image.StopSignal
	}
	opts := []oci.SpecOpts{
		// As CRI: no tmpfs on /run, which would hide the image's own
		// /run; before the mounts, which may put a volume there.
		oci.WithoutRunMount,
		config,
		oci.WithProcessArgs(s.Args...),
	}
	if s.TTY {
		// Before the env, so the container's own TERM wins over xterm.
		opts = append(opts, oci.WithTTY)
	}
	opts = append(opts,
		oci.WithEnv(s.Env),
		oci.WithMounts(s.Mounts),
		oci.WithCgroup(s.CgroupParent+"/"+s.ID),
		withNoNewPrivileges(s.Security.NoNewPrivileges),
		oci.WithAnnotations(map[string]string{shimGroupAnnotation: r.shimGroup(s.Labels[agent.LabelPodUID])}),
	)
	if v := r.cfg.SpecVersion; v != "" {
		opts = append(opts, withSpecVersion(v))
	}
	if s.Hostname != "" {
		opts = append(opts, oci.WithHostname(s.Hostname))
	}
	if s.WorkingDir != "" {
		opts = append(opts, oci.WithProcessCwd(s.WorkingDir))
	}
	if s.NetNSPath == "" {
		opts = append(opts, oci.WithHostNamespace(specs.NetworkNamespace))
	} else {
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: s.NetNSPath}))
	}
	if s.HostPID {
		opts = append(opts, oci.WithHostNamespace(specs.PIDNamespace))
	}
	if s.HostIPC {
		opts = append(opts, oci.WithHostNamespace(specs.IPCNamespace), withHostDevShm)
	}
	res := s.Resources
	if res.CPUShares > 0 {
		opts = append(opts, oci.WithCPUShares(res.CPUShares))
	}
	if res.CPUQuota > 0 {
		opts = append(opts, oci.WithCPUCFS(res.CPUQuota, res.CPUPeriod))
	}
	if res.MemoryLimit > 0 {
		opts = append(opts, oci.WithMemoryLimit(uint64(res.MemoryLimit)))
	}
	opts = append(opts, r.withOOMScoreAdj(s.ID, res.OOMScoreAdj))
	sec := s.Security
	if sec.UID != nil {
		gid := uint32(0)
		if sec.GID != nil {
			gid = uint32(*sec.GID)
		}
		opts = append(opts, oci.WithUIDGID(uint32(*sec.UID), gid))
	} else if sec.GID != nil {
		opts = append(opts, withGID(uint32(*sec.GID)))
	}
	if len(sec.SupplementalGID) > 0 {
		opts = append(opts, withSupplementalGroups(sec.SupplementalGID))
	}
	if sec.Privileged {
		opts = append(opts, oci.WithPrivileged, oci.WithAllDevicesAllowed, oci.WithHostDevices)
	}
	if len(sec.CapAdd) > 0 {
		opts = append(opts, oci.WithAddedCapabilities(capNames(sec.CapAdd)))
	}
	if len(sec.CapDrop) > 0 {
		opts = append(opts, oci.WithDroppedCapabilities(capNames(sec.CapDrop)))
	}
	if sec.ReadOnlyRootfs {
		opts = append(opts, oci.WithRootFSReadonly())
	}
	if len(sec.Sysctls) > 0 {
		opts = append(opts, withSysctls(sec.Sysctls))
	}
	newContainer := func() error {
		c := containers.Container{
			ID: s.ID, Labels: labels, Snapshotter: r.cfg.Snapshotter,
			Runtime: containers.RuntimeInfo{Name: defaults.DefaultRuntime},
		}
		rootfs, err := snapshot(ctx, &c)
		if err != nil {
			return err
		}
		spec, err := oci.GenerateSpec(ctx, r.client, &c, opts...)
		if err != nil {
			return err
		}
		created, err := r.client.CreateContainer(ctx, c, spec)
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.created[s.ID] = fresh{c: created.WithoutSpec(), rootfs: rootfs}
		r.mu.Unlock()
		return nil
	}
	t0 := r.deps.Clock.Now()
	err = newContainer()
	r.deps.Log.Debug("create container", "container", s.ID, "took", r.deps.Clock.Since(t0), "err", err)
	if errdefs.IsAlreadyExists(err) {
		if _, lerr := r.client.LoadContainer(ctx, s.ID); lerr == nil {
			return fmt.Errorf("create %s: %w", s.ID, agent.ErrExists)
		}
		// No container, so what exists is the snapshot of a create that
		// was cut short (the agent killed mid-way): drop it and try again.
		if serr := r.client.SnapshotService(r.cfg.Snapshotter).Remove(ctx, s.ID); serr != nil && !errdefs.IsNotFound(serr) {
			return fmt.Errorf("create %s: remove leftover snapshot: %w", s.ID, serr)
		}
		err = newContainer()
	}
	if err != nil {
		// The image may have been removed behind our back: look again next time.
		r.forget(s.Image.Ref)
		// A snapshot left by a half-finished create would block the retry.
		if serr := r.client.SnapshotService(r.cfg.Snapshotter).Remove(ctx, s.ID); serr != nil && !errdefs.IsNotFound(serr) {
			r.deps.Log.Debug("remove snapshot after failed create", "container", s.ID, "err", serr)
		}
		return fmt.Errorf("create %s: %w", s.ID, err)
	}
	return nil
}

// SpareKey names the settings that shape the containers Create makes
// besides their spec: the agent's version, the snapshotter, the shim
// groups and the spec version. The OCI runtime is the start's.
func (r *Runtime) SpareKey() string {
	return fmt.Sprintf("outpost %s; snapshotter %s; shim groups %d; spec %s", r.cfg.AgentVersion, r.cfg.Snapshotter, r.cfg.ShimGroups, r.cfg.SpecVersion)
}

// shimGroupAnnotation makes the runc shim serve every container whose
// spec carries the same value from one process (the shim's grouping, as
// CRI uses it for a sandbox's containers).
const shimGroupAnnotation = "io.containerd.runc.v2.group"

// shimGroup names the shim a pod's containers share: one of ShimGroups
// by a hash of the pod UID, or the pod's own when ShimGroups is 0. Each
// shim is a process of several MiB and starting one is a good part of a
// container start, so on a small board a few shared ones beat one per pod.
func (r *Runtime) shimGroup(podUID string) string {
	if r.cfg.ShimGroups <= 0 {
		return "outpost-pod-" + podUID
	}
	h := fnv.New32a()
	h.Write([]byte(podUID))
	return fmt.Sprintf("outpost-%d", h.Sum32()%uint32(r.cfg.ShimGroups))
}

// lockGroup locks the shim group of a container with these labels and
// returns the unlock. The first task of a group starts its shim; tasks
// created at the same moment would race to start it (each `shim start`
// takes the group's socket and may remove another's), and a task created
// while the group's last one is deleted could reach a shim that is
// shutting down. The shim serialises creates in a group anyway.
func (r *Runtime) lockGroup(labels map[string]string) func() {
	g := r.shimGroup(labels[agent.LabelPodUID])
	r.mu.Lock()
	if r.groups == nil {
		r.groups = map[string]*sync.Mutex{}
	}
	m := r.groups[g]
	if m == nil {
		m = new(sync.Mutex)
		r.groups[g] = m
	}
	r.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// withSpecVersion declares version as the spec's ociVersion.
func withSpecVersion(version string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Version = version
		return nil
	}
}

func capNames(caps []string) []string {
	out := make([]string, len(caps))
	for i, c := range caps {
		if len(c) < 4 || c[:4] != "CAP_" {
			c = "CAP_" + c
		}
		out[i] = c
	}
	return out
}

func withNoNewPrivileges(on bool) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process != nil {
			s.Process.NoNewPrivileges = on
		}
		return nil
	}
}

// withHostDevShm makes the default /dev/shm tmpfs a bind mount of the
// host's, for a container in the host's IPC namespace (hostIPC), as CRI
// does; a volume the pod mounts on /dev/shm still goes over it.
func withHostDevShm(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	for i, m := range s.Mounts {
		if m.Destination == "/dev/shm" && m.Type == "tmpfs" {
			s.Mounts[i] = specs.Mount{Destination: "/dev/shm", Type: "bind", Source: "/dev/shm", Options: []string{"rbind", "rprivate", "rw"}}
			return nil
		}
	}
	return nil
}

func withGID(gid uint32) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process != nil {
			s.Process.User.GID = gid
		}
		return nil
	}
}

// withSysctls sets the container's sysctls; runc writes them in its
// namespaces.
func withSysctls(sysctls map[string]string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		if s.Linux.Sysctl == nil {
			s.Linux.Sysctl = map[string]string{}
		}
		for k, v := range sysctls {
			s.Linux.Sysctl[k] = v
		}
		return nil
	}
}

func withSupplementalGroups(gids []int64) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			return nil
		}
		for _, g := range gids {
			s.Process.User.AdditionalGids = append(s.Process.User.AdditionalGids, uint32(g))
		}
		return nil
	}
}

// withOOMScoreAdj sets oom_score_adj, clamped to what this process may
// set: lowering it below the agent's own needs CAP_SYS_RESOURCE, and runc
// fails the whole container when it cannot ("can't get final child's PID
// from pipe"), so a value that cannot be set is raised with a warning.
func (r *Runtime) withOOMScoreAdj(id string, want int) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			return nil
		}
		v := want
		if floor, ok := ownOOMScoreAdj(); ok && v < floor && !hasSysResource() {
			r.deps.Log.Warn("oom_score_adj clamped: lowering it needs CAP_SYS_RESOURCE", "container", id, "want", want, "set", floor)
			v = floor
		}
		s.Process.OOMScoreAdj = &v
		return nil
	}
}

func ownOOMScoreAdj() (int, bool) {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	return n, err == nil
}

// hasSysResource reports whether CAP_SYS_RESOURCE is in this process's
// effective set.
func hasSysResource() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("CapEff:")); ok {
			caps, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 16, 64)
			return err == nil && caps&(1<<24) != 0 // CAP_SYS_RESOURCE = 24
		}
	}
	return false
}

// Start starts the container's task with its output going to its log.
func (r *Runtime) Start(ctx context.Context, id string) error {
	ctx = r.ctx(ctx)
	f, isFresh := r.takeCreated(id)
	c := f.c
	if !isFresh {
		var err error
		if c, err = r.client.LoadContainer(ctx, id); err != nil {
			return fmt.Errorf("start %s: %w", id, notFound(err))
		}
	}
	labels := c.Info().Labels
	t0 := r.deps.Clock.Now()
	unlock := r.lockGroup(labels)
	t1 := r.deps.Clock.Now()
	// A task left from an earlier, failed start is replaced. A container
	// this runtime created has had none.
	if !isFresh {
		if old, err := c.Task(ctx, nil); err == nil {
			old.Delete(ctx, true)
		}
	}
	out, errOut, closeLog, err := r.logStreams(labels[agent.LabelLogPath])
	if err != nil {
		unlock()
		return fmt.Errorf("start %s: %w", id, err)
	}
	creator := streamCreator(r.poll, r.cfg.FIFODir, labels[labelTTY] == "true", labels[labelStdin] == "true", out, errOut)
	taskOpts := ctrd.TaskOpts{RuntimePath: r.cfg.ShimStart, OCIRuntime: r.cfg.OCIRuntime, Rootfs: f.rootfs}
	task, err := c.NewTask(ctx, creator, taskOpts)
	if errdefs.IsAlreadyExists(err) {
		// An agent killed while containerd created the task can leave
		// it in containerd's task list with no process behind it:
		// loading it says not found, and creating it says it exists.
		// It is deleted by its ID, and created again.
		r.deps.Log.Warn("replacing a task containerd lists but cannot load", "container", id)
		if derr := r.deleteTask(ctx, id); derr != nil {
			err = fmt.Errorf("%w; deleting it: %v", err, derr)
		} else {
			task, err = c.NewTask(ctx, creator, taskOpts)
		}
	}
	unlock()
	t2 := r.deps.Clock.Now()
	if err != nil {
		closeLog()
		removeEmptyLog(labels[agent.LabelLogPath])
		return fmt.Errorf("start %s: create task: %w", id, err)
	}
	r.watchIO(id, task.IO(), out, errOut, labels[labelStdinOnce] == "true", closeLog)
	if err := task.Start(ctx); err != nil {
		task.Delete(ctx, true)
		removeEmptyLog(labels[agent.LabelLogPath])
		return fmt.Errorf("start %s: %w", id, err)
	}
	r.deps.Log.Debug("start task", "container", id, "group wait", t1.Sub(t0), "create", t2.Sub(t1), "start", r.deps.Clock.Since(t2))
	// The start time is the kernel's for the task's process, which an
	// agent killed before it wrote it would give its successor too (see
	// List): the status keeps the same startedAt across the restart.
	at, ok := r.processStart(task.Pid())
	if !ok {
		at = r.deps.Clock.Now()
	}
	r.writeBehind(id, map[string]string{agent.LabelStartedAt: at.UTC().Format(time.RFC3339Nano)})
	return nil
}

// deleteTask kills and deletes the task of container id through the task
// service, which needs no state from the task's shim.
func (r *Runtime) deleteTask(ctx context.Context, id string) error {
	ts := r.client.Tasks
	ts.Kill(ctx, &tasks.KillRequest{ContainerID: id, Signal: uint32(syscall.SIGKILL), All: true})
	if _, err := ts.Delete(ctx, &tasks.DeleteTaskRequest{ContainerID: id}); err != nil {
		if err = ctrd.Native(err); !errdefs.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// logStreams opens the container's CRI log and returns its two streams
// and a func that flushes and closes them.
func (r *Runtime) logStreams(path string) (out, errOut *lockedStream, closeLog func(), err error) {
	if path == "" {
		return nil, nil, nil, errors.New("no log path label")
	}
	w, err := crilog.Open(path, r.cfg.Log, r.deps.Clock)
	if err != nil {
		return nil, nil, nil, err
	}
	out, errOut = &lockedStream{s: w.Stream("stdout")}, &lockedStream{s: w.Stream("stderr")}
	return out, errOut, func() { out.Close(); errOut.Close(); w.Close() }, nil
}

// watchIO marks id attached, keeps its stdin writer if it has one and,
// when the copy ends (the task exited), closes the FIFOs and the log and
// clears both.
func (r *Runtime) watchIO(id string, tio cio.IO, out, errOut *lockedStream, stdinOnce bool, closeLog func()) {
	o := &output{out: out, errOut: errOut, stdinOnce: stdinOnce, done: make(chan struct{})}
	r.mu.Lock()
	r.attached[id] = true
	if s, ok := tio.(*streams); ok && s.stdin() != nil {
		r.stdin[id] = s.stdin()
	}
	r.outputs[id] = o
	r.mu.Unlock()
	ended := func() {
		r.mu.Lock()
		delete(r.stdin, id)
		delete(r.outputs, id)
		r.mu.Unlock()
		close(o.done)
		tio.Close()
		closeLog()
		r.mu.Lock()
		delete(r.attached, id)
		r.mu.Unlock()
	}
	if s, ok := tio.(*streams); ok {
		s.whenDone(ended) // on the last copy's goroutine: none waits
		return
	}
	go func() {
		tio.Wait()
		ended()
	}()
}

// reattach copies a running task's output again after an agent restart
// and reopens its stdin FIFO, if it has one, for writing. containerd
// gives the FIFOs the task was created with, the terminal flag too. (The
// shim holds a writing end of stdin of its own, so the process saw no
// end of input while the agent was away.)
func (r *Runtime) reattach(ctx context.Context, c *ctrd.Container, labels map[string]string) {
	r.mu.Lock()
	done := r.attached[c.ID()]
	r.mu.Unlock()
	if done {
		return
	}
	out, errOut, closeLog, err := r.logStreams(labels[agent.LabelLogPath])
	if err != nil {
		r.deps.Log.Warn("reattach logs", "container", c.ID(), "err", err)
		return
	}
	task, err := c.Task(ctx, streamAttach(r.poll, out, errOut))
	if err != nil {
		closeLog()
		r.deps.Log.Warn("reattach logs", "container", c.ID(), "err", err)
		return
	}
	r.watchIO(c.ID(), task.IO(), out, errOut, labels[labelStdinOnce] == "true", closeLog)
}

// Stop sends the stop signal, waits up to grace, then SIGKILL.
func (r *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	ctx = r.ctx(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return fmt.Errorf("stop %s: %w", id, notFound(err))
	}
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil // nothing running
	}
	if err != nil {
		return fmt.Errorf("stop %s: %w", id, err)
	}
	st, err := task.Status(ctx)
	if err != nil {
		return fmt.Errorf("stop %s: %w", id, err)
	}
	if st == apitask.Status_RUNNING || st == apitask.Status_PAUSED {
		exitc, err := task.Wait(ctx)
		if err != nil {
			return fmt.Errorf("stop %s: %w", id, err)
		}
		sig := stopSignal(c.Info().Labels[labelStopSignal])
		if err := task.Kill(ctx, sig, false); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("stop %s: signal: %w", id, err)
		}
		timer := r.deps.Clock.NewTimer(grace)
		select {
		case <-exitc:
			timer.Stop()
		case <-timer.C():
			if err := task.Kill(ctx, syscall.SIGKILL, true); err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("stop %s: kill: %w", id, err)
			}
			select {
			case <-exitc:
			case <-ctx.Done():
				return fmt.Errorf("stop %s: %w", id, ctx.Err())
			}
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("stop %s: %w", id, ctx.Err())
		}
	}
	_, err = r.reap(ctx, c, task)
	return err
}

// reap deletes an ended task, recording its exit in the container's
// labels so the state outlives the task (and its shim). It returns the
// container's labels as containerd holds them after that write, or nil
// when it wrote none.
func (r *Runtime) reap(ctx context.Context, c *ctrd.Container, task *ctrd.Task) (map[string]string, error) {
	cl, err := c.Labels(ctx)
	if err != nil && !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("delete task %s: %w", c.ID(), err)
	}
	unlock := r.lockGroup(cl)
	st, err := task.Delete(ctx, false)
	unlock()
	if err != nil && !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("delete task %s: %w", c.ID(), err)
	}
	labels := map[string]string{}
	if st != nil {
		labels[labelExitCode] = strconv.Itoa(int(st.Code))
		at := st.ExitedAt
		if at.IsZero() || at.Year() < 2000 {
			at = r.deps.Clock.Now()
		}
		labels[labelFinishedAt] = at.UTC().Format(time.RFC3339Nano)
	}
	r.mu.Lock()
	if r.oom[c.ID()] {
		labels[labelReason] = "OOMKilled"
		delete(r.oom, c.ID())
	}
	r.mu.Unlock()
	// What is held to be written goes with the exit.
	held := r.pending(c.ID())
	for k, v := range held {
		if _, ok := labels[k]; !ok {
			labels[k] = v
		}
	}
	if len(labels) == 0 {
		return nil, nil
	}
	all, err := c.SetLabels(ctx, labels)
	if err != nil {
		if errdefs.IsNotFound(err) {
			// Removed behind the agent: nothing is left to record to.
			r.forgetLabels(c.ID())
		}
		return nil, fmt.Errorf("record exit of %s: %w", c.ID(), notFound(err))
	}
	r.written(c.ID(), held)
	return all, nil
}

// Remove deletes the container, its task and its snapshot.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	ctx = r.ctx(ctx)
	r.takeCreated(id)
	c, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	if task, err := c.Task(ctx, nil); err == nil {
		cl, _ := c.Labels(ctx)
		unlock := r.lockGroup(cl)
		_, err := task.Delete(ctx, true)
		unlock()
		if err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove %s: task: %w", id, err)
		}
	}
	if err := c.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	r.forgetLabels(id)
	return nil
}

// primedFor is how long a listing Prime took may stand in for a pod's
// first List: the agent's workers all list their pods as it starts, and
// a change the listing missed (a task that exited since) comes as an
// exit, or at the next resync.
const primedFor = 5 * time.Second

// primedList is every container of the agent and every task, listed at
// once by Prime.
type primedList struct {
	done  chan struct{} // closed once listed
	err   error
	at    time.Time
	byPod map[string][]*ctrd.Container
	tasks map[string]*apitask.Process // by container ID
	taken map[string]bool             // the pods whose List took theirs
}

// Prime lists the agent's containers and their tasks with two calls, in
// the background, for each pod's first List to take its part from
// instead of asking containerd (a list of its containers, which
// containerd filters by decoding every container of the namespace, and
// a task lookup each). At the agent's start every pod's worker lists at
// once: after a reboot, 30 pods made 60 calls before their first create.
// It returns at once; the listing ends with ctx, or when it is done.
func (r *Runtime) Prime(ctx context.Context) {
	p := &primedList{done: make(chan struct{}), byPod: map[string][]*ctrd.Container{}, tasks: map[string]*apitask.Process{}, taken: map[string]bool{}}
	r.mu.Lock()
	r.primed = p
	r.mu.Unlock()
	go func() {
		defer close(p.done)
		ctx := r.ctx(ctx)
		cs, err := r.client.ListContainers(ctx, fmt.Sprintf("labels.%q", agent.LabelPodUID))
		if err != nil {
			p.err = err
			return
		}
		ts, err := r.client.Tasks.List(ctx, &tasks.ListTasksRequest{})
		if err != nil {
			p.err = ctrd.Native(err)
			return
		}
		for _, c := range cs {
			uid := c.Info().Labels[agent.LabelPodUID]
			p.byPod[uid] = append(p.byPod[uid], c)
		}
		for _, t := range ts.GetTasks() {
			p.tasks[t.GetID()] = t
		}
		p.at = r.deps.Clock.Now()
	}()
}

// takePrimed returns the pod's containers and the tasks from Prime's
// listing, the first time the pod asks within primedFor of it (waiting
// for the listing if it is under way), and every pod's ("") each time
// within primedFor (the agent's look for orphans as it starts); ok is
// false otherwise.
func (r *Runtime) takePrimed(ctx context.Context, podUID string) (cs []*ctrd.Container, tasks map[string]*apitask.Process, ok bool) {
	r.mu.Lock()
	p := r.primed
	r.mu.Unlock()
	if p == nil {
		return nil, nil, false
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return nil, nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.primed != p {
		return nil, nil, false
	}
	if p.err != nil || r.deps.Clock.Since(p.at) > primedFor {
		r.primed = nil // stale or failed: every List asks containerd
		return nil, nil, false
	}
	if podUID == "" {
		for _, pcs := range p.byPod {
			cs = append(cs, pcs...)
		}
		return cs, p.tasks, true
	}
	if p.taken[podUID] {
		return nil, nil, false
	}
	p.taken[podUID] = true
	return p.byPod[podUID], p.tasks, true
}

// List returns the agent's containers with their state. A task found
// stopped is reaped on the way; a running one has its output re-attached
// if this process is not copying it yet.
func (r *Runtime) List(ctx context.Context, podUID string) ([]agent.Container, error) {
	ctx = r.ctx(ctx)
	cs, primed, ok := r.takePrimed(ctx, podUID)
	if !ok {
		filter := fmt.Sprintf("labels.%q", agent.LabelPodUID)
		if podUID != "" {
			filter = fmt.Sprintf("labels.%q==%q", agent.LabelPodUID, podUID)
		}
		var err error
		if cs, err = r.client.ListContainers(ctx, filter); err != nil {
			return nil, fmt.Errorf("list containers: %w", err)
		}
	}
	out := make([]agent.Container, 0, len(cs))
	for _, c := range cs {
		info := c.Info()
		ac := agent.Container{ID: c.ID(), Labels: r.withPending(c.ID(), info.Labels), CreatedAt: info.CreatedAt, State: agent.StateCreated}
		if ac.Labels[labelFinishedAt] != "" {
			// Its exit is recorded, which reap and the lost-task case
			// below do only once the task is gone; and a container's task
			// is never started again (a restart is a new container), so
			// there is no task to ask about.
			ac.State = agent.StateExited
			fillTimes(&ac)
			out = append(out, ac)
			continue
		}
		// One Get through the task service gives the state; ctrd's Task
		// and Status would ask the shim twice. A primed listing has it.
		var resp *tasks.GetResponse
		var terr error
		if primed != nil {
			if p, ok := primed[c.ID()]; ok {
				resp = &tasks.GetResponse{Process: p}
			} else {
				terr = fmt.Errorf("task %s: %w", c.ID(), errdefs.ErrNotFound)
			}
		} else if resp, terr = r.client.Tasks.Get(ctx, &tasks.GetRequest{ContainerID: c.ID()}); terr != nil {
			terr = ctrd.Native(terr)
		}
		switch {
		case terr == nil:
			switch resp.GetProcess().GetStatus() {
			case apitask.Status_RUNNING, apitask.Status_PAUSED, apitask.Status_PAUSING:
				ac.State = agent.StateRunning
				if ac.Labels[agent.LabelStartedAt] == "" {
					// Started by an agent killed before it wrote the
					// start time: the kernel's, as Start takes it.
					at, ok := r.processStart(resp.GetProcess().GetPid())
					if !ok {
						at = info.CreatedAt
					}
					r.writeBehind(c.ID(), map[string]string{agent.LabelStartedAt: at.UTC().Format(time.RFC3339Nano)})
					ac.Labels = r.withPending(c.ID(), info.Labels)
				}
				r.reattach(ctx, c, info.Labels)
			case apitask.Status_STOPPED:
				task, err := c.Task(ctx, nil)
				if err != nil && !errdefs.IsNotFound(err) {
					return nil, fmt.Errorf("list containers: %s: %w", c.ID(), err)
				}
				var labels map[string]string
				if err == nil {
					labels, err = r.reap(ctx, c, task)
					if errors.Is(err, agent.ErrNotFound) {
						continue // removed since the list, by something other than the agent
					} else if err != nil {
						return nil, err
					}
				}
				if labels == nil {
					// Nothing was written: read what is there.
					fresh, err := c.Refresh(ctx)
					if errdefs.IsNotFound(err) {
						continue
					}
					if err == nil {
						labels = fresh.Labels
					} else {
						labels = info.Labels
					}
				}
				ac.Labels = r.withPending(c.ID(), labels)
				ac.State = agent.StateExited
			}
		case errdefs.IsNotFound(terr):
			if ac.Labels[agent.LabelStartedAt] != "" || hasLog(ac.Labels[agent.LabelLogPath]) {
				// Started (its start time is written, or its log, which
				// only a start that got the task going leaves, exists:
				// the agent was killed before it wrote the time), and its
				// task is gone with no exit recorded: it died with the
				// node. That is recorded once (behind), so the time it
				// was found dead stays the same on every later look.
				ac.State = agent.StateExited
				lost := map[string]string{
					labelExitCode: "255", labelReason: agent.ReasonLost,
					labelFinishedAt: r.deps.Clock.Now().UTC().Format(time.RFC3339Nano),
				}
				r.writeBehind(c.ID(), lost)
				ac.Labels = r.withPending(c.ID(), info.Labels)
			} else if primed != nil {
				// Never started (a spare, or a create cut short), and
				// listed at the agent's start with no task: its Start
				// needs neither the record nor a look for a task again.
				r.noteCreated(c)
			}
		default:
			return nil, fmt.Errorf("list containers: %s: %w", c.ID(), terr)
		}
		fillTimes(&ac)
		out = append(out, ac)
	}
	return out, nil
}

func fillTimes(c *agent.Container) {
	l := c.Labels
	c.StartedAt, _ = time.Parse(time.RFC3339Nano, l[agent.LabelStartedAt])
	c.FinishedAt, _ = time.Parse(time.RFC3339Nano, l[labelFinishedAt])
	c.Reason = l[labelReason]
	if c.State != agent.StateExited {
		return
	}
	if v, ok := l[labelExitCode]; ok {
		n, _ := strconv.Atoi(v)
		c.ExitCode = int32(n)
	} else {
		// The task vanished without an exit status: a reboot or a
		// containerd state wipe. kubelet reports such containers as
		// exited with code 255 and reason Unknown.
		c.ExitCode, c.Reason = 255, agent.ReasonLost
	}
}

// Exec runs cmd in the container and returns its exit code and output.
func (r *Runtime) Exec(ctx context.Context, id string, cmd []string) (int, []byte, error) {
	buf := &limitedBuffer{max: 64 << 10}
	code, err := r.ExecStream(ctx, id, cmd, agent.StreamIO{Stdout: buf, Stderr: buf})
	return code, buf.Bytes(), err
}

// Exits streams the IDs of containers whose task exited, re-subscribing
// with backoff when containerd goes away.
func (r *Runtime) Exits(ctx context.Context) <-chan string {
	out := make(chan string, 64)
	go func() {
		defer close(out)
		backoff := time.Second
		for first := true; ctx.Err() == nil; first = false {
			envs, errs := r.client.Subscribe(r.ctx(ctx), `topic=="/tasks/exit"`, `topic=="/tasks/oom"`)
			if !first {
				// Exits while unsubscribed are lost: have every pod look.
				select {
				case out <- "":
				case <-ctx.Done():
					return
				}
			}
		recv:
			for {
				select {
				case <-ctx.Done():
					return
				case err := <-errs:
					if err != nil && ctx.Err() == nil {
						r.deps.Log.Warn("containerd events lost; re-subscribing", "err", err)
					}
					break recv
				case env := <-envs:
					backoff = time.Second
					id := r.eventContainer(env.Event)
					if id == "" {
						continue
					}
					select {
					case out <- id:
					case <-ctx.Done():
						return
					}
				}
			}
			t := r.deps.Clock.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C():
			}
			backoff = min(2*backoff, 30*time.Second)
		}
	}()
	return out
}

func (r *Runtime) eventContainer(ev typeurl.Any) string {
	if ev == nil {
		return ""
	}
	v, err := typeurl.UnmarshalAny(ev)
	if err != nil {
		return ""
	}
	switch e := v.(type) {
	case *eventstypes.TaskExit:
		if e.ID != e.ContainerID && e.ID != "" {
			return "" // an exec process, not the container
		}
		return e.ContainerID
	case *eventstypes.TaskOOM:
		r.mu.Lock()
		r.oom[e.ContainerID] = true
		r.mu.Unlock()
	}
	return ""
}

// An image imported from a tarball of the agent's image directory
// carries the tarball's file name and a record of the import: the
// tarball's version (as the caller names it), how many images the
// import brought and the image's target then. The agent, started again,
// finds there that an unchanged tarball's images are all still in
// containerd as it left them, and does not copy the tarball into the
// content store once more: on a board, a read of every tarball and as
// many writes to its SD card, before any pod starts, at every boot.
const (
	labelTarball       = "io.outpost.image.tarball"
	labelTarballImport = "io.outpost.image.tarball-import"
)

// tarballImport is the value of labelTarballImport.
func tarballImport(version string, images int, target digest.Digest) string {
	return version + " " + strconv.Itoa(images) + " " + target.String()
}

// ImportFile imports an OCI or docker-archive tarball and unpacks its
// images, returning their names. A non-empty version, the tarball's as
// the caller tells its versions apart, records the import on the images
// for Imported, with the tarball's base name.
func (r *Runtime) ImportFile(ctx context.Context, path, version string) ([]string, error) {
	ctx = r.ctx(ctx)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	defer f.Close()
	imgs, err := imageio.Import(ctx, r.stores(), f, platform)
	var names []string
	for _, i := range imgs {
		names = append(names, i.Name)
		r.forget(i.Name)
	}
	if err != nil {
		return names, fmt.Errorf("import %s: %w", path, err)
	}
	if version == "" {
		return names, nil
	}
	for _, img := range imgs {
		img.Labels = map[string]string{
			labelTarball:       filepath.Base(path),
			labelTarballImport: tarballImport(version, len(imgs), img.Target.Digest),
		}
		if _, err := r.client.Images.Update(ctx, img, "labels."+labelTarball, "labels."+labelTarballImport); err != nil {
			return names, fmt.Errorf("import %s: record the import on image %s: %w", path, img.Name, err)
		}
	}
	return names, nil
}

// Imported returns the names of the images that ImportFile brought from
// the tarball named file at version, and whether they are all still in
// containerd with the targets it gave them: if so, importing that
// version again would change nothing.
func (r *Runtime) Imported(ctx context.Context, file, version string) ([]string, bool) {
	ctx = r.ctx(ctx)
	imgs, err := r.client.Images.List(ctx)
	if err != nil {
		r.deps.Log.Debug("list images", "err", err)
		return nil, false
	}
	var mine []images.Image
	for _, img := range imgs {
		if img.Labels[labelTarball] == file {
			mine = append(mine, img)
		}
	}
	names := make([]string, 0, len(mine))
	for _, img := range mine {
		if img.Labels[labelTarballImport] != tarballImport(version, len(mine), img.Target.Digest) {
			return nil, false
		}
		names = append(names, img.Name)
	}
	return names, len(names) > 0
}

// stopSignal is the signal named by an image's stop signal (SIGINT, INT,
// 2 or SIGRTMIN+3), SIGTERM when it names none.
func stopSignal(name string) syscall.Signal {
	if name == "" {
		return syscall.SIGTERM
	}
	if n, err := strconv.Atoi(name); err == nil && n > 0 && n < 65 {
		return syscall.Signal(n)
	}
	name = strings.ToUpper(name)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if s := unix.SignalNum(name); s != 0 {
		return s
	}
	// The real-time signals, numbered as the C library and moby number
	// them (SIGRTMIN+3 is systemd's stop signal).
	const rtmin, rtmax = 34, 64
	v := 0
	switch {
	case name == "SIGRTMIN":
		v = rtmin
	case name == "SIGRTMAX":
		v = rtmax
	case strings.HasPrefix(name, "SIGRTMIN+"):
		if n, err := strconv.Atoi(name[len("SIGRTMIN+"):]); err == nil {
			v = rtmin + n
		}
	case strings.HasPrefix(name, "SIGRTMAX-"):
		if n, err := strconv.Atoi(name[len("SIGRTMAX-"):]); err == nil {
			v = rtmax - n
		}
	}
	if v >= rtmin && v <= rtmax {
		return syscall.Signal(v)
	}
	return syscall.SIGTERM
}

func notFound(err error) error {
	if errdefs.IsNotFound(err) {
		return fmt.Errorf("%w: %v", agent.ErrNotFound, err)
	}
	return err
}

// lockedStream is one output stream of a container: its log, and the
// writers of the attach sessions that joined it.
type lockedStream struct {
	mu sync.Mutex
	s  interface {
		Write([]byte) (int, error)
		Close() error
	}
	joined []io.Writer
}

// Write writes p to the log, then to each attached writer; a writer that
// fails is dropped, so a gone client never stops the log.
func (l *lockedStream) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.s.Write(p)
	for i := 0; i < len(l.joined); i++ {
		if _, werr := l.joined[i].Write(p); werr != nil {
			l.joined = append(l.joined[:i], l.joined[i+1:]...)
			i--
		}
	}
	return n, err
}

// join adds w to the writers p goes to and returns a func that removes it.
func (l *lockedStream) join(w io.Writer) (leave func()) {
	l.mu.Lock()
	l.joined = append(l.joined, w)
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, j := range l.joined {
			if j == w {
				l.joined = append(l.joined[:i], l.joined[i+1:]...)
				return
			}
		}
	}
}

func (l *lockedStream) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.Close()
}

type limitedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room < len(p) {
		b.buf.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return b.buf.Write(p)
}

// Close implements io.Closer; the buffer stays readable.
func (b *limitedBuffer) Close() error { return nil }

func (b *limitedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf.Bytes()...)
}
