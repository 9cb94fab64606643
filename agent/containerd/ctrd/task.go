package ctrd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	"github.com/containerd/fifo"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// The calls below follow the v2 client's container, task and process
// (client/container.go, task.go, process.go), without what the agent
// does not use: checkpoints, runtime options but the OCI runtime's name,
// Windows, tracing.

// Container is a container as containerd held it when it was loaded.
type Container struct {
	client *Client
	info   containers.Container
}

// LoadContainer reads the container id.
func (c *Client) LoadContainer(ctx context.Context, id string) (*Container, error) {
	info, err := c.Containers.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return &Container{client: c, info: info}, nil
}

// ListContainers reads the containers that match any of filters.
func (c *Client) ListContainers(ctx context.Context, filters ...string) ([]*Container, error) {
	infos, err := c.Containers.List(ctx, filters...)
	if err != nil {
		return nil, err
	}
	out := make([]*Container, len(infos))
	for i, info := range infos {
		out[i] = &Container{client: c, info: info}
	}
	return out, nil
}

// CreateContainer records container info with spec and returns it.
func (c *Client) CreateContainer(ctx context.Context, info containers.Container, spec *specs.Spec) (*Container, error) {
	a, err := typeurl.MarshalAny(spec)
	if err != nil {
		return nil, fmt.Errorf("container %s: spec: %w", info.ID, err)
	}
	info.Spec = a
	created, err := c.Containers.Create(ctx, info)
	if err != nil {
		return nil, err
	}
	return &Container{client: c, info: created}, nil
}

// ID returns the container's ID.
func (c *Container) ID() string { return c.info.ID }

// Info returns the container as it was loaded.
func (c *Container) Info() containers.Container { return c.info }

// WithoutSpec returns the container as loaded, less its spec: what to
// keep of it when the spec is not needed again.
func (c *Container) WithoutSpec() *Container {
	info := c.info
	info.Spec = nil
	return &Container{client: c.client, info: info}
}

// Refresh reads the container again.
func (c *Container) Refresh(ctx context.Context) (containers.Container, error) {
	info, err := c.client.Containers.Get(ctx, c.info.ID)
	if err != nil {
		return containers.Container{}, err
	}
	c.info = info
	return info, nil
}

// Labels reads the container's labels as containerd holds them now.
func (c *Container) Labels(ctx context.Context) (map[string]string, error) {
	info, err := c.Refresh(ctx)
	if err != nil {
		return nil, err
	}
	return info.Labels, nil
}

// SetLabels sets these labels, leaving the others, and returns all the
// container's labels after the write.
func (c *Container) SetLabels(ctx context.Context, labels map[string]string) (map[string]string, error) {
	paths := make([]string, 0, len(labels))
	for k := range labels {
		paths = append(paths, "labels."+k)
	}
	info, err := c.client.Containers.Update(ctx, containers.Container{ID: c.info.ID, Labels: labels}, paths...)
	if err != nil {
		return nil, err
	}
	return info.Labels, nil
}

// Spec returns the container's OCI spec, which does not change after its
// create.
func (c *Container) Spec() (*specs.Spec, error) {
	if c.info.Spec == nil {
		return nil, fmt.Errorf("container %s: no spec", c.info.ID)
	}
	var s specs.Spec
	if err := json.Unmarshal(c.info.Spec.GetValue(), &s); err != nil {
		return nil, fmt.Errorf("container %s: spec: %w", c.info.ID, err)
	}
	return &s, nil
}

// Delete deletes the container and then its snapshot. A container with a
// task is not deleted.
func (c *Container) Delete(ctx context.Context) error {
	if _, err := c.client.Tasks.Get(ctx, &tasksapi.GetRequest{ContainerID: c.info.ID}); err == nil {
		return fmt.Errorf("container %s has a task: %w", c.info.ID, errdefs.ErrFailedPrecondition)
	}
	if err := c.client.Containers.Delete(ctx, c.info.ID); err != nil {
		return err
	}
	if c.info.SnapshotKey != "" && c.info.Snapshotter != "" {
		err := c.client.SnapshotService(c.info.Snapshotter).Remove(ctx, c.info.SnapshotKey)
		if err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("container %s: remove snapshot: %w", c.info.ID, err)
		}
	}
	return nil
}

