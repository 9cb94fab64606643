// Package runtimetest is an in-memory agent.Runtime for unit tests. Its
// containers only change state when the agent asks (Create, Start, Stop,
// Remove) or when a test says so (Exit, Reboot); time comes from an
// injected clock, so tests drive it with a fake one.
//
// The fake behaves like the containerd adapter where the agent can tell:
// Create of an existing ID fails with agent.ErrExists, Stop of a container
// that is not running and Remove of an unknown one succeed, Start records
// agent.LabelStartedAt, and image errors wrap agent.ErrImagePull and
// agent.ErrImageNeverPull. An operation that fails changes nothing.
package runtimetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/internal/clock"
)

// Operation names for FailNext: the Runtime methods.
const (
	OpVersion     = "Version"     // Version
	OpEnsureImage = "EnsureImage" // EnsureImage
	OpCreate      = "Create"      // Create
	OpStart       = "Start"       // Start
	OpStop        = "Stop"        // Stop
	OpRemove      = "Remove"      // Remove
	OpList        = "List"        // List
	OpExec        = "Exec"        // Exec
)

// Exit codes of a container ended by Stop.
const (
	ExitKilled     = 137 // SIGKILL after the grace period
	ExitTerminated = 143 // its own SIGTERM handler (SetHandlesSIGTERM)
)

// ExecFunc answers Exec for a running container.
type ExecFunc func(ctx context.Context, id string, cmd []string) (code int, output []byte, err error)

// Fake is an in-memory agent.Runtime. It is safe for concurrent use.
type Fake struct {
	clock clock.Clock

	mu         sync.Mutex
	containers map[string]*container
	images     map[string]bool // present on the node
	registry   map[string]bool // pullable
	pulls      map[string]int  // pull attempts by ref, failed ones too
	fail       map[string][]error
	exec       ExecFunc
	sigterm    map[string]bool // IDs whose process exits on SIGTERM
	subs       []chan string
	calls      []string
	spareKey   string
}

type container struct {
	spec       agent.ContainerSpec
	labels     map[string]string
	state      agent.ContainerState
	createdAt  time.Time
	startedAt  time.Time
	finishedAt time.Time
	exitCode   int32
	reason     string
}

var _ agent.Runtime = (*Fake)(nil)

// New returns an empty fake whose timestamps come from clk.
func New(clk clock.Clock) *Fake {
	return &Fake{
		clock: clk, containers: map[string]*container{}, images: map[string]bool{},
		registry: map[string]bool{}, pulls: map[string]int{}, fail: map[string][]error{}, sigterm: map[string]bool{},
	}
}

// FailNext makes the next call of op (one of the Op constants) return err
// without changing anything. Calls queue: two FailNext of one op fail its
// next two calls.
func (f *Fake) FailNext(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[op] = append(f.fail[op], err)
}

// failure pops the error queued for op; f.mu is held.
func (f *Fake) failure(op string) error {
	q := f.fail[op]
	if len(q) == 0 {
		return nil
	}
	f.fail[op] = q[1:]
	return q[0]
}

// AddImage makes refs present on the node.
func (f *Fake) AddImage(refs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range refs {
		f.images[r] = true
	}
}

// RemoveImage deletes refs from the node (not from the registry).
func (f *Fake) RemoveImage(refs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range refs {
		delete(f.images, r)
	}
}

// AddToRegistry makes refs pullable: EnsureImage of a missing ref then
// pulls it instead of failing with agent.ErrImagePull.
func (f *Fake) AddToRegistry(refs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range refs {
		f.registry[r] = true
	}
}

// RemoveFromRegistry makes refs unpullable again.
func (f *Fake) RemoveFromRegistry(refs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range refs {
		delete(f.registry, r)
	}
}

// PullAttempts returns how many times EnsureImage went to the registry
// for ref, whether the pull succeeded or not.
func (f *Fake) PullAttempts(ref string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pulls[ref]
}

// Images returns the refs present on the node, sorted.
func (f *Fake) Images() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.images))
}

// SetExec sets the function that answers Exec; nil (the default) answers
// every command with exit code 0 and no output.
func (f *Fake) SetExec(fn ExecFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exec = fn
}

// SetHandlesSIGTERM says whether the process of container id exits on
// SIGTERM, so Stop ends it with code 143 instead of 137. It may be set
// before the container exists.
func (f *Fake) SetHandlesSIGTERM(id string, handles bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sigterm[id] = handles
}

// Exit ends the process of running container id with code and sends id on
// the Exits channels, as the runtime's exit event.
func (f *Fake) Exit(id string, code int32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.containers[id]
	if !ok {
		return fmt.Errorf("exit %s: %w", id, agent.ErrNotFound)
	}
	if c.state != agent.StateRunning {
		return fmt.Errorf("exit %s: container is %s, not running", id, c.state)
	}
	f.exited(id, c, code)
	return nil
}

