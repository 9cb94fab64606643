package volume

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/internal/clock/clocktest"
)

// dataDirs lists the timestamped directories in a content volume.
func dataDirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if isTimestampDir(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestAtomicUpdateFromStore(t *testing.T) {
	e := newEnv(t)
	e.putConfigMap(t, "app", map[string]string{"app.conf": "v1", "old": "gone soon"})
	pod := testPod(cmVolume("config", "app"))
	ctx := context.Background()
	vols, err := e.m.Setup(ctx, pod, PodInfo{})
	if err != nil {
		t.Fatal(err)
	}
	dir := vols["config"].Path
	checkVisible(t, dir, "app.conf", "v1")
	checkVisible(t, dir, "old", "gone soon")
	first, err := os.Readlink(filepath.Join(dir, "..data"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first, "..2026_03_01_12_00_00.") {
		t.Errorf("data dir %q is not named after the clock's time", first)
	}

	e.clock.Advance(90 * time.Second)
	e.putConfigMap(t, "app", map[string]string{"app.conf": "v2", "new": "here"})
	if _, err := e.m.Setup(ctx, pod, PodInfo{}); err != nil {
		t.Fatal(err)
	}
	second, err := os.Readlink(filepath.Join(dir, "..data"))
	if err != nil {
		t.Fatal(err)
	}
	if second == first || !strings.HasPrefix(second, "..2026_03_01_12_01_30.") {
		t.Errorf("..data -> %q after the update (was %q)", second, first)
	}
	checkVisible(t, dir, "app.conf", "v2")
	checkVisible(t, dir, "new", "here")
	if _, err := os.Lstat(filepath.Join(dir, "old")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("removed key still visible: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, first)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("old data dir %s not removed: %v", first, err)
	}
	if dirs := dataDirs(t, dir); !slices.Equal(dirs, []string{second}) {
		t.Errorf("data dirs %v, want only %s", dirs, second)
	}
	if got := visible(t, dir); !slices.Equal(got, []string{"app.conf", "new"}) {
		t.Errorf("visible names %v", got)
	}
}

func TestWriterModeChangeRewrites(t *testing.T) {
	dir := t.TempDir()
	w := atomicWriter{dir: dir, clock: clocktest.New(time.Unix(0, 0)), gid: -1}
	if _, err := w.write(map[string]file{"a": {data: []byte("x"), mode: 0o644}}); err != nil {
		t.Fatal(err)
	}
	changed, err := w.write(map[string]file{"a": {data: []byte("x"), mode: 0o644}})
	if err != nil || changed {
		t.Fatalf("same payload: changed=%v err=%v", changed, err)
	}
	changed, err = w.write(map[string]file{"a": {data: []byte("x"), mode: 0o600}})
	if err != nil || !changed {
		t.Fatalf("new mode: changed=%v err=%v", changed, err)
	}
	if m := mode(t, filepath.Join(dir, "a")); m.Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", m)
	}
}

func TestWriterRecoversFromCrashLeftovers(t *testing.T) {
	dir := t.TempDir()
	w := atomicWriter{dir: dir, clock: clocktest.New(time.Unix(0, 0)), gid: -1}
	if _, err := w.write(map[string]file{"a": {data: []byte("1"), mode: 0o644}}); err != nil {
		t.Fatal(err)
	}
	// A crash mid-update left a half-written data dir and a temp link.
	half := filepath.Join(dir, "..1970_01_01_00_00_00.999")
	if err := os.Mkdir(half, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(half), filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	changed, err := w.write(map[string]file{"a": {data: []byte("1"), mode: 0o644}})
	if err != nil || changed {
		t.Fatalf("changed=%v err=%v", changed, err)
	}
	for _, p := range []string{half, filepath.Join(dir, "..data_tmp")} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s left behind", filepath.Base(p))
		}
	}
	// A broken ..data (pointing nowhere) is rewritten.
	if err := os.Remove(filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..1970_01_01_00_00_00.gone", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	changed, err = w.write(map[string]file{"a": {data: []byte("1"), mode: 0o644}})
	if err != nil || !changed {
		t.Fatalf("broken ..data: changed=%v err=%v", changed, err)
	}
	checkVisible(t, dir, "a", "1")
	if len(dataDirs(t, dir)) != 1 {
		t.Errorf("data dirs %v, want one", dataDirs(t, dir))
	}
}

// TestReaderNeverSeesHalfWrittenUpdate reads a two-file volume through the
// ..data link while it is rewritten: the files of one data dir always
// belong to the same version, and a file is never empty.
func TestReaderNeverSeesHalfWrittenUpdate(t *testing.T) {
	dir := t.TempDir()
	clk := clocktest.New(time.Unix(0, 0))
	w := atomicWriter{dir: dir, clock: clk, gid: -1}
	version := func(i int) map[string]file {
		v := []byte(strings.Repeat(strconv.Itoa(i), 4096))
		return map[string]file{"a": {data: v, mode: 0o644}, "sub/b": {data: v, mode: 0o644}}
	}
	if _, err := w.write(version(0)); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	var readErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			target, err := os.Readlink(filepath.Join(dir, "..data"))
			if err != nil {
				readErr = err
				return
			}
			a, errA := os.ReadFile(filepath.Join(dir, target, "a"))
			b, errB := os.ReadFile(filepath.Join(dir, target, "sub/b"))
			if errors.Is(errA, fs.ErrNotExist) || errors.Is(errB, fs.ErrNotExist) {
				continue // that version was replaced and removed meanwhile
			}
			if errA != nil || errB != nil {
				readErr = errors.Join(errA, errB)
				return
			}
			if len(a) != 4096 || string(a) != string(b) {
				readErr = errors.New("torn read: " + string(a[:min(8, len(a))]) + " vs " + string(b[:min(8, len(b))]))
				return
			}
			if v, err := os.ReadFile(filepath.Join(dir, "a")); err == nil && len(v) != 4096 {
				readErr = errors.New("visible file half-written")
				return
			}
		}
	}()
	for i := 1; i <= 50; i++ {
		clk.Advance(time.Second)
		if _, err := w.write(version(i % 10)); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
	if readErr != nil {
		t.Fatal(readErr)
	}
}

func TestCleanPath(t *testing.T) {
	tests := []struct{ in, want, err string }{
		{in: "a", want: "a"},
		{in: "a/b/c", want: "a/b/c"},
		{in: "./a//b/", want: "a/b"},
		{in: "a/./b", want: "a/b"},
		{in: "", err: "must not be empty"},
		{in: "/a", err: "relative"},
		{in: "..", err: `".."`},
		{in: "a/../b", err: `".."`},
		{in: "..data", err: `must not start with ".."`},
		{in: "..a/b", err: `must not start with ".."`},
		{in: "a/..b", want: "a/..b"},
		{in: ".", err: "must name a file"},
		{in: "./", err: "must name a file"},
		{in: strings.Repeat("x", 256), err: "at most 255"},
		{in: "a\x00b", err: "NUL"},
	}
	for _, tt := range tests {
		got, err := cleanPath(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("cleanPath(%q) = %q, %v; want error containing %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("cleanPath(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"a", "a/b", "../a", "/a", "..data", "a/../b", "./a", "a/./../b", ".", "..."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		c, err := cleanPath(p)
		if err != nil {
			return
		}
		if c == "" || c == "." || path.IsAbs(c) || path.Clean(c) != c {
			t.Fatalf("cleanPath(%q) = %q: not a clean relative path", p, c)
		}
		if strings.HasPrefix(c, "..") || slices.Contains(strings.Split(c, "/"), "..") {
			t.Fatalf("cleanPath(%q) = %q: may escape or hide among the writer's files", p, c)
		}
		if !filepath.IsLocal(c) {
			t.Fatalf("cleanPath(%q) = %q: not local", p, c)
		}
	})
}
