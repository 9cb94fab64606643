package containerd

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/cio"

	"github.com/outpost-edge/outpost/internal/outpoll"
)

// testPoller is a Poller that the test's end closes.
func testPoller(t *testing.T) *outpoll.Poller {
	t.Helper()
	p, err := outpoll.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// shimSide opens a task's FIFOs the way the shim does: output FIFOs for
// writing, stdin for reading. Each open waits for the agent's side.
type shimSide struct {
	out, err *os.File
	in       *os.File
}

func openShimSide(t *testing.T, cfg cio.Config) *shimSide {
	t.Helper()
	var s shimSide
	var err error
	if s.out, err = os.OpenFile(cfg.Stdout, os.O_WRONLY, 0); err != nil {
		t.Fatal(err)
	}
	if cfg.Stderr != "" {
		if s.err, err = os.OpenFile(cfg.Stderr, os.O_WRONLY, 0); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.Stdin != "" {
		if s.in, err = os.OpenFile(cfg.Stdin, os.O_RDONLY, 0); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, f := range []*os.File{s.out, s.err, s.in} {
			if f != nil {
				f.Close()
			}
		}
	})
	return &s
}

// TestStreamCreator creates a task's IO with and without a terminal and
// stdin, plays the shim's side, and checks what reaches the log writers
// and that stdin is held open for writing until the IO is closed.
func TestStreamCreator(t *testing.T) {
	for _, tc := range []struct {
		name            string
		terminal, stdin bool
		wantOut         string
		wantErr         string
	}{
		{name: "plain", wantOut: "out\n", wantErr: "err\n"},
		{name: "terminal", terminal: true, wantOut: "out\n"},
		{name: "stdin", stdin: true, wantOut: "out\n", wantErr: "err\n"},
		{name: "terminal and stdin", terminal: true, stdin: true, wantOut: "out\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var out, errOut bytes.Buffer
			tio, err := streamCreator(testPoller(t), dir, tc.terminal, tc.stdin, &out, &errOut)("c1")
			if err != nil {
				t.Fatal(err)
			}
			cfg := tio.Config()
			if cfg.Terminal != tc.terminal || (cfg.Stdin != "") != tc.stdin || (cfg.Stderr != "") == tc.terminal {
				t.Fatalf("config %+v for terminal=%v stdin=%v: want a stdin FIFO only with stdin, a stderr FIFO only without a terminal",
					cfg, tc.terminal, tc.stdin)
			}
			shim := openShimSide(t, cfg)
			shim.out.WriteString("out\n")
			shim.out.Close()
			if shim.err != nil {
				shim.err.WriteString("err\n")
				shim.err.Close()
			}
			tio.Wait()
			if out.String() != tc.wantOut || errOut.String() != tc.wantErr {
				t.Fatalf("stdout %q, stderr %q; want %q, %q", out.String(), errOut.String(), tc.wantOut, tc.wantErr)
			}

			w := tio.(*streams).stdin()
			if (w != nil) != tc.stdin {
				t.Fatalf("stdin writer %v, want one: %v", w, tc.stdin)
			}
			if tc.stdin {
				// What the agent writes reaches the shim's side: an attach
				// to come will write here.
				if _, err := w.Write([]byte("line\n")); err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 16)
				if n, err := shim.in.Read(buf); err != nil || string(buf[:n]) != "line\n" {
					t.Fatalf("shim read %q, %v from stdin; want %q", buf[:n], err, "line\n")
				}
			}
			if err := tio.Close(); err != nil {
				t.Fatal(err)
			}
			if tc.stdin {
				// Closed with the IO: the shim's side sees the end.
				if n, err := shim.in.Read(make([]byte, 16)); n != 0 || !errors.Is(err, io.EOF) {
					t.Fatalf("stdin after close: %d bytes, %v; want EOF", n, err)
				}
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) > 0 {
				t.Fatalf("FIFOs left after close: %v", left)
			}
		})
	}
}

// TestStreamAttachReopensStdin attaches to the FIFOs of a task as
// containerd reports them after an agent restart: the stdin FIFO is opened
// for writing again, and a terminal task's output is read from stdout
// alone.
func TestStreamAttachReopensStdin(t *testing.T) {
	dir := t.TempDir()
	fifos, err := cio.NewFIFOSetInDir(dir, "c1", true)
	if err != nil {
		t.Fatal(err)
	}
	fifos.Stderr = ""
	var out, errOut bytes.Buffer
	tio, err := streamAttach(testPoller(t), &out, &errOut)(fifos)
	if err != nil {
		t.Fatal(err)
	}
	shim := openShimSide(t, tio.Config())
	shim.out.WriteString("still here\r\n")
	shim.out.Close()
	tio.Wait()
	if out.String() != "still here\r\n" || errOut.Len() != 0 {
		t.Fatalf("stdout %q, stderr %q", out.String(), errOut.String())
	}
	w := tio.(*streams).stdin()
	if w == nil {
		t.Fatal("no stdin writer after attach")
	}
	if _, err := w.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if n, err := shim.in.Read(buf); err != nil || string(buf[:n]) != "x" {
		t.Fatalf("shim read %q, %v", buf[:n], err)
	}
	tio.Close()

	if _, err := streamAttach(testPoller(t), &out, &errOut)(nil); err == nil {
		t.Fatal("attach to no FIFOs succeeded")
	}
}

// whenDone runs what it is given once, after the last copy ended (not
// after the first), or at once when they have all ended: a task's IO
// needs no goroutine of its own waiting for its end.
func TestStreamsWhenDone(t *testing.T) {
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	tio, err := streamCreator(testPoller(t), dir, false, false, &out, &errOut)("c1")
	if err != nil {
		t.Fatal(err)
	}
	defer tio.Close()
	s := tio.(*streams)
	shim := openShimSide(t, tio.Config())
	ran := make(chan struct{}, 2)
	s.whenDone(func() { ran <- struct{}{} })
	shim.out.WriteString("out\n")
	shim.out.Close()
	select {
	case <-ran:
		t.Fatal("ran when stdout ended, with stderr still copied")
	case <-time.After(50 * time.Millisecond):
	}
	shim.err.Close()
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("did not run after both copies ended")
	}
	s.whenDone(func() { ran <- struct{}{} })
	select {
	case <-ran:
	default:
		t.Fatal("given after the copies ended, it did not run at once")
	}
	if len(ran) != 0 {
		t.Fatal("ran twice")
	}
}
