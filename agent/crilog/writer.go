// Package crilog writes and reads container logs in the CRI log format
// kubelet uses: one line per record, "<RFC3339Nano time> <stream> <P|F>
// <content>", in /var/log/pods/<ns>_<pod>_<uid>/<container>/<restart>.log,
// rotated by size.
package crilog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
)

// Defaults, as kubelet's containerLogMaxSize and containerLogMaxFiles.
const (
	DefaultMaxBytes = 10 << 20
	DefaultMaxFiles = 5
)

// maxLine is the longest content written as one record; longer lines are
// split into partial (P) records, as containerd's CRI plugin does.
const maxLine = 16 << 10

// rotatedLayout is the suffix of a rotated file: <name>.<time>.
const rotatedLayout = "20060102-150405.000000000"

// Options bound a log's size on disk.
type Options struct {
	MaxBytes int64 // rotate when the file passes this size
	MaxFiles int   // files kept, the live one included
}

// Writer appends CRI records to one container attempt's log file, rotating
// it by size. Its streams are safe for concurrent use.
type Writer struct {
	path  string
	opts  Options
	clock clock.Clock

	mu   sync.Mutex
	f    *os.File
	size int64
}

// Open opens (appending to) the log file at path, creating its directory.
func Open(path string, opts Options, clk clock.Clock) (*Writer, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.MaxFiles <= 0 {
		opts.MaxFiles = DefaultMaxFiles
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("log %s: %w", path, err)
	}
	w := &Writer{path: path, opts: opts, clock: clk}
	if err := w.openFile(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *Writer) openFile() error {
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("log %s: %w", w.path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("log %s: %w", w.path, err)
	}
	w.f, w.size = f, st.Size()
	return nil
}

// Stream returns a writer that records what is written to it as lines of
// the named stream ("stdout" or "stderr"). A line ends at "\n" or "\r\n"
// (a terminal's line end), neither kept, as containerd's CRI plugin does.
// Close it to flush a last line that has no newline.
func (w *Writer) Stream(name string) io.WriteCloser {
	return &stream{w: w, name: name}
}

// Close closes the file.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

func (w *Writer) record(stream string, partial bool, content []byte) error {
	tag := "F"
	if partial {
		tag = "P"
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return os.ErrClosed
	}
	var b bytes.Buffer
	b.Grow(len(content) + 48)
	b.WriteString(w.clock.Now().UTC().Format(time.RFC3339Nano))
	b.WriteByte(' ')
	b.WriteString(stream)
	b.WriteByte(' ')
	b.WriteString(tag)
	b.WriteByte(' ')
	b.Write(content)
	b.WriteByte('\n')
	n, err := w.f.Write(b.Bytes())
	w.size += int64(n)
	if err != nil {
		return err
	}
	if w.size >= w.opts.MaxBytes {
		return w.rotate()
	}
	return nil
}

// rotate renames the live file to <path>.<time>, opens a new one and
// deletes the oldest rotated files beyond MaxFiles.
func (w *Writer) rotate() error {
	// Two rotations within one clock tick must not share a name.
	at := w.clock.Now().UTC()
	rotated := w.path + "." + at.Format(rotatedLayout)
	for {
		if _, err := os.Lstat(rotated); errors.Is(err, os.ErrNotExist) {
			break
		}
		at = at.Add(time.Nanosecond)
		rotated = w.path + "." + at.Format(rotatedLayout)
	}
	w.f.Close()
	w.f = nil
	if err := os.Rename(w.path, rotated); err != nil {
		return fmt.Errorf("rotate log %s: %w", w.path, err)
	}
	if err := w.openFile(); err != nil {
		return err
	}
	old := Rotated(w.path)
	for len(old) > w.opts.MaxFiles-1 {
		os.Remove(old[0])
		old = old[1:]
	}
	return nil
}

// Rotated returns the rotated files of the log at path, oldest first.
func Rotated(path string) []string {
	matches, _ := filepath.Glob(path + ".*")
	var out []string
	for _, m := range matches {
		if _, err := time.Parse(rotatedLayout, strings.TrimPrefix(m, path+".")); err == nil {
			out = append(out, m)
		}
	}
	sort.Strings(out)
	return out
}

type stream struct {
	w    *Writer
	name string
	buf  []byte
}

func (s *stream) Write(p []byte) (int, error) {
	s.buf = append(s.buf, p...)
	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 {
			break
		}
		line := bytes.TrimSuffix(s.buf[:i], []byte{'\r'})
		for len(line) > maxLine {
			if err := s.w.record(s.name, true, line[:maxLine]); err != nil {
				return len(p), err
			}
			line = line[maxLine:]
		}
		if err := s.w.record(s.name, false, line); err != nil {
			return len(p), err
		}
		s.buf = s.buf[i+1:]
	}
	for len(s.buf) > maxLine {
		n := maxLine
		if s.buf[n-1] == '\r' {
			n-- // it may start the "\r\n" of a line end still to come
		}
		if err := s.w.record(s.name, true, s.buf[:n]); err != nil {
			return len(p), err
		}
		s.buf = s.buf[n:]
	}
	if len(s.buf) == 0 {
		s.buf = nil // let a large buffer go
	}
	return len(p), nil
}

func (s *stream) Close() error {
	if len(s.buf) == 0 {
		return nil
	}
	err := s.w.record(s.name, false, s.buf)
	s.buf = nil
	return err
}
