package memtrim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/internal/waittest"
)

// rssFile returns this process's file-backed resident memory, in kB.
func rssFile(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "RssFile:"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// Trim unmaps the executable's pages (the test binary's here), and the
// program runs on, its code and data read back from the file.
func TestTrimUnmapsTheExecutableAndRunsOn(t *testing.T) {
	before := rssFile(t)
	n, err := Trim()
	if err != nil {
		t.Fatal(err)
	}
	after := rssFile(t)
	t.Logf("advised %d KiB away; RssFile %d → %d kB", n>>10, before, after)
	if n == 0 {
		t.Fatal("nothing of the executable advised away")
	}
	if after >= before {
		t.Errorf("RssFile %d kB after Trim, was %d kB", after, before)
	}
	// Code and read-only data come back as they were.
	if got := strconv.Quote("still here"); got != `"still here"` {
		t.Errorf("after Trim: %s", got)
	}
}

// Run trims after the quiet time from its start, and after a change
// once it has quieted again; not while changes keep coming. Quiet on, it
// returns the free heap every quiet time.
func TestRunTrimsWhenQuiet(t *testing.T) {
	clk := clocktest.New(time.Unix(0, 0))
	changes := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	out := &syncWriter{b: &strings.Builder{}}
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	go func() { Run(ctx, changes, clk, 10*time.Second, log, GC{}); close(done) }()
	trims := func() int { return strings.Count(out.String(), "trimmed memory") }
	spin.For(t, "Run waiting on the clock", func() (bool, string) {
		n := clk.Waiters()
		return n == 1, fmt.Sprintf("%d waiters", n)
	})
	clk.Advance(9 * time.Second)
	// A change before the first trim moves it. The second send returns
	// once Run is back waiting, the first change's timer reset (due at
	// 19 s); the second's reset may come after the next advance (due at
	// 28 s then), so the trim is waited for at 28 s.
	changes <- struct{}{}
	changes <- struct{}{}
	clk.Advance(9 * time.Second)
	if trims() != 0 {
		t.Fatalf("trimmed %d times while changes came", trims())
	}
	clk.Advance(10 * time.Second)
	spin.For(t, "one trim", func() (bool, string) { return trims() == 1, fmt.Sprintf("log %q", out.String()) })
	// Quiet on, the free heap goes back every quiet; no second trim.
	returns := func() int { return strings.Count(out.String(), "returned the heap's free pages") }
	spin.For(t, "Run waiting on the clock after the trim", func() (bool, string) {
		n := clk.Waiters()
		return n == 1, fmt.Sprintf("%d waiters", n)
	})
	clk.Advance(10 * time.Second)
	spin.For(t, "the free heap returned", func() (bool, string) { return returns() == 1, fmt.Sprintf("log %q", out.String()) })
	if trims() != 1 {
		t.Errorf("trimmed %d times while quiet; want once", trims())
	}
	cancel()
	<-done
}

// syncWriter is a strings.Builder the test reads while Run logs.
type syncWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// spin looks for what Run does between the fake clock's steps.
var spin = waittest.Poll{Timeout: 5 * time.Second, Every: time.Millisecond}

// mapping is a read-only shared mapping of a file that unmaps its own
// pages, as the store does bbolt's.
type mapping []byte

func (m mapping) Unmap() error { return unix.Madvise(m, unix.MADV_DONTNEED) }

type failing struct{}

func (failing) Unmap() error { return errors.New("no") }

// Trim has each file it is given unmap its pages (they read back as they
// were), and says the first that failed after trying them all.
func TestTrimUnmapsTheFilesGiven(t *testing.T) {
	path := t.TempDir() + "/data"
	want := strings.Repeat("outpost ", 1<<18) // 2 MiB
	if err := os.WriteFile(path, []byte(want), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), 0, len(want), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	if string(m) != want { // every page mapped
		t.Fatal("mapping differs from the file")
	}
	before := rssFile(t)
	if _, err := Trim(failing{}, mapping(m)); err == nil || err.Error() != "no" {
		t.Fatalf("Trim with a file that failed: %v", err)
	}
	after := rssFile(t)
	t.Logf("RssFile %d → %d kB", before, after)
	if before-after < int64(len(want))>>10 {
		t.Errorf("RssFile went from %d to %d kB, want it %d kB lower at least", before, after, len(want)>>10)
	}
	if string(m) != want {
		t.Errorf("after Trim the mapping differs from the file")
	}
}

// Threads a burst of blocking system calls made are ended by Trim, down
// to about GOMAXPROCS and spareThreads, and the program runs on.
func TestTrimEndsIdleThreads(t *testing.T) {
	// 24 goroutines blocked in read(2) on a pipe at once, each holding a
	// thread, until the test writes them a byte each.
	var p [2]int
	if err := unix.Pipe(p[:]); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	const blocked = 24
	var wg sync.WaitGroup
	for range blocked {
		wg.Go(func() { unix.Read(p[0], make([]byte, 1)) })
	}
	slow := waittest.Poll{Timeout: 30 * time.Second, Every: time.Millisecond}
	slow.For(t, "a thread for each blocked read", func() (bool, string) {
		n := threadCount()
		return n >= blocked, fmt.Sprintf("%d threads", n)
	})
	unix.Write(p[1], make([]byte, blocked))
	wg.Wait()
	before := threadCount()
	if _, err := Trim(); err != nil {
		t.Fatal(err)
	}
	after := threadCount()
	t.Logf("threads %d → %d (GOMAXPROCS %d)", before, after, runtime.GOMAXPROCS(0))
	if limit := runtime.GOMAXPROCS(0) + spareThreads + 2; after > limit {
		t.Errorf("%d threads after Trim, want at most %d", after, limit)
	}
	// Still able to run goroutines and block in system calls.
	done := make(chan struct{})
	go func() {
		ts := unix.NsecToTimespec(int64(time.Millisecond))
		unix.Nanosleep(&ts, nil)
		close(done)
	}()
	<-done
}

// Run sets GOGC to the idle percent when it trims, and back to the busy
// one at the next change.
func TestRunSetsTheIdleGCPercent(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	// Read GOGC without setting it: a read that sets and restores it
	// could restore the old value over the one Run sets in between.
	gcPercent := func() int {
		s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
		metrics.Read(s)
		return int(s[0].Value.Uint64())
	}
	clk := clocktest.New(time.Unix(0, 0))
	changes := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		Run(ctx, changes, clk, 10*time.Second, slog.New(slog.DiscardHandler), GC{Busy: 50, Idle: 20})
		close(done)
	}()
	defer func() { cancel(); <-done }()
	spin.For(t, "Run waiting on the clock", func() (bool, string) {
		n := clk.Waiters()
		return n == 1, fmt.Sprintf("%d waiters", n)
	})
	clk.Advance(10 * time.Second)
	spin.For(t, "GOGC idle", func() (bool, string) { p := gcPercent(); return p == 20, fmt.Sprintf("GOGC %d", p) })
	changes <- struct{}{}
	changes <- struct{}{} // returns once the first was handled
	if p := gcPercent(); p != 50 {
		t.Fatalf("GOGC %d after a change, want the busy 50", p)
	}
}
