//go:build linux

package outpoll

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/internal/waittest"
)

// sink is a writer the test reads while the poller writes.
type sink struct {
	mu   sync.Mutex
	b    bytes.Buffer
	fail bool
}

func (s *sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return 0, errors.New("sink failed")
	}
	return s.b.Write(p)
}

func (s *sink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newPoller(t *testing.T) *Poller {
	t.Helper()
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// writer opens path for writing, as a shim does once the FIFO's reader
// has it open.
func writer(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

var poll = waittest.Poll{Timeout: 10 * time.Second, Every: time.Millisecond}

func waitFor(t *testing.T, s *sink, want string) {
	t.Helper()
	poll.For(t, fmt.Sprintf("%q copied", want), func() (bool, string) {
		got := s.String()
		return got == want, got
	})
}

func isDone(pp *Pipe) bool {
	select {
	case <-pp.Done():
		return true
	default:
		return false
	}
}

func TestCopiesManyFIFOsFromOneGoroutine(t *testing.T) {
	p := newPoller(t)
	dir := t.TempDir()
	const n = 40
	before := runtime.NumGoroutine()
	var sinks []*sink
	var pipes []*Pipe
	var ended sync.WaitGroup
	for i := range n {
		s := &sink{}
		ended.Add(1)
		pp, err := p.Open(filepath.Join(dir, fmt.Sprint(i)), s, ended.Done)
		if err != nil {
			t.Fatal(err)
		}
		sinks, pipes = append(sinks, s), append(pipes, pp)
	}
	if g := runtime.NumGoroutine(); g > before {
		t.Errorf("%d goroutines after opening %d FIFOs, %d before", g, n, before)
	}
	var ws []*os.File
	for i := range n {
		ws = append(ws, writer(t, filepath.Join(dir, fmt.Sprint(i))))
	}
	big := strings.Repeat("x", 3*bufSize+17) // more than one wake-up's reads
	for i, w := range ws {
		fmt.Fprintf(w, "hello %d\n", i)
		if i == 0 {
			w.WriteString(big)
		}
	}
	for i, s := range sinks {
		want := fmt.Sprintf("hello %d\n", i)
		if i == 0 {
			want += big
		}
		waitFor(t, s, want)
	}
	for i, pp := range pipes {
		if isDone(pp) {
			t.Fatalf("pipe %d ended while its writer is open", i)
		}
	}
	for _, w := range ws {
		w.Close()
	}
	ended.Wait() // each onEnd ran once the writer went
	for i, pp := range pipes {
		if !isDone(pp) {
			t.Errorf("pipe %d: onEnd ran, Done not closed", i)
		}
	}
}

// A FIFO opened before any writer has come must not read as ended: the
// shim opens its end after the agent opens the reading end.
func TestFIFOWithoutWriterYetIsNotEnded(t *testing.T) {
	p := newPoller(t)
	dir := t.TempDir()
	early, err := p.Open(filepath.Join(dir, "early"), &sink{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Two rounds of another FIFO's events: whatever the set said of
	// early when it was added has been handled by the second.
	other := &sink{}
	if _, err := p.Open(filepath.Join(dir, "other"), other, nil); err != nil {
		t.Fatal(err)
	}
	w := writer(t, filepath.Join(dir, "other"))
	w.WriteString("a")
	waitFor(t, other, "a")
	w.WriteString("b")
	waitFor(t, other, "ab")
	if isDone(early) {
		t.Fatal("a FIFO no writer has opened yet was taken as ended")
	}
	s := &sink{}
	late, err := p.Open(filepath.Join(dir, "early"), s, nil) // a second reader of the same FIFO is fine
	if err != nil {
		t.Fatal(err)
	}
	late.Close()
	early.Close()
}

func TestFailedWriteEndsThePipe(t *testing.T) {
	p := newPoller(t)
	path := filepath.Join(t.TempDir(), "out")
	s := &sink{fail: true}
	ended := make(chan struct{})
	pp, err := p.Open(path, s, func() { close(ended) })
	if err != nil {
		t.Fatal(err)
	}
	writer(t, path).WriteString("lost\n")
	<-ended
	<-pp.Done()
}

func TestCloseEndsPipesAndLoop(t *testing.T) {
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ended := make(chan int, 3)
	var pipes []*Pipe
	for i := range 3 {
		pp, err := p.Open(filepath.Join(dir, fmt.Sprint(i)), &sink{}, func() { ended <- i })
		if err != nil {
			t.Fatal(err)
		}
		pipes = append(pipes, pp)
	}
	writer(t, filepath.Join(dir, "0")) // a writer still open does not hold it
	pipes[1].Close()
	pipes[1].Close() // twice is fine
	if i := <-ended; i != 1 {
		t.Fatalf("pipe %d's onEnd ran, want 1's", i)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for i, pp := range pipes {
		if !isDone(pp) {
			t.Errorf("pipe %d not done after Close", i)
		}
	}
	// The Poller's Close ran no onEnd: the FIFOs' owner is going away.
	if len(ended) != 0 {
		t.Fatalf("onEnd of pipe %d ran at the Poller's Close", <-ended)
	}
	p.Close() // twice is fine
	if _, err := p.Open(filepath.Join(dir, "3"), &sink{}, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Open after Close: got %v, want ErrClosed", err)
	}
}

// A container writing without pause does not keep the others' output
// waiting: each wake-up reads a bounded amount of each ready FIFO.
func TestBusyFIFODoesNotStarveOthers(t *testing.T) {
	p := newPoller(t)
	dir := t.TempDir()
	busy, quiet := filepath.Join(dir, "busy"), filepath.Join(dir, "quiet")
	if _, err := p.Open(busy, io.Discard, nil); err != nil {
		t.Fatal(err)
	}
	q := &sink{}
	if _, err := p.Open(quiet, q, nil); err != nil {
		t.Fatal(err)
	}
	bw := writer(t, busy)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		chunk := bytes.Repeat([]byte("y"), 64<<10)
		for {
			select {
			case <-stop:
				return
			default:
			}
			bw.Write(chunk)
		}
	})
	defer wg.Wait()
	defer close(stop)
	qw := writer(t, quiet)
	for i := range 20 {
		fmt.Fprintf(qw, "%d\n", i)
	}
	var want strings.Builder
	for i := range 20 {
		fmt.Fprintf(&want, "%d\n", i)
	}
	waitFor(t, q, want.String())
}

func TestOpenRefusesWhatIsNotAFIFO(t *testing.T) {
	p := newPoller(t)
	path := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Open(path, &sink{}, nil); err == nil || !strings.Contains(err.Error(), "not a FIFO") {
		t.Fatalf("Open of a regular file: got %v", err)
	}
}
