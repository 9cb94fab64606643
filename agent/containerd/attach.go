package containerd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"

	"github.com/containerd/containerd/v2/pkg/cio"

	"github.com/outpost-edge/outpost/agent"
)

// output is what an attach joins: a running container's output streams
// and whether its stdin closes after the first attach.
type output struct {
	out, errOut *lockedStream
	stdinOnce   bool
	done        chan struct{} // closed when the task's IO has ended
}

// ExecStream runs cmd in the running container id with the caller's
// streams, as kubectl exec does, and returns the command's exit code.
// With s.TTY the process gets a terminal whose output goes to s.Stdout
// and whose size follows s.Resize. When ctx ends the process is killed.
func (r *Runtime) ExecStream(ctx context.Context, id string, cmd []string, s agent.StreamIO) (int, error) {
	ctx = r.ctx(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("exec in %s: %w", id, notFound(err))
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("exec in %s: %w", id, notFound(err))
	}
	spec, err := c.Spec()
	if err != nil {
		return 0, fmt.Errorf("exec in %s: %w", id, err)
	}
	proc := *spec.Process
	proc.Args, proc.Terminal = cmd, s.TTY
	var stdin io.Reader
	var in *stdinCloser
	if s.Stdin != nil {
		// The shim keeps the process's stdin open after the FIFO's
		// writer goes: when the client's input ends, CloseIO tells it
		// to close it, so a command reading to the end (wc, cat) ends.
		in = &stdinCloser{r: s.Stdin, ready: make(chan struct{}), close: func() {}}
		stdin = in
		defer in.arm(nil) // a process that never started has nothing to close
	}
	var stdout, stderr io.Writer = io.Discard, io.Discard
	if s.Stdout != nil {
		stdout = s.Stdout
	}
	if s.Stderr != nil && !s.TTY {
		stderr = s.Stderr
	}
	opts := []cio.Opt{cio.WithFIFODir(r.cfg.FIFODir), cio.WithStreams(stdin, stdout, stderr)}
	if s.TTY {
		opts = append(opts, cio.WithTerminal)
	}
	execID := fmt.Sprintf("exec-%d", r.deps.Clock.Now().UnixNano())
	p, err := task.Exec(ctx, execID, &proc, cio.NewCreator(opts...))
	if err != nil {
		return 0, fmt.Errorf("exec in %s: %w", id, err)
	}
	defer p.Delete(context.WithoutCancel(ctx), true)
	exitc, err := p.Wait(ctx)
	if err != nil {
		return 0, fmt.Errorf("exec in %s: %w", id, err)
	}
	if err := p.Start(ctx); err != nil {
		return 0, fmt.Errorf("exec in %s: %w", id, err)
	}
	if in != nil {
		in.arm(func() { p.CloseIO(context.WithoutCancel(ctx)) })
	}
	resizeDone := make(chan struct{})
	defer close(resizeDone)
	if s.TTY && s.Resize != nil {
		go func() {
			for {
				select {
				case sz, ok := <-s.Resize:
					if !ok {
						return
					}
					p.Resize(ctx, uint32(sz.Width), uint32(sz.Height))
				case <-resizeDone:
					return
				}
			}
		}()
	}
	select {
	case st := <-exitc:
		p.IO().Wait()
		return int(st.Code), nil
	case <-ctx.Done():
		p.Kill(context.WithoutCancel(ctx), syscall.SIGKILL)
		return 0, fmt.Errorf("exec in %s: %w", id, ctx.Err())
	}
}

// stdinCloser passes the client's stdin through and, at its end, calls
// close once the process has started.
type stdinCloser struct {
	r       io.Reader
	ready   chan struct{}
	close   func()
	once    sync.Once
	armOnce sync.Once
}

// arm sets what closes the stdin (nil: nothing) and lets it run.
func (s *stdinCloser) arm(closer func()) {
	s.armOnce.Do(func() {
		if closer != nil {
			s.close = closer
		}
		close(s.ready)
	})
}

func (s *stdinCloser) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil {
		s.once.Do(func() {
			go func() {
				<-s.ready
				s.close()
			}()
		})
	}
	return n, err
}

