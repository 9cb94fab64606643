package crilog

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
)

// Record is one parsed log line.
type Record struct {
	Time    time.Time
	Stream  string
	Partial bool
	Content []byte
}

// ParseLine parses one CRI log line (without its newline).
func ParseLine(line []byte) (Record, error) {
	var r Record
	ts, rest, ok := bytes.Cut(line, []byte{' '})
	if !ok {
		return r, errors.New("no stream after timestamp")
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return r, fmt.Errorf("timestamp: %w", err)
	}
	stream, rest, ok := bytes.Cut(rest, []byte{' '})
	if !ok || (string(stream) != "stdout" && string(stream) != "stderr") {
		return r, fmt.Errorf("bad stream %q", stream)
	}
	tag, content, ok := bytes.Cut(rest, []byte{' '})
	if !ok {
		// An empty line is written as "<ts> <stream> F " but tolerate a
		// missing trailing space.
		tag, content = rest, nil
	}
	switch string(tag) {
	case "F":
	case "P":
		r.Partial = true
	default:
		return r, fmt.Errorf("bad tag %q", tag)
	}
	r.Time, r.Stream, r.Content = t, string(stream), content
	return r, nil
}

// ReadOptions select what Read returns, as kubectl logs' flags do.
type ReadOptions struct {
	Follow     bool
	TailLines  int64 // < 0 for all
	Since      time.Time
	Timestamps bool
	LimitBytes int64 // 0 for no limit
	// Poll is how often Follow looks for new lines (default 250ms).
	Poll time.Duration
}

// Read writes the log at path, across its rotated files, to w. With Follow
// it keeps writing new lines until ctx ends. It streams: lines are written
// as they are read, through a buffer flushed after each read of the
// files, so memory stays small however long the log; only TailLines
// lines are held, for the tail.
func Read(ctx context.Context, path string, opts ReadOptions, clk clock.Clock, w io.Writer) error {
	if opts.Poll <= 0 {
		opts.Poll = 250 * time.Millisecond
	}
	bw := bufio.NewWriterSize(&limitWriter{w: w, left: opts.LimitBytes}, 32<<10)
	var (
		werr    error
		pending []byte
		line    []byte
		tail    = opts.TailLines >= 0 // the first pass keeps the last lines only
		ring    [][]byte
	)
	emit := func(r Record) bool {
		if !opts.Since.IsZero() && r.Time.Before(opts.Since) {
			pending = pending[:0]
			return true
		}
		pending = append(pending, r.Content...)
		if r.Partial {
			return true
		}
		line = line[:0]
		if opts.Timestamps {
			line = r.Time.AppendFormat(line, time.RFC3339Nano)
			line = append(line, ' ')
		}
		line = append(line, pending...)
		line = append(line, '\n')
		pending = pending[:0]
		if tail {
			if opts.TailLines == 0 {
				return true
			}
			ring = append(ring, slices.Clone(line))
			if n := int64(len(ring)); n > 2*opts.TailLines && n > 64 {
				ring = slices.Clone(ring[n-opts.TailLines:])
			}
			return true
		}
		if _, err := bw.Write(line); err != nil {
			werr = err
			return false
		}
		return true
	}
	files := append(Rotated(path), path)
	var live *tailer
	for i, name := range files {
		f, err := os.Open(name)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return err
		}
		t := newTailer(f)
		err = t.scan(emit)
		if i == len(files)-1 && opts.Follow && err == nil && werr == nil {
			live = t
		} else {
			f.Close()
		}
		if err != nil {
			return err
		}
		if werr != nil {
			return ignoreLimit(werr)
		}
	}
	if tail {
		if int64(len(ring)) > opts.TailLines {
			ring = ring[int64(len(ring))-opts.TailLines:]
		}
		for _, l := range ring {
			if _, err := bw.Write(l); err != nil {
				return ignoreLimit(err)
			}
		}
		ring, tail = nil, false
	}
	if err := bw.Flush(); err != nil {
		return ignoreLimit(err)
	}
	if !opts.Follow || live == nil {
		return nil
	}
	// drain writes the lines the live file gained since the last look.
	drain := func() error {
		if err := live.scan(emit); err != nil {
			return err
		}
		if werr != nil {
			return werr
		}
		return bw.Flush()
	}
	defer func() { live.f.Close() }()
	tick := clk.NewTicker(opts.Poll)
	defer tick.Stop()
	for {
		if err := drain(); err != nil {
			return ignoreLimit(err)
		}
		// A rotation renames the live file: once it is drained, go on with
		// the file written after it, which may itself be rotated already.
		if next := openNext(path, live.f); next != nil {
			// The file is no longer written: what reached it between the
			// scan above and the rotation is read before moving on.
			if err := drain(); err != nil {
				next.Close()
				return ignoreLimit(err)
			}
			live.f.Close()
			live = newTailer(next)
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
		}
	}
}

