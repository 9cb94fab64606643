package containerd

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/containerd/containerd/v2/pkg/cio"
)

// streamBufSize is the buffer each container output stream is copied
// through. cio's own copy holds a 32 KiB buffer per stream for the life
// of the container, 1.9 MiB of heap for 30 one-container pods; reads from
// a FIFO return what the container wrote, so a small buffer only means
// more reads for a container that writes a lot at once.
const streamBufSize = 4 << 10

// streams is a cio.IO that copies a task's stdout and stderr FIFOs to
// writers through small buffers. With a terminal the shim writes the
// terminal's output, stdout and stderr together, to the stdout FIFO alone.
// When the task has a stdin FIFO, streams holds it open for writing and
// writes nothing, so the process's reads wait instead of ending.
type streams struct {
	dio *cio.DirectIO
	wg  sync.WaitGroup
	// mu guards left, the copies still running, and then, what runs
	// when the last one ends (whenDone).
	mu   sync.Mutex
	left int
	then func()
}

// newStreams opens the FIFOs of fifos (stdin for writing, when it has
// one) and starts copying stdout and, without a terminal, stderr to out
// and errOut.
func newStreams(fifos *cio.FIFOSet, out, errOut io.Writer) (*streams, error) {
	dio, err := cio.NewDirectIO(context.Background(), fifos)
	if err != nil {
		return nil, err
	}
	s := &streams{dio: dio}
	type pipe struct {
		w io.Writer
		r io.ReadCloser
	}
	var copies []pipe
	if dio.Stdout != nil {
		copies = append(copies, pipe{out, dio.Stdout})
	}
	if dio.Stderr != nil && !fifos.Terminal {
		copies = append(copies, pipe{errOut, dio.Stderr})
	}
	s.left = len(copies) // before any can end
	for _, c := range copies {
		s.copy(c.w, c.r)
	}
	return s, nil
}

// stdin returns the writing end of the task's stdin FIFO, nil when the
// task has no stdin.
func (s *streams) stdin() io.WriteCloser { return s.dio.Stdin }

func (s *streams) copy(w io.Writer, r io.ReadCloser) {
	s.wg.Add(1)
	go func() {
		defer s.ended()
		defer r.Close()
		buf := make([]byte, streamBufSize)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				if _, werr := w.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
}

// ended is the end of one copy: after the last, what whenDone was given
// runs, on that copy's goroutine.
func (s *streams) ended() {
	s.wg.Done()
	s.mu.Lock()
	s.left--
	var then func()
	if s.left <= 0 {
		then, s.then = s.then, nil
	}
	s.mu.Unlock()
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
func (s *streams) Config() cio.Config { return s.dio.Config() }

// Wait implements cio.IO: it returns when the copies have ended.
func (s *streams) Wait() { s.wg.Wait() }

// Close implements cio.IO: it closes the FIFOs, stdin's writing end with
// them, and removes them.
func (s *streams) Close() error { return s.dio.Close() }

// Cancel implements cio.IO: it stops the copies.
func (s *streams) Cancel() {
	s.dio.Cancel()
	if s.dio.Stdout != nil {
		s.dio.Stdout.Close()
	}
	if s.dio.Stderr != nil {
		s.dio.Stderr.Close()
	}
}

// streamCreator makes a task's IO in dir: new FIFOs copied to out and
// errOut. With terminal the task gets a terminal and one output FIFO;
// with stdin, a stdin FIFO the IO holds open. Without stdin the task's
// stdin is /dev/null, or the terminal, which nothing writes to.
func streamCreator(dir string, terminal, stdin bool, out, errOut io.Writer) cio.Creator {
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
		s, err := newStreams(fifos, out, errOut)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}

// streamAttach reopens a running task's FIFOs, as containerd reports them
// (its stdin, if any, for writing) and copies them to out and errOut.
func streamAttach(out, errOut io.Writer) cio.Attach {
	return func(fifos *cio.FIFOSet) (cio.IO, error) {
		if fifos == nil {
			return nil, errors.New("task has no output FIFOs to attach to")
		}
		s, err := newStreams(fifos, out, errOut)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}