// Attach joins the running container id's output and, when the container
// has stdin and s.Stdin is set, writes s.Stdin to it, until ctx ends or
// the container exits. A container with stdinOnce has its stdin closed
// when the first attach with stdin ends, as kubelet's runtimes do.
func (r *Runtime) Attach(ctx context.Context, id string, s agent.StreamIO) error {
	r.mu.Lock()
	o := r.outputs[id]
	in := r.stdin[id]
	r.mu.Unlock()
	if o == nil {
		return fmt.Errorf("attach to %s: %w: it is not running", id, agent.ErrNotFound)
	}
	gone := make(chan struct{})
	var goneOnce sync.Once
	leave := func() { goneOnce.Do(func() { close(gone) }) }
	// The output reaches the client through a queue and a goroutine of
	// its own: it is written on the goroutine that copies every
	// container's output, which a slow client must not hold up.
	var queues sync.WaitGroup
	var unjoin []func()
	finish := make(chan struct{})
	defer func() {
		for _, f := range unjoin {
			f() // nothing more is queued
		}
		close(finish) // the queues write what they hold, and stop
		queues.Wait()
	}()
	follow := func(st *lockedStream, w io.Writer) {
		q := newAttachQueue(w, leave)
		queues.Go(func() { q.run(finish) })
		unjoin = append(unjoin, st.join(q))
	}
	if s.Stdout != nil {
		follow(o.out, s.Stdout)
	}
	if s.Stderr != nil && !s.TTY {
		follow(o.errOut, s.Stderr)
	}
	if s.Stdin != nil && in != nil {
		go func() {
			_, err := io.Copy(in, s.Stdin)
			if o.stdinOnce {
				in.Close()
			}
			if err != nil && !errors.Is(err, io.ErrClosedPipe) {
				r.deps.Log.Debug("attach stdin", "container", id, "err", err)
			}
			// The client's input ended: it has gone, as kubectl attach
			// closes its streams together.
			leave()
		}()
	}
	if s.TTY && s.Resize != nil {
		go r.resizeTask(ctx, id, s.Resize, o.done)
	}
	select {
	case <-ctx.Done():
	case <-o.done:
	case <-gone:
	}
	return nil
}

// attachQueueBytes is how much output an attached client may have
// waiting before it is taken as gone: a client that reads slower than the
// container writes is dropped rather than left to hold up the logs.
const attachQueueBytes = 1 << 20

// attachQueue passes a container's output to an attached client on a
// goroutine of its own (run). Write copies and queues; the client's
// first failed write, or a full queue, calls failed: it has gone.
type attachQueue struct {
	w      io.Writer
	failed func()
	wake   chan struct{} // a token when bufs has something

	mu   sync.Mutex
	bufs [][]byte
	n    int  // bytes in bufs
	dead bool // failed has been called
}

func newAttachQueue(w io.Writer, failed func()) *attachQueue {
	return &attachQueue{w: w, failed: failed, wake: make(chan struct{}, 1)}
}

var errAttachGone = errors.New("attached client gone or too slow")

// Write queues a copy of p for the client.
func (q *attachQueue) Write(p []byte) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return 0, errAttachGone
	}
	if q.n+len(p) > attachQueueBytes {
		q.dead = true
		q.failed()
		return 0, errAttachGone
	}
	q.bufs = append(q.bufs, bytes.Clone(p))
	q.n += len(p)
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return len(p), nil
}

// run writes what is queued to the client until finish is closed, and
// then what is left.
func (q *attachQueue) run(finish <-chan struct{}) {
	for {
		select {
		case <-q.wake:
			if !q.flush() {
				return
			}
		case <-finish:
			q.flush()
			return
		}
	}
}

// flush writes what is queued; false once the client has failed.
func (q *attachQueue) flush() bool {
	for {
		q.mu.Lock()
		bufs, dead := q.bufs, q.dead
		q.bufs, q.n = nil, 0
		q.mu.Unlock()
		if dead {
			return false
		}
		if len(bufs) == 0 {
			return true
		}
		for _, b := range bufs {
			if _, err := q.w.Write(b); err != nil {
				q.mu.Lock()
				q.dead = true
				q.mu.Unlock()
				q.failed()
				return false
			}
		}
	}
}

// resizeTask applies terminal sizes to the container's task until done.
func (r *Runtime) resizeTask(ctx context.Context, id string, sizes <-chan agent.TermSize, done <-chan struct{}) {
	ctx = r.ctx(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		return
	}
	for {
		select {
		case sz, ok := <-sizes:
			if !ok {
				return
			}
			task.Resize(ctx, uint32(sz.Width), uint32(sz.Height))
		case <-done:
			return
		case <-ctx.Done():
			return
		}
	}
}
