package agent

import (
	"context"
	"errors"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
)

// Runtime runs containers. agent/containerd implements it over containerd;
// agent/runtimetest fakes it for unit tests. Every container it lists is
// one the agent created, identified by the labels in ContainerSpec.
type Runtime interface {
	// Version names the runtime and its version, e.g. "containerd://1.6.20".
	Version(ctx context.Context) (string, error)
	// EnsureImage makes ref present according to policy and returns what
	// the pod status reports about it. With PullIfNotPresent or PullNever a
	// present image is used without touching the network.
	EnsureImage(ctx context.Context, ref string, policy corev1.PullPolicy) (Image, error)
	// Create creates (does not start) a container. Creating an ID that
	// exists fails with ErrExists.
	Create(ctx context.Context, spec ContainerSpec) error
	// Start starts a created container, its output going to spec.LogPath.
	Start(ctx context.Context, id string) error
	// Stop signals the container with SIGTERM (or its image's stop
	// signal), waits up to grace, then kills it; it returns once stopped.
	Stop(ctx context.Context, id string, grace time.Duration) error
	// Remove deletes a stopped container and its snapshot.
	Remove(ctx context.Context, id string) error
	// List returns the containers the agent created for the pod with this
	// UID, or all of them when podUID is "".
	List(ctx context.Context, podUID string) ([]Container, error)
	// Exec runs cmd in a running container and returns its exit code and
	// combined output (at most 64 KiB).
	Exec(ctx context.Context, id string, cmd []string) (int, []byte, error)
	// SpareKey names what shapes a container Create makes besides its
	// ContainerSpec (the runtime's own settings). A spare made under
	// another key is not what Create would make now, and is not used.
	SpareKey() string
	// Exits delivers the ID of each container whose process exited, until
	// ctx ends. An empty ID means events may have been lost (the runtime
	// was reconnected): every pod should look at its containers again.
	Exits(ctx context.Context) <-chan string
}

// ErrExists is returned by Create for an ID already in use.
var ErrExists = errors.New("container already exists")

// ErrNotFound is returned for a container ID the runtime does not know.
var ErrNotFound = errors.New("container not found")

// Image is a resolved image.
type Image struct {
	// Ref is the reference the image was asked for.
	Ref string
	// ID is the image's digest, as imageID in a container status.
	ID string
	// Entrypoint, Cmd, Env, WorkingDir and User come from the image config.
	Entrypoint, Cmd, Env []string
	WorkingDir, User     string
	// StopSignal is the image's stop signal, "" for SIGTERM.
	StopSignal string
	// Pulled reports whether this call fetched the image from a registry,
	// rather than finding it on the node.
	Pulled bool
}

// Labels the agent puts on every container it creates.
const (
	LabelPodUID       = "io.outpost.pod.uid"
	LabelPodNamespace = "io.outpost.pod.namespace"
	LabelPodName      = "io.outpost.pod.name"
	LabelContainer    = "io.outpost.container.name"
	LabelAttempt      = "io.outpost.container.attempt"
	LabelInit         = "io.outpost.container.init"
	LabelLogPath      = "io.outpost.container.log"
	LabelStartedAt    = "io.outpost.container.started"
	LabelImageRef     = "io.outpost.container.image"
	// LabelSpare marks a container made ahead for its container's next
	// attempt and not started (a spare, see makeSpares); its value is
	// the key of the spec and runtime it was made from (spareKey).
	LabelSpare = "io.outpost.container.spare"
	// LabelGracePeriod keeps the pod's termination grace period in
	// seconds, so a container whose pod is gone (removed while the agent
	// was down) still stops with it.
	LabelGracePeriod = "io.outpost.pod.grace-period"
)

// ContainerSpec is everything the runtime needs to create a container.
type ContainerSpec struct {
	ID     string
	Labels map[string]string
	Image  Image
	// Args is the full process argument list (entrypoint already merged).
	Args       []string
	Env        []string
	WorkingDir string
	Hostname   string
	Mounts     []specs.Mount
	// NetNSPath is the pod's network namespace; "" joins the host's.
	NetNSPath string
	// HostPID and HostIPC put the process in the host's PID and IPC
	// namespaces (the pod's hostPID and hostIPC); with HostIPC its
	// /dev/shm is the host's, as under CRI.
	HostPID, HostIPC bool
	// LogPath is the CRI-format log file for this attempt.
	LogPath string
	// CgroupParent is the pod's cgroup; "" lets the runtime choose.
	CgroupParent string
	Resources    Resources
	Security     Security
	// TTY gives the process a terminal (OCI process.terminal), as the
	// container's tty field asks. Its output, stdout and stderr together,
	// is one stream, logged as stdout.
	TTY bool
	// Stdin gives the process a stdin the runtime holds open, so a read
	// blocks instead of ending at once as on /dev/null (without Stdin),
	// as kubelet's container with stdin and nobody attached.
	Stdin bool
	// StdinOnce is the container's stdinOnce: stdin is closed after the
	// first attach session ends. With no attach yet it changes nothing;
	// it is carried for the attach to come.
	StdinOnce bool
}

// Resources are the cgroup settings of a container.
type Resources struct {
	CPUShares   uint64
	CPUQuota    int64
	CPUPeriod   uint64
	MemoryLimit int64
	OOMScoreAdj int
}

// Security is the container's security settings.
type Security struct {
	UID, GID        *int64
	SupplementalGID []int64
	Privileged      bool
	CapAdd, CapDrop []string
	ReadOnlyRootfs  bool
	NoNewPrivileges bool
	// Sysctls are the pod's sysctls (admitted as safe: namespaced), set
	// in each container's namespaces.
	Sysctls map[string]string
}

// ContainerState is what the runtime says a container is doing.
type ContainerState int

// Container states.
const (
	StateUnknown ContainerState = iota
	StateCreated
	StateRunning
	StateExited
)

func (s ContainerState) String() string {
	return [...]string{"unknown", "created", "running", "exited"}[s]
}

// Container is a container as listed by the runtime.
type Container struct {
	ID         string
	Labels     map[string]string
	State      ContainerState
	CreatedAt  time.Time
	StartedAt  time.Time // from LabelStartedAt
	FinishedAt time.Time
	ExitCode   int32
	// Reason is "OOMKilled" when the kernel killed it for memory,
	// ReasonLost when it vanished with its task (a reboot), else "".
	Reason string
}

// ReasonLost is the reason of a container whose task vanished without an
// exit status, as after a power cut; kubelet reports these as "Unknown".
const ReasonLost = "Unknown"

// Image errors, as the reasons kubelet reports (ErrImagePull, ErrImageNeverPull).
var (
	ErrImagePull      = errors.New("ErrImagePull")
	ErrImageNeverPull = errors.New("ErrImageNeverPull")
)