// Task loads the container's task. With attach, its IO is attached to
// the FIFOs the task was created with.
func (c *Container) Task(ctx context.Context, attach cio.Attach) (*Task, error) {
	resp, err := c.client.Tasks.Get(ctx, &tasksapi.GetRequest{ContainerID: c.info.ID})
	if err != nil {
		err = Native(err)
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("no running task found: %w", err)
		}
		return nil, err
	}
	t := &Task{client: c.client, id: c.info.ID, pid: resp.Process.Pid}
	if attach != nil && resp.Process.Status != tasktypes.Status_UNKNOWN {
		// A task in an unknown state has no FIFO paths.
		if t.io, err = attach(loadFIFOs(resp)); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// loadFIFOs is the FIFO set of a running task, as the client loads it:
// closing it removes the FIFOs and, if empty, their directories.
func loadFIFOs(resp *tasksapi.GetResponse) *cio.FIFOSet {
	p := resp.Process
	paths := []string{p.Stdin, p.Stdout, p.Stderr}
	closer := func() error {
		var err error
		dirs := map[string]bool{}
		for _, f := range paths {
			if ok, _ := fifo.IsFifo(f); ok {
				if rerr := os.Remove(f); err == nil {
					err = rerr
				}
				dirs[filepath.Dir(f)] = true
			}
		}
		for dir := range dirs {
			os.Remove(dir) // only if empty
		}
		return err
	}
	return cio.NewFIFOSet(cio.Config{Stdin: p.Stdin, Stdout: p.Stdout, Stderr: p.Stderr, Terminal: p.Terminal}, closer)
}

// TaskOpts say how a task is created.
type TaskOpts struct {
	// RuntimePath, if not empty, is the shim binary containerd runs to
	// start the task's shim.
	RuntimePath string
	// OCIRuntime, if not empty, is the OCI runtime the runc shim runs
	// for the task (its BinaryName option) instead of runc.
	OCIRuntime string
	// Rootfs, if not nil, are the mounts of the container's snapshot as
	// its Prepare returned them, so the task's create need not ask the
	// snapshotter for them again.
	Rootfs []mount.Mount
}

// runcOptionsType is the type URL containerd's runc shims know their
// options by: the message's full name, which they look up in the
// protobuf registry as it is (containerd 1.6's gogo-based typeurl has
// no type.googleapis.com/ prefix to strip).
const runcOptionsType = "containerd.runc.v1.Options"

// options are the runc shim's options for a task created with o, or nil
// for the shim's defaults.
func (o TaskOpts) options() (*anypb.Any, error) {
	if o.OCIRuntime == "" {
		return nil, nil
	}
	b, err := proto.Marshal(&runcoptions.Options{BinaryName: o.OCIRuntime})
	if err != nil {
		return nil, fmt.Errorf("runc options: %w", err)
	}
	return &anypb.Any{TypeUrl: runcOptionsType, Value: b}, nil
}

// NewTask creates the container's task on its snapshot's mounts, with IO
// from create, as opts say.
func (c *Container) NewTask(ctx context.Context, create cio.Creator, opts TaskOpts) (_ *Task, err error) {
	options, err := opts.options()
	if err != nil {
		return nil, err
	}
	i, err := create(c.info.ID)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			i.Cancel()
			i.Close()
		}
	}()
	cfg := i.Config()
	req := &tasksapi.CreateTaskRequest{
		ContainerID: c.info.ID, Terminal: cfg.Terminal,
		Stdin: cfg.Stdin, Stdout: cfg.Stdout, Stderr: cfg.Stderr,
		RuntimePath: opts.RuntimePath, Options: options,
	}
	if opts.Rootfs != nil {
		for _, m := range opts.Rootfs {
			req.Rootfs = append(req.Rootfs, &types.Mount{Type: m.Type, Source: m.Source, Target: m.Target, Options: m.Options})
		}
	} else if c.info.SnapshotKey != "" {
		if c.info.Snapshotter == "" {
			return nil, fmt.Errorf("container %s: snapshot without snapshotter: %w", c.info.ID, errdefs.ErrInvalidArgument)
		}
		mounts, err := c.client.SnapshotService(c.info.Snapshotter).Mounts(ctx, c.info.SnapshotKey)
		if err != nil {
			return nil, err
		}
		for _, m := range mounts {
			req.Rootfs = append(req.Rootfs, &types.Mount{Type: m.Type, Source: m.Source, Target: m.Target, Options: m.Options})
		}
	}
	resp, err := c.client.Tasks.Create(ctx, req)
	if err != nil {
		return nil, Native(err)
	}
	return &Task{client: c.client, id: c.info.ID, pid: resp.Pid, io: i}, nil
}

