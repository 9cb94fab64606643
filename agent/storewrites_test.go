package agent

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/store"
)

func TestStoreWritesOf(t *testing.T) {
	roomy := FSStats{Capacity: 64 << 20, Available: 32 << 20}
	full := FSStats{Capacity: 64 << 20, Available: 4 << 10}
	enospc := &fs.PathError{Op: "write", Path: "/var/lib/outpost/outpost.db", Err: syscall.ENOSPC}
	erofs := &fs.PathError{Op: "write", Path: "/var/lib/outpost/outpost.db", Err: syscall.EROFS}
	for _, tc := range []struct {
		name    string
		err     error
		fs      FSStats
		statErr error
		want    StoreWrites
	}{
		{"fine", nil, roomy, nil, StoreWrites{Writable: true}},
		{"full, writes still fit", nil, full, nil, StoreWrites{Reason: store.ReasonNoSpace, Message: "the file system of /var/lib/outpost is full (less than 1 MiB free)"}},
		{"write refused for space", enospc, roomy, nil, StoreWrites{Reason: store.ReasonNoSpace, Message: enospc.Error()}},
		{"read-only, and full", erofs, full, nil, StoreWrites{Reason: store.ReasonReadOnly, Message: erofs.Error()}},
		{"io error", syscall.EIO, roomy, nil, StoreWrites{Reason: store.ReasonWriteFailed, Message: syscall.EIO.Error()}},
		{"statfs fails, writes work", nil, FSStats{}, errors.New("statfs: no such file"), StoreWrites{Writable: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := storeWritesOf("/var/lib/outpost", tc.err, tc.fs, tc.statErr); got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// The StoreWritable condition joins the node's when asked for, True or
// False with the reason; without StoreWrites it is left out.
func TestNodeStatusStoreWritable(t *testing.T) {
	cond := func(st corev1.NodeStatus) *corev1.NodeCondition {
		for i := range st.Conditions {
			if st.Conditions[i].Type == NodeStoreWritable {
				return &st.Conditions[i]
			}
		}
		return nil
	}
	statfs := func(string) (FSStats, error) { return FSStats{Capacity: 1 << 30, Available: 1 << 29}, nil }
	if c := cond(NodeStatus(NodeConfig{}, NodeDeps{Statfs: statfs})); c != nil {
		t.Errorf("StoreWritable without StoreWrites: %+v", c)
	}
	w := StoreWrites{Writable: true}
	deps := NodeDeps{Statfs: statfs, StoreWrites: func() StoreWrites { return w }}
	if c := cond(NodeStatus(NodeConfig{}, deps)); c == nil || c.Status != corev1.ConditionTrue || c.Reason != ReasonStoreWritable {
		t.Errorf("writable: %+v", c)
	}
	w = StoreWrites{Reason: store.ReasonReadOnly, Message: "commit /var/lib/outpost/outpost.db: read-only file system"}
	c := cond(NodeStatus(NodeConfig{}, deps))
	if c == nil || c.Status != corev1.ConditionFalse || c.Reason != store.ReasonReadOnly || !strings.Contains(c.Message, "read-only file system") {
		t.Errorf("read-only: %+v", c)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) count(sub string) int {
	return strings.Count(s.String(), sub)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A full state file system is said in status and logged once, however
// long it lasts; while it lasts the loop looks every storeCheckEvery, and
// once space returns that is logged once too.
func TestRunSaysOnceThatTheStoreIsFull(t *testing.T) {
	f := newFixture(t)
	var logs syncBuffer
	f.agent.deps.Log = slog.New(slog.NewTextHandler(&logs, nil))
	var mu sync.Mutex
	avail := uint64(1 << 30)
	f.agent.statfs = func(string) (FSStats, error) {
		mu.Lock()
		defer mu.Unlock()
		return FSStats{Capacity: 2 << 30, Available: avail}, nil
	}
	setAvail := func(n uint64) { mu.Lock(); avail = n; mu.Unlock() }
	f.runAgent(t)
	if w := f.agent.StoreWrites(); !w.Writable {
		t.Fatalf("at start: %+v", w)
	}
	setAvail(100 << 10)
	f.waitWaiters(t, 1, "the resync timer")
	f.clock.Advance(fullResync)
	watchWait.For(t, "status to say the store is full", func() (bool, string) {
		s, err := f.agent.Status()
		w := s.Agent.StoreWrites
		return err == nil && !w.Writable && w.Reason == store.ReasonNoSpace, w.Reason
	})
	for range 4 {
		f.waitWaiters(t, 1, "the store check timer")
		f.clock.Advance(storeCheckEvery)
	}
	f.waitWaiters(t, 1, "the store check timer, after the last check")
	if n := logs.count("store takes no writes"); n != 1 {
		t.Errorf("%d warnings of a full store, want 1:\n%s", n, logs.String())
	}
	setAvail(1 << 30)
	f.clock.Advance(storeCheckEvery)
	watchWait.For(t, "status to say the store takes writes", func() (bool, string) {
		w := f.agent.StoreWrites()
		return w.Writable, w.Reason
	})
	// The agent says so in its status before it logs it.
	watchWait.For(t, "the note that the store takes writes again", func() (bool, string) {
		return logs.count("store takes writes again") > 0, logs.String()
	})
	if n := logs.count("store takes writes again"); n != 1 {
		t.Errorf("%d notes of the store writable again, want 1:\n%s", n, logs.String())
	}
	if w := f.agent.StoreWrites(); w.Since != f.clock.Now() {
		t.Errorf("since %v, want the check's time %v", w.Since, f.clock.Now())
	}
}
