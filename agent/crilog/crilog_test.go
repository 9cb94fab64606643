package crilog

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/internal/waittest"
)

func TestWriteAndReadBack(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	path := filepath.Join(t.TempDir(), "web", "0.log")
	w, err := Open(path, Options{}, clk)
	if err != nil {
		t.Fatal(err)
	}
	out, errs := w.Stream("stdout"), w.Stream("stderr")
	out.Write([]byte("hello\nwor"))
	clk.Advance(time.Second)
	out.Write([]byte("ld\n"))
	errs.Write([]byte("oops\n"))
	out.Write([]byte("no newline"))
	out.Close()
	errs.Close()
	w.Close()

	raw, _ := os.ReadFile(path)
	want := "2026-11-30T09:00:00Z stdout F hello\n" +
		"2026-11-30T09:00:01Z stdout F world\n" +
		"2026-11-30T09:00:01Z stderr F oops\n" +
		"2026-11-30T09:00:01Z stdout F no newline\n"
	if string(raw) != want {
		t.Fatalf("file:\n%s\nwant:\n%s", raw, want)
	}
	var got bytes.Buffer
	if err := Read(context.Background(), path, ReadOptions{TailLines: -1}, clk, &got); err != nil {
		t.Fatal(err)
	}
	if got.String() != "hello\nworld\noops\nno newline\n" {
		t.Fatalf("read %q", got.String())
	}
	got.Reset()
	Read(context.Background(), path, ReadOptions{TailLines: 2, Timestamps: true}, clk, &got)
	if got.String() != "2026-11-30T09:00:01Z oops\n2026-11-30T09:00:01Z no newline\n" {
		t.Fatalf("tail 2 with timestamps: %q", got.String())
	}
	got.Reset()
	Read(context.Background(), path, ReadOptions{TailLines: -1, Since: time.Date(2026, 11, 30, 9, 0, 1, 0, time.UTC)}, clk, &got)
	if got.String() != "world\noops\nno newline\n" {
		t.Fatalf("since: %q", got.String())
	}
	got.Reset()
	Read(context.Background(), path, ReadOptions{TailLines: -1, LimitBytes: 8}, clk, &got)
	if got.String() != "hello\nwo" {
		t.Fatalf("limit 8: %q", got.String())
	}
}