// openNext opens the file to follow after cur once cur is no longer the
// live log. It returns nil while cur is still live, or when the next file
// cannot be opened yet (the caller looks again at its next poll).
func openNext(path string, cur *os.File) *os.File {
	curSt, err := cur.Stat()
	if err != nil {
		return nil
	}
	for range 5 {
		next := successor(path, curSt)
		if next == "" {
			return nil
		}
		f, err := os.Open(next)
		if err != nil {
			continue // rotated or removed meanwhile: look again
		}
		// A rotated file keeps its name, but the live one may have been
		// rotated between the look and the open: what was opened would
		// then be a later file, and the lines between lost. Keep it only
		// if the live file is still what follows cur.
		if next == path && successor(path, curSt) != path {
			f.Close()
			continue
		}
		return f
	}
	return nil
}

// successor names the file that follows the one with stat cur, or ""
// while cur is still the live log.
func successor(path string, cur os.FileInfo) string {
	if st, err := os.Stat(path); err != nil || os.SameFile(st, cur) {
		return ""
	}
	files := append(Rotated(path), path)
	for i, f := range files[:len(files)-1] {
		if st, err := os.Stat(f); err == nil && os.SameFile(st, cur) {
			return files[i+1]
		}
	}
	// Ours was deleted by rotation: the live file is all that is certain.
	return path
}

// tailer reads complete lines from a file that may still be growing; an
// incomplete last line waits in carry for the next read.
type tailer struct {
	f     *os.File
	carry []byte
	buf   []byte
}

func newTailer(f *os.File) *tailer { return &tailer{f: f, buf: make([]byte, 64<<10)} }

// scan reads to the end of the file, giving emit each record, until emit
// returns false.
func (t *tailer) scan(emit func(Record) bool) error {
	for {
		n, err := t.f.Read(t.buf)
		data := append(t.carry, t.buf[:n]...)
		for {
			i := bytes.IndexByte(data, '\n')
			if i < 0 {
				break
			}
			if rec, perr := ParseLine(data[:i]); perr == nil {
				// A damaged line is skipped, not fatal.
				if !emit(rec) {
					t.carry = t.carry[:0]
					return nil
				}
			}
			data = data[i+1:]
		}
		t.carry = append(t.carry[:0], data...)
		if err == io.EOF || n == 0 {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

var errLimit = errors.New("limit reached")

type limitWriter struct {
	w    io.Writer
	left int64 // 0 = unlimited
	used bool
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.left == 0 && !l.used {
		return l.w.Write(p)
	}
	l.used = true
	if l.left <= 0 {
		return 0, errLimit
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.w.Write(p)
	l.left -= int64(n)
	if err == nil && l.left <= 0 {
		err = errLimit
	}
	return n, err
}

func ignoreLimit(err error) error {
	if errors.Is(err, errLimit) {
		return nil
	}
	return err
}

// Attempts returns the attempts whose logs a container's log directory
// holds (the n of each n.log), newest first: what kubectl logs reads and,
// second, what --previous reads.
func Attempts(dir string) []int {
	entries, _ := os.ReadDir(dir)
	var out []int
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".log")
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(name); err == nil && n >= 0 {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b int) int { return b - a })
	return out
}