// exited records the end of c's process and announces it; f.mu is held.
func (f *Fake) exited(id string, c *container, code int32) {
	c.state, c.exitCode, c.finishedAt = agent.StateExited, code, f.clock.Now()
	for _, ch := range f.subs {
		select {
		case ch <- id:
		default: // a full reader misses it, as after a runtime reconnect
		}
	}
}

// ExitUnseen ends a running container like Exit but sends no exit event,
// as when the agent's event stream was down at that moment.
func (f *Fake) ExitUnseen(id string, code int32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.containers[id]
	if !ok || c.state != agent.StateRunning {
		return fmt.Errorf("exit %s: %w", id, agent.ErrNotFound)
	}
	c.state, c.exitCode, c.finishedAt = agent.StateExited, code, f.clock.Now()
	return nil
}

// Reconnect tells the Exits readers that events may have been lost, as
// the containerd adapter does after it subscribes again.
func (f *Fake) Reconnect() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ch := range f.subs {
		select {
		case ch <- "":
		default:
		}
	}
}

// Reboot ends every running container the way a node reboot looks to the
// agent afterwards: exited with code 255 and reason agent.ReasonLost,
// finished now (when the runtime adapter first finds it dead), with no
// exit event.
func (f *Fake) Reboot() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.containers {
		if c.state == agent.StateRunning {
			c.state, c.exitCode, c.reason, c.finishedAt = agent.StateExited, 255, agent.ReasonLost, f.clock.Now()
		}
	}
}

// Calls returns the operations that changed something or ran a command,
// oldest first, one a line: "pull REF", "create ID", "start ID",
// "stop ID GRACE", "remove ID", "exec ID CMD...".
func (f *Fake) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// Container returns container id as List would.
func (f *Fake) Container(id string) (agent.Container, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.containers[id]
	if !ok {
		return agent.Container{}, false
	}
	return c.view(id), true
}

// Spec returns the spec container id was created with.
func (f *Fake) Spec(id string) (agent.ContainerSpec, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.containers[id]
	if !ok {
		return agent.ContainerSpec{}, false
	}
	return c.spec, true
}

// Containers returns every container, sorted by ID.
func (f *Fake) Containers() []agent.Container {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.list("")
}