// TestCRLFLineEnds writes a terminal's output, whose lines end in
// "\r\n": the "\r" of a line end is dropped, as containerd's CRI plugin
// does, also when the "\n" comes in a later write; a "\r" elsewhere is
// kept.
func TestCRLFLineEnds(t *testing.T) {
	long := strings.Repeat("x", maxLine-1)
	for _, tc := range []struct {
		name   string
		writes []string
		want   []string // records: tag, content
	}{
		{name: "terminal lines", writes: []string{"is-a-tty\r\nnext\r\n"}, want: []string{"F is-a-tty", "F next"}},
		{name: "split line end", writes: []string{"a\r", "\nb\n"}, want: []string{"F a", "F b"}},
		{name: "carriage return inside", writes: []string{"50%\r100%\r\n"}, want: []string{"F 50%\r100%"}},
		{name: "no line end", writes: []string{"last\r"}, want: []string{"F last\r"}},
		{
			name:   "line end across a partial record",
			writes: []string{long + "\r" + "yy", "\r\n"},
			want:   []string{"P " + long, "F \ryy"},
		},
		{
			name:   "line end straddling the partial limit",
			writes: []string{long + "\r", "\n"},
			want:   []string{"F " + long},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktest.New(time.Unix(0, 0))
			path := filepath.Join(t.TempDir(), "0.log")
			w, err := Open(path, Options{}, clk)
			if err != nil {
				t.Fatal(err)
			}
			s := w.Stream("stdout")
			for _, p := range tc.writes {
				s.Write([]byte(p))
			}
			s.Close()
			w.Close()
			raw, _ := os.ReadFile(path)
			var got []string
			for _, line := range strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n") {
				got = append(got, strings.TrimPrefix(line, "1970-01-01T00:00:00Z stdout "))
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("records %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLongLinesAreSplitAndJoined(t *testing.T) {
	clk := clocktest.New(time.Unix(0, 0))
	path := filepath.Join(t.TempDir(), "0.log")
	w, _ := Open(path, Options{}, clk)
	long := strings.Repeat("x", maxLine*2+10)
	s := w.Stream("stdout")
	s.Write([]byte(long + "\n"))
	w.Close()
	raw, _ := os.ReadFile(path)
	if n := strings.Count(string(raw), " stdout P "); n != 2 {
		t.Fatalf("%d partial records, want 2", n)
	}
	var got bytes.Buffer
	Read(context.Background(), path, ReadOptions{TailLines: -1}, clk, &got)
	if got.String() != long+"\n" {
		t.Fatalf("joined line has %d bytes, want %d", got.Len(), len(long)+1)
	}
}

func TestRotationKeepsMaxFilesAndReadSpansThem(t *testing.T) {
	clk := clocktest.New(time.Unix(1000, 0))
	path := filepath.Join(t.TempDir(), "0.log")
	w, _ := Open(path, Options{MaxBytes: 200, MaxFiles: 3}, clk)
	s := w.Stream("stdout")
	for i := range 40 {
		clk.Advance(time.Second)
		s.Write([]byte(strings.Repeat("a", 20) + string(rune('A'+i%26)) + "\n"))
	}
	w.Close()
	if r := Rotated(path); len(r) != 2 {
		t.Fatalf("rotated files %v, want 2 (MaxFiles 3 with the live one)", r)
	}
	var got bytes.Buffer
	Read(context.Background(), path, ReadOptions{TailLines: -1}, clk, &got)
	lines := strings.Split(strings.TrimSpace(got.String()), "\n")
	if last := lines[len(lines)-1]; !strings.HasSuffix(last, "N") { // the 40th line, i=39 → 'N'
		t.Fatalf("last line %q", last)
	}
	if len(lines) < 5 || len(lines) > 40 {
		t.Fatalf("read %d lines across rotation", len(lines))
	}
}

type chanWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
	ch  chan struct{}
}

func (c *chanWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf.Write(p)
	select {
	case c.ch <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (c *chanWriter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

func TestFollowAcrossRotation(t *testing.T) {
	clk := clocktest.New(time.Unix(1000, 0))
	path := filepath.Join(t.TempDir(), "0.log")
	w, _ := Open(path, Options{MaxBytes: 120, MaxFiles: 5}, clk)
	s := w.Stream("stdout")
	s.Write([]byte("first\n"))
	ctx, cancel := context.WithCancel(context.Background())
	out := &chanWriter{ch: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() { done <- Read(ctx, path, ReadOptions{TailLines: -1, Follow: true, Poll: time.Second}, clk, out) }()
	wait := func(want string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for !strings.Contains(out.String(), want) {
			select {
			case <-out.ch:
			case <-deadline:
				t.Fatalf("follow never showed %q; got %q", want, out.String())
			}
		}
	}
	wait("first\n")
	// Lines that rotate the file twice over.
	for i := range 6 {
		s.Write([]byte("line-" + string(rune('a'+i)) + strings.Repeat(".", 30) + "\n"))
	}
	// Each step of the fake clock is a poll of the follower.
	polls := waittest.Poll{Timeout: 10 * time.Second, Between: func() { clk.Advance(time.Second) }}
	polls.For(t, "follow to show line-f", func() (bool, string) {
		got := out.String()
		return strings.Contains(got, "line-f"), fmt.Sprintf("%q", got)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	w.Close()
	if n := strings.Count(out.String(), "line-"); n != 6 {
		t.Fatalf("follow lost lines across rotation: %q", out.String())
	}
}

func FuzzParseLine(f *testing.F) {
	f.Add([]byte("2026-11-30T09:00:00.123456789Z stdout F hello"))
	f.Add([]byte("2026-11-30T09:00:00Z stderr P "))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := ParseLine(line)
		if err != nil {
			return
		}
		if r.Stream != "stdout" && r.Stream != "stderr" {
			t.Fatalf("stream %q accepted", r.Stream)
		}
	})
}

func TestAttempts(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"0.log", "10.log", "2.log", "2.log.20260101-000000", "x.log", "-1.log", "3.txt"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := Attempts(dir); !slices.Equal(got, []int{10, 2, 0}) {
		t.Errorf("Attempts = %v, want [10 2 0]", got)
	}
	if got := Attempts(filepath.Join(dir, "missing")); got != nil {
		t.Errorf("Attempts of a missing dir = %v", got)
	}
}
