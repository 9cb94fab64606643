package containerd

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Labels that record what happened to a container and that no caller
// waits for, its start time and the exit of a task lost with the node, are
// written behind: once label writes have paused for writeLull, and at most
// writeDelay after the first; until then List and reap take them from
// memory. An agent stopped writes what is left; after one killed first, a
// running container's start time is read back from the kernel
// (processStart), and a container whose task is gone is known to have
// started by its log (hasLog).
//
// Each label write is a transaction containerd's store syncs to disk under
// its one write lock. After a reboot the 30 pods' workers each found their
// container lost and recorded it, then started a new one and recorded its
// start time: 60 synced transactions while the disk is busiest with the
// new containers' snapshots and bundles. Written behind, the offline
// reboot of 30 pods took 3628 ms against 3991 (medians of 10 alternating
// runs on the 2-core test VM; docs/benchmarks.md).
const (
	writeLull  = time.Second
	writeDelay = 5 * time.Second
)

// writeBehind keeps labels to be written to container id.
func (r *Runtime) writeBehind(id string, labels map[string]string) {
	r.mu.Lock()
	if r.unwritten == nil {
		r.unwritten = map[string]map[string]string{}
	}
	p := r.unwritten[id]
	if p == nil {
		p = map[string]string{}
		r.unwritten[id] = p
	}
	for k, v := range labels {
		p[k] = v
	}
	r.mu.Unlock()
	select {
	case r.toWrite <- struct{}{}:
	default:
	}
}

// pending is a copy of the labels not yet written to container id.
func (r *Runtime) pending(id string) map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.unwritten[id]
	if p == nil {
		return nil
	}
	out := make(map[string]string, len(p))
	for k, v := range p {
		out[k] = v
	}
	return out
}

// withPending is labels with those not yet written to container id added.
func (r *Runtime) withPending(id string, labels map[string]string) map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.unwritten[id]
	if p == nil {
		return labels
	}
	out := make(map[string]string, len(labels)+len(p))
	for k, v := range labels {
		out[k] = v
	}
	for k, v := range p {
		out[k] = v
	}
	return out
}

// written forgets the labels of container id that wrote holds, unless they
// changed meanwhile.
func (r *Runtime) written(id string, wrote map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.unwritten[id]
	for k, v := range wrote {
		if pv, ok := p[k]; ok && pv == v {
			delete(p, k)
		}
	}
	if len(p) == 0 {
		delete(r.unwritten, id)
	}
}

// forgetLabels drops what is held for container id, which is gone.
func (r *Runtime) forgetLabels(id string) {
	r.mu.Lock()
	delete(r.unwritten, id)
	r.mu.Unlock()
}

// writeLabels writes the labels held in memory after each lull until ctx
// ends, then writes what is left.
func (r *Runtime) writeLabels(ctx context.Context) {
	defer close(r.writerDone)
	defer r.flushLabels(context.WithoutCancel(ctx), 2*time.Second)
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.toWrite:
		}
		// Wait for a lull in the writes, but not for ever.
		first := r.deps.Clock.Now()
		for wait := writeLull; wait > 0; {
			t := r.deps.Clock.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-r.toWrite:
				t.Stop()
				wait = min(writeLull, writeDelay-r.deps.Clock.Since(first))
			case <-t.C():
				wait = 0
			}
		}
		if !r.flushLabels(ctx, 0) {
			// Try again after the next lull.
			select {
			case r.toWrite <- struct{}{}:
			default:
			}
		}
	}
}

// flushLabels writes every label held in memory to its container, and
// reports whether all were written, within timeout if it is set. A
// container gone meanwhile needs none.
func (r *Runtime) flushLabels(ctx context.Context, timeout time.Duration) bool {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	ctx = r.ctx(ctx)
	r.mu.Lock()
	ids := make([]string, 0, len(r.unwritten))
	for id := range r.unwritten {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	ok := true
	for _, id := range ids {
		labels := r.pending(id)
		if labels == nil {
			continue
		}
		c, err := r.client.LoadContainer(ctx, id)
		if err == nil {
			_, err = c.SetLabels(ctx, labels)
		}
		switch {
		case err == nil:
			r.written(id, labels)
		case errdefs.IsNotFound(err):
			r.forgetLabels(id)
		default:
			r.deps.Log.Warn("record container labels", "container", id, "err", err)
			ok = false
		}
	}
	return ok
}

// processStart is when process pid started, as the kernel has it: the
// clock ticks from boot to its fork in /proc/<pid>/stat (USER_HZ, 100 on
// every Linux port) after the boot time, which r measures once by its
// clock. A container's start time is its task's process's: made at the
// task's create, it is a little before the start.
func (r *Runtime) processStart(pid uint32) (time.Time, bool) {
	r.bootOnce.Do(func() { r.boot, r.bootOK = bootTime(r.deps.Clock.Now()) })
	if !r.bootOK {
		return time.Time{}, false
	}
	return processStart(pid, r.boot)
}

// processStart is when process pid started, given when the system booted.
func processStart(pid uint32, boot time.Time) (time.Time, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return time.Time{}, false
	}
	// The command name may hold spaces and parentheses; the fields
	// after the last ')' start with the state, field 3.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return time.Time{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	const starttime = 22 - 3
	if len(f) <= starttime {
		return time.Time{}, false
	}
	ticks, err := strconv.ParseInt(f[starttime], 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return boot.Add(time.Duration(ticks) * 10 * time.Millisecond), true
}

// bootTime is when the system booted, with now the wall clock's time:
// now less the time since boot (CLOCK_BOOTTIME, which counts suspend too).
func bootTime(now time.Time) (time.Time, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Time{}, false
	}
	return now.Add(-time.Duration(ts.Nano())), true
}

// hasLog reports whether the container log at path exists.
func hasLog(path string) bool {
	if path == "" {
		return false
	}
	_, err := os.Stat(path)
	return err == nil
}

// removeEmptyLog removes the log a failed start opened and nothing wrote
// to, so that its existence tells a started container (hasLog).
func removeEmptyLog(path string) {
	if fi, err := os.Stat(path); err == nil && fi.Size() == 0 {
		os.Remove(path)
	}
}
