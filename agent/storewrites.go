package agent

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/outpost-edge/outpost/store"
	corev1 "k8s.io/api/core/v1"
)

// StoreWrites says whether the store takes writes: what `outpost status`
// shows and the StoreWritable node condition says.
type StoreWrites struct {
	// Writable is false while the store's file system is full or its
	// writes fail.
	Writable bool `json:"writable"`
	// Reason is store.ReasonNoSpace, store.ReasonReadOnly or
	// store.ReasonWriteFailed when not Writable.
	Reason string `json:"reason,omitempty"`
	// Message says what failed, naming the file or file system.
	Message string `json:"message,omitempty"`
	// Since is when Writable or Reason last changed.
	Since time.Time `json:"since,omitzero"`
}

// NodeStoreWritable is outpost's node condition about its store: True
// while the store takes writes, False with reason NoSpace, ReadOnly or
// WriteFailed while it does not. Pods keep running meanwhile; it says
// that what the node learns is not kept across a restart of the agent.
const NodeStoreWritable corev1.NodeConditionType = "StoreWritable"

// ReasonStoreWritable is NodeStoreWritable's reason while it is True.
const ReasonStoreWritable = "StoreWritable"

// Store write checks: the state file system's free space is looked at
// at every turn of the main loop (at least every fullResync), and while
// writes fail the loop turns every storeCheckEvery and tries one; a file
// system with less than storeMinFree free counts as full (the store's file grows
// by doubling, and bbolt cannot write into space it does not have).
const (
	storeCheckEvery = 5 * time.Second
	storeMinFree    = 1 << 20
)

// storeWritesOf is what err, the store's newest failed write (nil when
// the newest succeeded), and fs, its file system's space, say; statErr
// is why fs could not be read.
func storeWritesOf(dir string, err error, fs FSStats, statErr error) StoreWrites {
	switch {
	case err != nil && store.WriteReason(err) != store.ReasonNoSpace:
		return StoreWrites{Reason: store.WriteReason(err), Message: err.Error()}
	case err != nil:
		return StoreWrites{Reason: store.ReasonNoSpace, Message: err.Error()}
	case statErr == nil && fs.Capacity > 0 && fs.Available < storeMinFree:
		return StoreWrites{Reason: store.ReasonNoSpace, Message: fmt.Sprintf("the file system of %s is full (less than 1 MiB free)", dir)}
	}
	return StoreWrites{Writable: true}
}

// storeCondition is the StoreWritable node condition for w.
func storeCondition(w StoreWrites) corev1.NodeCondition {
	if w.Writable {
		return corev1.NodeCondition{Type: NodeStoreWritable, Status: corev1.ConditionTrue, Reason: ReasonStoreWritable, Message: "outpost's store takes writes"}
	}
	return corev1.NodeCondition{Type: NodeStoreWritable, Status: corev1.ConditionFalse, Reason: w.Reason,
		Message: "outpost's store takes no writes; pods keep running and writes are retried: " + w.Message}
}

// StoreWrites returns whether the store takes writes, as last checked.
func (a *Agent) StoreWrites() StoreWrites {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.storeWrites
}

// checkStore updates StoreWrites from the store's newest write and its
// file system's free space, and logs a change once. With retry, while
// writes fail it first tries one, so that it learns when the disk takes
// writes again even when nothing else writes. It reports whether the
// store takes writes again after it did not: the caller writes what
// could not be written (the pod workers are woken here).
func (a *Agent) checkStore(retry bool) (back bool) {
	st := a.deps.Store
	if retry && st.WriteError() != nil {
		st.CheckWrite() // its outcome is WriteError's
	}
	dir := filepath.Dir(st.Path())
	statfs := a.statfs
	if statfs == nil {
		statfs = statFS
	}
	fs, statErr := statfs(dir)
	w := storeWritesOf(dir, st.WriteError(), fs, statErr)
	a.mu.Lock()
	old := a.storeWrites
	if w.Writable == old.Writable && w.Reason == old.Reason {
		a.mu.Unlock()
		return false
	}
	w.Since = a.deps.Clock.Now()
	a.storeWrites = w
	a.mu.Unlock()
	if !w.Writable {
		a.deps.Log.Warn("store takes no writes; pods keep running, writes are retried", "store", st.Path(), "reason", w.Reason, "err", w.Message)
		return false
	}
	a.deps.Log.Info("store takes writes again", "store", st.Path(), "was", old.Reason)
	if a.pods != nil {
		a.pods.wakeAll()
	}
	return true
}

// storeWritable reports whether the store took writes at the last check.
func (a *Agent) storeWritable() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.storeWrites.Writable
}

// storeErrLevel is the level to log a failed store write at: Debug when
// the disk refused it (watchStore says so once per change), else Warn.
func storeErrLevel(err error) slog.Level {
	if store.IsWriteFailure(err) {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}
