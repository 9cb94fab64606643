package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
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

// fakeImporter records the files it is asked to import, and the version
// of each file whose images it holds, as containerd's image labels do; a
// file whose content starts with "bad" fails.
type fakeImporter struct {
	mu       sync.Mutex
	calls    []string
	versions map[string]string // file name: the version imported
}

func (f *fakeImporter) ImportFile(_ context.Context, path, version string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, filepath.Base(path))
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if bytes.HasPrefix(data, []byte("bad")) {
		return nil, errors.New("not a tarball")
	}
	if f.versions == nil {
		f.versions = map[string]string{}
	}
	f.versions[filepath.Base(path)] = version
	return []string{"img/" + filepath.Base(path)}, nil
}

func (f *fakeImporter) Imported(_ context.Context, file, version string) ([]string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v, ok := f.versions[file]; !ok || v != version {
		return nil, false
	}
	return []string{"img/" + file}, true
}

// forget drops the images of file, as an image removed from containerd.
func (f *fakeImporter) forget(file string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.versions, file)
}

func (f *fakeImporter) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func TestImageDirImportsSettledNewAndChangedFiles(t *testing.T) {
	dir := t.TempDir()
	var logs bytes.Buffer
	imp := &fakeImporter{}
	d := newImageDir(dir, imp, slog.New(slog.NewTextHandler(&logs, nil)))
	wakes := 0
	d.onImport = func() { wakes++ }
	mtime := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	write := func(name, body string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		mtime = mtime.Add(time.Second)
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	poll := func(want ...string) {
		t.Helper()
		d.scan(context.Background(), true)
		if got := imp.take(); !slices.Equal(got, want) {
			t.Fatalf("imported %q, want %q", got, want)
		}
	}

	// At start everything present is imported at once.
	write("a.tar", "a")
	write("notes.txt", "not a tarball name")
	d.importAll(context.Background())
	if got := imp.take(); !slices.Equal(got, []string{"a.tar"}) {
		t.Fatalf("imported at start %q, want a.tar", got)
	}
	if wakes != 1 {
		t.Fatalf("%d wakes after the start import, want 1", wakes)
	}
	poll() // nothing new

	// A new file being copied: imported only once two polls agree.
	write("b.tar", "bb")
	poll()
	write("b.tar", "bbbb") // still growing
	poll()
	poll("b.tar")
	poll()
	if wakes != 2 {
		t.Fatalf("%d wakes, want 2", wakes)
	}

	// A changed file is imported again once it settles.
	write("a.tar", "a2")
	poll()
	poll("a.tar")

	// A failed import is logged with the file and not retried until the
	// file changes; no wake for it.
	write("c.tar", "bad")
	poll()
	poll("c.tar")
	poll()
	poll()
	if !strings.Contains(logs.String(), "c.tar") || !strings.Contains(logs.String(), "not a tarball") {
		t.Fatalf("failed import not logged with its file:\n%s", logs.String())
	}
	if wakes != 3 {
		t.Fatalf("%d wakes, want 3", wakes)
	}
	write("c.tar", "good now")
	poll()
	poll("c.tar")

	// A file removed and put back is imported again.
	if err := os.Remove(filepath.Join(dir, "b.tar")); err != nil {
		t.Fatal(err)
	}
	poll()
	write("b.tar", "bbbb")
	poll()
	poll("b.tar")
}

// After a restart the start-up import skips a tarball whose images are
// there as its import left them, and imports one that changed or whose
// images are gone.
func TestImageDirRestartImportsOnlyWhatIsNotThere(t *testing.T) {
	dir := t.TempDir()
	imp := &fakeImporter{}
	mtime := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, name := range []string{"a.tar", "b.tar", "c.tar", "d.tar"} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	start := func() (imported []string, wakes int) {
		t.Helper()
		d := newImageDir(dir, imp, slog.New(slog.DiscardHandler))
		d.onImport = func() { wakes++ }
		d.importAll(context.Background())
		got := imp.take()
		slices.Sort(got)
		return got, wakes
	}
	if got, _ := start(); !slices.Equal(got, []string{"a.tar", "b.tar", "c.tar", "d.tar"}) {
		t.Fatalf("first start imported %q, want all four", got)
	}
	if got, wakes := start(); len(got) != 0 || wakes != 0 {
		t.Fatalf("a restart with nothing changed imported %q (%d wakes), want nothing", got, wakes)
	}
	imp.forget("b.tar") // its image removed
	later := mtime.Add(time.Second)
	if err := os.Chtimes(filepath.Join(dir, "c.tar"), later, later); err != nil { // touched
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "d.tar"), []byte("d, grown"), 0o644); err != nil { // rewritten
		t.Fatal(err)
	}
	if got, wakes := start(); !slices.Equal(got, []string{"b.tar", "c.tar", "d.tar"}) || wakes != 1 {
		t.Fatalf("restart imported %q (%d wakes), want b.tar, c.tar, d.tar (1 wake)", got, wakes)
	}
}

func TestImageDirMissingDirIsQuietAndPickedUpLater(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "images")
	var logs bytes.Buffer
	imp := &fakeImporter{}
	d := newImageDir(dir, imp, slog.New(slog.NewTextHandler(&logs, nil)))
	d.importAll(context.Background())
	d.scan(context.Background(), true)
	if logs.Len() != 0 {
		t.Fatalf("a missing image dir was logged:\n%s", logs.String())
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "x.tar"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.scan(context.Background(), true)
	d.scan(context.Background(), true)
	if got := imp.take(); !slices.Equal(got, []string{"x.tar"}) {
		t.Fatalf("imported %q, want x.tar", got)
	}
}

func TestImageDirWatchStopsWithContext(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "x.tar"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	imp := &fakeImporter{}
	d := newImageDir(dir, imp, slog.New(slog.DiscardHandler))
	clk := clocktest.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.watch(ctx, clk, imagePollInterval); close(done) }()
	spin := waittest.Poll{Timeout: 5 * time.Second, Every: time.Millisecond}
	spin.Until(t, "the watch loop waiting on the clock", func() bool { return clk.Waiters() > 0 })
	polls := spin
	polls.Between = func() { clk.Advance(imagePollInterval) }
	clk.Advance(imagePollInterval)
	polls.Until(t, "x.tar imported by the watch loop", func() bool {
		imp.mu.Lock()
		defer imp.mu.Unlock()
		return len(imp.calls) > 0
	})
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the watch loop did not stop within 5s of its context's end")
	}
}