// ExitStatus is how a task or process ended.
type ExitStatus struct {
	Code     uint32
	ExitedAt time.Time
	// Err is why the wait for it failed, if it did; Code is then
	// UnknownExitStatus.
	Err error
}

// UnknownExitStatus is the code of an exit whose wait failed.
const UnknownExitStatus = 255

// Task is a container's task: its init process.
type Task struct {
	client *Client
	id     string
	pid    uint32
	io     cio.IO
}

// Pid returns the task's process ID.
func (t *Task) Pid() uint32 { return t.pid }

// IO returns the task's IO, nil for a task loaded without attaching.
func (t *Task) IO() cio.IO { return t.io }

// Start starts the task's process.
func (t *Task) Start(ctx context.Context) error {
	r, err := t.client.Tasks.Start(ctx, &tasksapi.StartRequest{ContainerID: t.id})
	if err != nil {
		if t.io != nil {
			t.io.Cancel()
			t.io.Close()
		}
		return Native(err)
	}
	t.pid = r.Pid
	return nil
}

// Status returns the task's state.
func (t *Task) Status(ctx context.Context) (tasktypes.Status, error) {
	r, err := t.client.Tasks.Get(ctx, &tasksapi.GetRequest{ContainerID: t.id})
	if err != nil {
		return tasktypes.Status_UNKNOWN, Native(err)
	}
	return r.Process.Status, nil
}

// Wait returns a channel that gives the task's exit once it has exited
// (or the wait fails, or ctx ends).
func (t *Task) Wait(ctx context.Context) (<-chan ExitStatus, error) {
	return t.client.wait(ctx, t.id, ""), nil
}

func (c *Client) wait(ctx context.Context, id, execID string) <-chan ExitStatus {
	ch := make(chan ExitStatus, 1)
	go func() {
		defer close(ch)
		r, err := c.Tasks.Wait(ctx, &tasksapi.WaitRequest{ContainerID: id, ExecID: execID})
		if err != nil {
			ch <- ExitStatus{Code: UnknownExitStatus, Err: Native(err)}
			return
		}
		ch <- ExitStatus{Code: r.ExitStatus, ExitedAt: r.ExitedAt.AsTime()}
	}()
	return ch
}

// Kill sends sig to the task's process, or with all to every process in
// the container.
func (t *Task) Kill(ctx context.Context, sig syscall.Signal, all bool) error {
	return t.client.kill(ctx, t.id, "", sig, all)
}

func (c *Client) kill(ctx context.Context, id, execID string, sig syscall.Signal, all bool) error {
	_, err := c.Tasks.Kill(ctx, &tasksapi.KillRequest{ContainerID: id, ExecID: execID, Signal: uint32(sig), All: all})
	return Native(err)
}

// Resize sets the size of the task's terminal.
func (t *Task) Resize(ctx context.Context, w, h uint32) error {
	_, err := t.client.Tasks.ResizePty(ctx, &tasksapi.ResizePtyRequest{ContainerID: t.id, Width: w, Height: h})
	return Native(err)
}

// Delete deletes the task, which must have ended, and returns its exit.
// With kill, its processes are killed first and waited for. The task's
// IO is drained before the delete and closed after it.
func (t *Task) Delete(ctx context.Context, kill bool) (*ExitStatus, error) {
	if kill && t.pid != 0 {
		if err := t.client.killAndWait(ctx, t.id, ""); err != nil {
			return nil, err
		}
	}
	r, err := t.client.Tasks.Get(ctx, &tasksapi.GetRequest{ContainerID: t.id})
	if err != nil {
		if err = Native(err); errdefs.IsNotFound(err) {
			return nil, err
		}
	} else {
		switch r.Process.Status {
		case tasktypes.Status_STOPPED, tasktypes.Status_UNKNOWN:
		case tasktypes.Status_CREATED:
			if t.pid != 0 {
				return nil, fmt.Errorf("task %s must be stopped before deletion: created: %w", t.id, errdefs.ErrFailedPrecondition)
			}
		default:
			return nil, fmt.Errorf("task %s must be stopped before deletion: %s: %w", t.id, r.Process.Status, errdefs.ErrFailedPrecondition)
		}
	}
	if t.io != nil {
		// Cancel stops an open of the FIFOs still under way; the copies
		// end when the shim closes its side, so no output is lost.
		t.io.Cancel()
		t.io.Wait()
	}
	d, err := t.client.Tasks.Delete(ctx, &tasksapi.DeleteTaskRequest{ContainerID: t.id})
	if err != nil {
		return nil, Native(err)
	}
	if t.io != nil {
		t.io.Close()
	}
	return &ExitStatus{Code: d.ExitStatus, ExitedAt: d.ExitedAt.AsTime()}, nil
}