// Dump returns the containers, one a line, sorted by ID:
// "ID STATE attempt=N", then " tty", " stdin" and " stdinOnce" for what
// its spec asks, " spare" for one made as a spare (agent.LabelSpare),
// and " exit=CODE" (and the reason, if any) once exited.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, c := range f.list("") {
		fmt.Fprintf(&b, "%s %s attempt=%s", c.ID, c.State, c.Labels[agent.LabelAttempt])
		spec := f.containers[c.ID].spec
		if spec.TTY {
			b.WriteString(" tty")
		}
		if spec.Stdin {
			b.WriteString(" stdin")
		}
		if spec.StdinOnce {
			b.WriteString(" stdinOnce")
		}
		if c.Labels[agent.LabelSpare] != "" {
			b.WriteString(" spare")
		}
		if c.State == agent.StateExited {
			fmt.Fprintf(&b, " exit=%d", c.ExitCode)
			if c.Reason != "" {
				fmt.Fprintf(&b, " reason=%s", c.Reason)
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// Version returns "fake://1".
func (f *Fake) Version(context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failure(OpVersion); err != nil {
		return "", err
	}
	return "fake://1", nil
}

// EnsureImage returns the image for ref. A missing ref fails with
// agent.ErrImageNeverPull under PullNever, else is pulled if the test put
// it in the registry and fails with agent.ErrImagePull if not. PullAlways
// pulls a present image again when the registry has it.
func (f *Fake) EnsureImage(_ context.Context, ref string, policy corev1.PullPolicy) (agent.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failure(OpEnsureImage); err != nil {
		return agent.Image{}, err
	}
	present, pulled := f.images[ref], false
	switch {
	case policy == corev1.PullNever && !present:
		return agent.Image{}, fmt.Errorf("image %s: %w", ref, agent.ErrImageNeverPull)
	case !present || policy == corev1.PullAlways:
		f.pulls[ref]++
		if f.registry[ref] {
			f.images[ref], pulled = true, true
			f.calls = append(f.calls, "pull "+ref)
		} else if !present {
			return agent.Image{}, fmt.Errorf("pull %s: %w: not in the fake registry", ref, agent.ErrImagePull)
		}
	}
	sum := sha256.Sum256([]byte(ref))
	return agent.Image{Ref: ref, ID: ref + "@sha256:" + hex.EncodeToString(sum[:]), Pulled: pulled}, nil
}

// SpareKey returns the key set by SetSpareKey, "fake" until then.
func (f *Fake) SpareKey() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.spareKey == "" {
		return "fake"
	}
	return f.spareKey
}

// SetSpareKey sets what SpareKey returns, as a runtime whose settings
// changed.
func (f *Fake) SetSpareKey(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.spareKey = key
}

// Create records a created container. Its image must be present.
func (f *Fake) Create(_ context.Context, spec agent.ContainerSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failure(OpCreate); err != nil {
		return err
	}
	if spec.ID == "" {
		return errors.New("create: empty container ID")
	}
	if _, ok := f.containers[spec.ID]; ok {
		return fmt.Errorf("create %s: %w", spec.ID, agent.ErrExists)
	}
	if !f.images[spec.Image.Ref] {
		return fmt.Errorf("create %s: image %q is not present", spec.ID, spec.Image.Ref)
	}
	labels := maps.Clone(spec.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[agent.LabelLogPath] = spec.LogPath
	labels[agent.LabelImageRef] = spec.Image.ID
	f.containers[spec.ID] = &container{spec: spec, labels: labels, state: agent.StateCreated, createdAt: f.clock.Now()}
	f.calls = append(f.calls, "create "+spec.ID)
	return nil
}

// Start starts a created container.
func (f *Fake) Start(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failure(OpStart); err != nil {
		return err
	}
	c, ok := f.containers[id]
	if !ok {
		return fmt.Errorf("start %s: %w", id, agent.ErrNotFound)
	}
	if c.state != agent.StateCreated {
		return fmt.Errorf("start %s: container is %s", id, c.state)
	}
	c.state, c.startedAt = agent.StateRunning, f.clock.Now()
	c.labels[agent.LabelStartedAt] = c.startedAt.UTC().Format(time.RFC3339Nano)
	f.calls = append(f.calls, "start "+id)
	return nil
}

// Stop ends a running container at once with code 137, or 143 if it
// handles SIGTERM, and sends its exit event. grace only shows in Calls.
func (f *Fake) Stop(_ context.Context, id string, grace time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failure(OpStop); err != nil {
		return err
	}
	c, ok := f.containers[id]
	if !ok {
		return fmt.Errorf("stop %s: %w", id, agent.ErrNotFound)
	}
	f.calls = append(f.calls, fmt.Sprintf("stop %s %s", id, grace))
	if c.state != agent.StateRunning {
		return nil
	}
	code := int32(ExitKilled)
	if f.sigterm[id] {
		code = ExitTerminated
	}
	f.exited(id, c, code)
	return nil
}

// Remove deletes a container; an unknown ID is not an error.
func (f *Fake) Remove(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failure(OpRemove); err != nil {
		return err
	}
	if _, ok := f.containers[id]; !ok {
		return nil
	}
	delete(f.containers, id)
	f.calls = append(f.calls, "remove "+id)
	return nil
}

// List returns the containers of pod podUID (by agent.LabelPodUID), or
// all when podUID is "", sorted by ID.
func (f *Fake) List(_ context.Context, podUID string) ([]agent.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failure(OpList); err != nil {
		return nil, err
	}
	return f.list(podUID), nil
}

// list is List without failure injection; f.mu is held.
func (f *Fake) list(podUID string) []agent.Container {
	out := []agent.Container{}
	for id, c := range f.containers {
		if podUID == "" || c.labels[agent.LabelPodUID] == podUID {
			out = append(out, c.view(id))
		}
	}
	slices.SortFunc(out, func(a, b agent.Container) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func (c *container) view(id string) agent.Container {
	v := agent.Container{
		ID: id, Labels: maps.Clone(c.labels), State: c.state, CreatedAt: c.createdAt,
		StartedAt: c.startedAt, FinishedAt: c.finishedAt, Reason: c.reason,
	}
	if c.state == agent.StateExited {
		v.ExitCode = c.exitCode
	}
	return v
}

// Exec runs cmd in a running container through the SetExec function.
func (f *Fake) Exec(ctx context.Context, id string, cmd []string) (int, []byte, error) {
	f.mu.Lock()
	if err := f.failure(OpExec); err != nil {
		f.mu.Unlock()
		return 0, nil, err
	}
	c, ok := f.containers[id]
	if !ok {
		f.mu.Unlock()
		return 0, nil, fmt.Errorf("exec in %s: %w", id, agent.ErrNotFound)
	}
	if c.state != agent.StateRunning {
		f.mu.Unlock()
		return 0, nil, fmt.Errorf("exec in %s: container is %s", id, c.state)
	}
	f.calls = append(f.calls, "exec "+id+" "+strings.Join(cmd, " "))
	fn := f.exec
	f.mu.Unlock()
	if fn == nil {
		return 0, nil, nil
	}
	return fn(ctx, id, slices.Clone(cmd))
}

// Exits returns a channel that receives the ID of each container that
// exits (by Exit or Stop) until ctx ends; it is then closed. Events that
// find the channel's buffer full are dropped.
func (f *Fake) Exits(ctx context.Context) <-chan string {
	ch := make(chan string, 64)
	f.mu.Lock()
	f.subs = append(f.subs, ch)
	f.mu.Unlock()
	context.AfterFunc(ctx, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.subs = slices.DeleteFunc(f.subs, func(c chan string) bool { return c == ch })
		close(ch)
	})
	return ch
}
