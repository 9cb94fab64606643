package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/internal/waittest"
	"github.com/outpost-edge/outpost/store"
)

func pod(name, image string) string {
	return "apiVersion: v1\nkind: Pod\nmetadata: {name: " + name + "}\nspec:\n  containers: [{name: c, image: " + image + "}]\n"
}

type fixture struct {
	dir   string
	st    *store.Store
	clock *clocktest.Fake
	agent *Agent
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, store.FileName), store.Options{NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f := &fixture{dir: filepath.Join(dir, "manifests"), st: st, clock: clocktest.New(time.Unix(1000, 0))}
	os.Mkdir(f.dir, 0o755)
	f.agent, err = New(Config{NodeName: "n1", ManifestDir: f.dir, SocketPath: filepath.Join(dir, "s.sock"), Version: "test"},
		Deps{Store: st, Clock: f.clock, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) write(t *testing.T, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) podImages(t *testing.T) map[string]string {
	t.Helper()
	recs, err := f.st.Pods().List()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, r := range recs {
		out[r.Object.Name] = r.Object.Spec.Containers[0].Image
	}
	return out
}

func TestSyncManifestsKeepsLastGoodVersionOfABrokenFile(t *testing.T) {
	f := newFixture(t)
	f.write(t, "web.yaml", pod("web", "busybox:1"))
	f.write(t, "db.yaml", pod("db", "busybox:2"))
	if err := f.agent.SyncManifests(); err != nil {
		t.Fatal(err)
	}
	if got := f.podImages(t); len(got) != 2 || got["web-n1"] != "busybox:1" {
		t.Fatalf("pods = %v", got)
	}
	// A bad edit keeps the stored pod and is reported.
	f.write(t, "web.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: c, imag: x}]}\n")
	if err := f.agent.SyncManifests(); err != nil {
		t.Fatal(err)
	}
	if got := f.podImages(t); got["web-n1"] != "busybox:1" {
		t.Fatalf("bad edit lost the running pod: %v", got)
	}
	s, _ := f.agent.Status()
	if len(s.Agent.ManifestErrors) != 1 || s.Agent.ManifestErrors[0] != "web.yaml: document 1 (Pod web): spec.containers[0].imag: unknown field (line 4) [the last good version of the pod is kept]" {
		t.Fatalf("manifest errors = %q", s.Agent.ManifestErrors)
	}
	// A deleted file removes its pod.
	os.Remove(filepath.Join(f.dir, "db.yaml"))
	if err := f.agent.SyncManifests(); err != nil {
		t.Fatal(err)
	}
	if got := f.podImages(t); len(got) != 1 {
		t.Fatalf("deleted manifest's pod kept: %v", got)
	}
}

func TestRunServesStatusAndFollowsManifests(t *testing.T) {
	f := newFixture(t)
	f.write(t, "web.yaml", pod("web", "busybox:1"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.agent.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
		if _, err := os.Stat(f.agent.cfg.SocketPath); !os.IsNotExist(err) {
			t.Errorf("socket left behind: %v", err)
		}
	}()
	changes, stop := f.st.Subscribe(store.KindPod)
	defer stop()
	<-changes // first sync recorded web

	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", f.agent.cfg.SocketPath)
	}}}
	resp, err := client.Get("http://agent/status")
	if err != nil {
		t.Fatal(err)
	}
	var s Status
	json.NewDecoder(resp.Body).Decode(&s)
	resp.Body.Close()
	if s.From != "agent" || s.Node != "n1" || len(s.Pods) != 1 || s.Pods[0].Source != "static" || s.Agent.Version != "test" {
		t.Fatalf("status = %+v", s)
	}

	// A new manifest is seen through inotify and read once its events
	// have settled.
	// Run armed its resync timer before the first sync, which we have seen.
	if f.clock.Waiters() != 1 {
		t.Fatalf("fake clock has %d waiters, want the agent's resync timer", f.clock.Waiters())
	}
	f.write(t, "db.yaml", pod("db", "busybox:2"))
	f.settled(t, changes, "a new manifest")
	if got := f.podImages(t); len(got) != 2 {
		t.Fatalf("pods = %v", got)
	}
}

// watchWait looks in wall time for what the agent's goroutines do
// between the fake clock's steps.
var watchWait = waittest.Poll{Timeout: 10 * time.Second, Every: time.Millisecond}

// waitWaiters waits until the fake clock has n active timers.
func (f *fixture) waitWaiters(t *testing.T, n int, what string) {
	t.Helper()
	watchWait.For(t, fmt.Sprintf("%d waiters on the fake clock: %s", n, what), func() (bool, string) {
		got := f.clock.Waiters()
		return got == n, fmt.Sprintf("%d waiters", got)
	})
}

// settled lets the settle timer the agent armed after a change in its
// manifest directory fire, then waits for the store change that follows.
func (f *fixture) settled(t *testing.T, changes <-chan struct{}, what string) {
	t.Helper()
	f.waitWaiters(t, 2, "the settle timer after "+what)
	f.clock.Advance(manifestSettle)
	select {
	case <-changes:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s not recorded once its events settled", what)
	}
}

// runAgent runs the fixture's agent until the test ends.
func (f *fixture) runAgent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.agent.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	<-f.agent.Ready()
}