// killAndWait kills a process (with every process of the container for
// the task) and waits for it to exit, as the client's WithProcessKill.
func (c *Client) killAndWait(ctx context.Context, id, execID string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	exited := c.wait(ctx, id, execID)
	if err := c.kill(ctx, id, execID, syscall.SIGKILL, true); err != nil {
		if errdefs.IsFailedPrecondition(err) {
			return nil
		}
		if !errdefs.IsNotFound(err) {
			return err
		}
		// Not found may come for a process just killed: wait for it.
	}
	select {
	case <-exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Exec creates process id in the task's container, with IO from create.
func (t *Task) Exec(ctx context.Context, id string, spec *specs.Process, create cio.Creator) (_ *Process, err error) {
	if id == "" {
		return nil, fmt.Errorf("exec in %s: no exec id: %w", t.id, errdefs.ErrInvalidArgument)
	}
	i, err := create(id)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			i.Cancel()
			i.Close()
		}
	}()
	pspec, err := typeurl.MarshalAnyToProto(spec)
	if err != nil {
		return nil, fmt.Errorf("exec in %s: %w", t.id, err)
	}
	cfg := i.Config()
	_, err = t.client.Tasks.Exec(ctx, &tasksapi.ExecProcessRequest{
		ContainerID: t.id, ExecID: id, Terminal: cfg.Terminal,
		Stdin: cfg.Stdin, Stdout: cfg.Stdout, Stderr: cfg.Stderr, Spec: pspec,
	})
	if err != nil {
		i.Cancel()
		i.Wait()
		return nil, Native(err)
	}
	return &Process{task: t, id: id, io: i}, nil
}

// Process is a process exec'd in a task's container.
type Process struct {
	task *Task
	id   string
	pid  uint32
	io   cio.IO
}

// IO returns the process's IO.
func (p *Process) IO() cio.IO { return p.io }

// Start starts the process.
func (p *Process) Start(ctx context.Context) error {
	r, err := p.task.client.Tasks.Start(ctx, &tasksapi.StartRequest{ContainerID: p.task.id, ExecID: p.id})
	if err != nil {
		p.io.Cancel()
		p.io.Wait()
		p.io.Close()
		return Native(err)
	}
	p.pid = r.Pid
	return nil
}

// Wait returns a channel that gives the process's exit once it has
// exited (or the wait fails, or ctx ends).
func (p *Process) Wait(ctx context.Context) (<-chan ExitStatus, error) {
	return p.task.client.wait(ctx, p.task.id, p.id), nil
}

// Kill sends sig to the process.
func (p *Process) Kill(ctx context.Context, sig syscall.Signal) error {
	return p.task.client.kill(ctx, p.task.id, p.id, sig, false)
}

// CloseIO closes the process's stdin in the shim.
func (p *Process) CloseIO(ctx context.Context) error {
	_, err := p.task.client.Tasks.CloseIO(ctx, &tasksapi.CloseIORequest{ContainerID: p.task.id, ExecID: p.id, Stdin: true})
	return Native(err)
}

// Resize sets the size of the process's terminal.
func (p *Process) Resize(ctx context.Context, w, h uint32) error {
	_, err := p.task.client.Tasks.ResizePty(ctx, &tasksapi.ResizePtyRequest{ContainerID: p.task.id, ExecID: p.id, Width: w, Height: h})
	return Native(err)
}

// Delete deletes the process, killing it first with kill, and returns
// its exit; then its IO is drained and closed.
func (p *Process) Delete(ctx context.Context, kill bool) (*ExitStatus, error) {
	if kill && p.pid != 0 {
		if err := p.task.client.killAndWait(ctx, p.task.id, p.id); err != nil {
			return nil, err
		}
	}
	r, err := p.task.client.Tasks.DeleteProcess(ctx, &tasksapi.DeleteProcessRequest{ContainerID: p.task.id, ExecID: p.id})
	if err != nil {
		return nil, Native(err)
	}
	if p.io != nil {
		p.io.Cancel()
		p.io.Wait()
		p.io.Close()
	}
	return &ExitStatus{Code: r.ExitStatus, ExitedAt: r.ExitedAt.AsTime()}, nil
}
