package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"

	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/fifo"

	"github.com/outpost-edge/outpost/internal/outpoll"
)

// streams is a cio.IO that copies a task's stdout and stderr FIFOs to
// writers through the Runtime's poller (internal/outpoll): one goroutine
// and one buffer copy every container's output. With a terminal the shim
// writes the terminal's output, stdout and stderr together, to the stdout
// FIFO alone. When the task has a stdin FIFO, streams holds it open for
// writing and writes nothing, so the process's reads wait instead of
// ending.
type streams struct {
	fifos *cio.FIFOSet
	in    io.WriteCloser // the stdin FIFO's writing end, or nil
	pipes []*outpoll.Pipe
	done  chan struct{} // closed when the last copy has ended
	// mu guards left, the copies still running, and then, what runs
	// when the last one ends (whenDone).
	mu   sync.Mutex
	left int
	then func()
}

// newStreams opens the FIFOs of fifos (stdin for writing, when it has
// one) and has poll copy stdout and, without a terminal, stderr to out
// and errOut.
func newStreams(poll *outpoll.Poller, fifos *cio.FIFOSet, out, errOut io.Writer) (*streams, error) {
	s := &streams{fifos: fifos, done: make(chan struct{})}
	type fifoCopy struct {
		path string
		w    io.Writer
	}
	var copies []fifoCopy
	if fifos.Stdout != "" {
		copies = append(copies, fifoCopy{fifos.Stdout, out})
	}
	if fifos.Stderr != "" && !fifos.Terminal {
		copies = append(copies, fifoCopy{fifos.Stderr, errOut})
	}
	s.left = len(copies) // before any can end
	if s.left == 0 {
		close(s.done)
	}
	if fifos.Stdin != "" {
		// The shim opens its reading end when the task is created: the
		// open completes then, and writes wait for it.
		in, err := fifo.OpenFifo(context.Background(), fifos.Stdin, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_NONBLOCK, 0o700)
		if err != nil {
			return nil, fmt.Errorf("stdin fifo: %w", err)
		}
		s.in = in
	}
	for _, c := range copies {
		pp, err := poll.Open(c.path, c.w, s.ended)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.pipes = append(s.pipes, pp)
	}
	return s, nil
}

// stdin returns the writing end of the task's stdin FIFO, nil when the
// task has no stdin.
func (s *streams) stdin() io.WriteCloser { return s.in }

// ended is the end of one copy: after the last, what whenDone was given
// runs, on that copy's goroutine.
func (s *streams) ended() {
	s.mu.Lock()
	s.left--
	var then func()
	last := s.left == 0
	if last {
		then, s.then = s.then, nil
	}
	s.mu.Unlock()
	if last {
		close(s.done)
	}
	if then != nil {
		then()
	}
}

// whenDone runs f once the copies have ended (at once if they have), on
// the goroutine of the last: a task's IO needs no goroutine of its own
// to wait for its end.
func (s *streams) whenDone(f func()) {
	s.mu.Lock()
	if s.left > 0 {
		s.then = f
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	f()
}

// Config implements cio.IO.
func (s *streams) Config() cio.Config {
	return cio.Config{Terminal: s.fifos.Terminal, Stdin: s.fifos.Stdin, Stdout: s.fifos.Stdout, Stderr: s.fifos.Stderr}
}

// Wait implements cio.IO: it returns when the copies have ended.
func (s *streams) Wait() { <-s.done }

// Close implements cio.IO: it closes the FIFOs, stdin's writing end with
// them, and removes them.
func (s *streams) Close() error {
	var err error
	if s.in != nil {
		err = s.in.Close()
	}
	s.Cancel()
	if ferr := s.fifos.Close(); err == nil {
		err = ferr
	}
	return err
}

// Cancel implements cio.IO: it stops the copies.
func (s *streams) Cancel() {
	for _, pp := range s.pipes {
		pp.Close()
	}
}

// streamCreator makes a task's IO in dir: new FIFOs copied to out and
// errOut. With terminal the task gets a terminal and one output FIFO;
// with stdin, a stdin FIFO the IO holds open. Without stdin the task's
// stdin is /dev/null, or the terminal, which nothing writes to.
func streamCreator(poll *outpoll.Poller, dir string, terminal, stdin bool, out, errOut io.Writer) cio.Creator {
	return func(id string) (cio.IO, error) {
		fifos, err := cio.NewFIFOSetInDir(dir, id, terminal)
		if err != nil {
			return nil, err
		}
		if !stdin {
			fifos.Stdin = ""
		}
		if terminal {
			fifos.Stderr = "" // the terminal is stdout and stderr both
		}
		s, err := newStreams(poll, fifos, out, errOut)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}

// streamAttach reopens a running task's FIFOs, as containerd reports them
// (its stdin, if any, for writing) and copies them to out and errOut.
func streamAttach(poll *outpoll.Poller, out, errOut io.Writer) cio.Attach {
	return func(fifos *cio.FIFOSet) (cio.IO, error) {
		if fifos == nil {
			return nil, errors.New("task has no output FIFOs to attach to")
		}
		s, err := newStreams(poll, fifos, out, errOut)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}