// Only manifest names wake the agent: an editor's swap file, a backup or
// a dotfile arms no timer and is never read, while the manifest the
// editor then writes is.
func TestRunWatchIgnoresOtherNames(t *testing.T) {
	f := newFixture(t)
	changes, stop := f.st.Subscribe(store.KindPod)
	defer stop()
	var mu sync.Mutex
	woke := map[string]bool{}
	f.agent.manifestEvent = func(name string, w bool) {
		mu.Lock()
		woke[name] = woke[name] || w
		mu.Unlock()
	}
	f.runAgent(t)
	f.waitWaiters(t, 1, "the resync timer")
	others := []string{".web.yaml.swp", "web.yaml.bak", "web.yaml~", ".hidden.yaml", "notes.txt"}
	for _, name := range others {
		f.write(t, name, pod("web", "busybox:1"))
	}
	os.Remove(filepath.Join(f.dir, "notes.txt"))
	// The watch reads events in order: once it saw the last name, it
	// saw every one before it.
	f.write(t, "zz-last.txt", "")
	var seen map[string]bool
	watchWait.For(t, "the manifest watch to see zz-last.txt", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		seen = maps.Clone(woke)
		_, done := seen["zz-last.txt"]
		return done, fmt.Sprintf("saw %v", seen)
	})
	for _, name := range append(others, "zz-last.txt") {
		if w, ok := seen[name]; !ok || w {
			t.Errorf("%s: seen %v, woke the agent %v; want seen, not woken", name, ok, w)
		}
	}
	if n := f.clock.Waiters(); n != 1 {
		t.Fatalf("fake clock has %d waiters after writing other names, want only the resync timer", n)
	}
	// Written in place, as an editor without a rename does.
	fd, err := os.Create(filepath.Join(f.dir, "web.yml"))
	if err != nil {
		t.Fatal(err)
	}
	fd.WriteString(pod("web", "busybox:1"))
	fd.Close()
	f.settled(t, changes, "web.yml written in place")
	if got := f.podImages(t); len(got) != 1 || got["web-n1"] != "busybox:1" {
		t.Fatalf("pods = %v", got)
	}
}

// A manifest directory that does not exist yet is looked at every
// ManifestInterval; once it exists it is read and then watched. When it
// is removed, its pods go and the agent polls again until it is back.
func TestRunPollsUntilTheDirectoryExists(t *testing.T) {
	f := newFixture(t)
	os.Remove(f.dir)
	changes, stop := f.st.Subscribe(store.KindPod)
	defer stop()
	f.runAgent(t)
	f.waitWaiters(t, 1, "the poll timer")
	os.Mkdir(f.dir, 0o755)
	f.write(t, "web.yaml", pod("web", "busybox:1"))
	f.clock.Advance(time.Second)
	select {
	case <-changes:
	case <-time.After(10 * time.Second):
		t.Fatal("manifest in a new directory not recorded after a poll")
	}
	// Now watched: an edit is read without the poll.
	f.waitWaiters(t, 1, "the resync timer")
	f.write(t, "web.yaml", pod("web", "busybox:22"))
	f.settled(t, changes, "an edit")
	if got := f.podImages(t)["web-n1"]; got != "busybox:22" {
		t.Fatalf("image = %q after the edit", got)
	}
	// The directory goes: so do its pods.
	if err := os.RemoveAll(f.dir); err != nil {
		t.Fatal(err)
	}
	// The file's removal may arm a settle timer, or the watch's end be
	// seen first: either way the pods go.
	settling := waittest.Poll{Timeout: 10 * time.Second, Every: 5 * time.Millisecond, Between: func() {
		if f.clock.Waiters() == 2 {
			f.clock.Advance(manifestSettle)
		}
	}}
	settling.For(t, "the pods of a removed directory gone", func() (bool, string) {
		got := f.podImages(t)
		return len(got) == 0, fmt.Sprintf("pods %v", got)
	})
	// Polled again, and watched again once it is back. The timer armed
	// then need not be the poll's yet (a settle timer of the removal may
	// still be armed, or fire first), so fake time moves on while any
	// timer waits, until the poll has found the directory.
	f.waitWaiters(t, 1, "the poll timer")
	os.Mkdir(f.dir, 0o755)
	f.write(t, "db.yaml", pod("db", "busybox:3"))
	f.clock.Advance(time.Second)
	waittest.Poll{Timeout: 10 * time.Second, Every: 5 * time.Millisecond, Between: func() {
		if f.clock.Waiters() > 0 {
			f.clock.Advance(time.Second)
		}
	}}.For(t, "the manifest in the recreated directory recorded", func() (bool, string) {
		got := f.podImages(t)
		return got["db-n1"] == "busybox:3", fmt.Sprintf("pods %v", got)
	})
}

// An edit that keeps a file's size and lands within the same mtime tick
// does not change the fingerprint; the periodic full resync still finds it.
func TestSyncManifestsFullResyncCatchesSameSizeEdit(t *testing.T) {
	f := newFixture(t)
	path := filepath.Join(f.dir, "web.yaml")
	f.write(t, "web.yaml", pod("web", "busybox:1"))
	if err := f.agent.SyncManifests(); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	f.write(t, "web.yaml", pod("web", "busybox:2")) // same size
	os.Chtimes(path, st.ModTime(), st.ModTime())    // same mtime
	if err := f.agent.SyncManifests(); err != nil {
		t.Fatal(err)
	}
	if got := f.podImages(t)["web-n1"]; got != "busybox:1" {
		t.Fatalf("image = %s before the full resync; the fingerprint should have hidden the edit", got)
	}
	f.clock.Advance(fullResync)
	if err := f.agent.SyncManifests(); err != nil {
		t.Fatal(err)
	}
	if got := f.podImages(t)["web-n1"]; got != "busybox:2" {
		t.Fatalf("image = %s after the full resync, want busybox:2", got)
	}
}
