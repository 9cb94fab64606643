// Package cgroups removes the cgroups the agent's pods leave behind.
// runc makes a container's cgroup, and the pod's above it, in every
// hierarchy; it removes the container's when the container is deleted,
// at best, and never the pod's. On cgroup v1 each memory cgroup keeps
// kernel memory after it is emptied, so a board that runs short pods for
// months would gather thousands. kubelet removes a pod's cgroups when
// the pod is gone; so does the agent, through this package.
package cgroups

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
)

// DefaultRoot is where the cgroup hierarchies are mounted.
const DefaultRoot = "/sys/fs/cgroup"

// Tree is the agent's part of the cgroup hierarchies: Parent in each
// hierarchy under Root, holding pod<UID> per pod and, under it, one
// cgroup per container attempt (its container ID).
type Tree struct {
	// Root is where the hierarchies are mounted (DefaultRoot when
	// empty): cgroup v2 when it holds cgroup.controllers, else one
	// directory per v1 hierarchy (and unified, v2, on a hybrid system).
	Root string
	// Parent is the agent's cgroup, e.g. /outpost.
	Parent string
	// Clock times the retries of a busy cgroup (clock.Real when nil).
	Clock clock.Clock
}

// PodPath is the pod's cgroup path, the parent of its containers'.
func (t Tree) PodPath(podUID string) string { return path.Join(t.Parent, "pod"+podUID) }

// BusyError is a cgroup that could not be removed because processes are
// still in it (or in a cgroup below it).
type BusyError struct {
	Dir  string
	PIDs []string
}

func (e *BusyError) Error() string {
	if len(e.PIDs) == 0 {
		return fmt.Sprintf("cgroup %s is busy", e.Dir)
	}
	return fmt.Sprintf("cgroup %s still has processes %s", e.Dir, strings.Join(e.PIDs, " "))
}

// RemovePod removes the pod's cgroup and every cgroup below it, in every
// hierarchy; one that is already gone is no error. It is called once the
// pod's containers are gone, so a process still in one of its cgroups is
// killed, as kubelet kills them: one that escaped its container, or one
// the kernel has not finished reaping. A cgroup still busy after a few
// tries is left, with a BusyError.
func (t Tree) RemovePod(podUID string) error {
	if err := checkName(podUID); err != nil {
		return err
	}
	return t.removeRetrying(t.PodPath(podUID), true)
}

// RemoveContainer removes one container attempt's cgroup in every
// hierarchy, as RemovePod does, but kills nothing: the pod lives on.
func (t Tree) RemoveContainer(podUID, id string) error {
	if err := checkName(podUID); err != nil {
		return err
	}
	if err := checkName(id); err != nil {
		return err
	}
	return t.removeRetrying(path.Join(t.PodPath(podUID), id), false)
}

// removeTries and removeDelay bound how long a busy cgroup is retried:
// rmdir can fail with EBUSY for a moment after the last process has
// exited (runc retries its own the same way), 10 ms doubling each time,
// some 300 ms in all.
const (
	removeTries = 5
	removeDelay = 10 * time.Millisecond
)

// killProcess is how a process left in a pod's cgroup is killed; tests,
// whose cgroup.procs name no real processes, replace it.
var killProcess = func(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }

// removeRetrying removes the cgroup at p in every hierarchy, retrying
// while one is busy; with kill, it first kills the processes in those
// that are.
func (t Tree) removeRetrying(p string, kill bool) error {
	delay := removeDelay
	for try := 1; ; try++ {
		err := t.removeAll(p)
		var busy *BusyError
		if err == nil || !errors.As(err, &busy) || try == removeTries {
			return err
		}
		if kill {
			t.thaw(p)
			killBusy(err)
		}
		<-t.clock().NewTimer(delay).C()
		delay *= 2
	}
}

func (t Tree) clock() clock.Clock {
	if t.Clock == nil {
		return clock.Real{}
	}
	return t.Clock
}

// ThawAll thaws Parent and every cgroup below it, in every hierarchy
// (thaw): for a test's cleanup of containers a killed runc left frozen.
func (t Tree) ThawAll() { t.thaw(t.Parent) }

// thaw thaws the cgroup at p and those below it, in every hierarchy. A
// runc killed while it had a container's cgroup frozen (it freezes one to
// change its device rules) leaves it frozen, and a frozen process does
// not die of SIGKILL until it is thawed. What is not frozen is left as it
// is.
func (t Tree) thaw(p string) {
	hs, err := t.hierarchies()
	if err != nil {
		return
	}
	for _, h := range hs {
		filepath.WalkDir(filepath.Join(h, p), func(dir string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				writeExisting(filepath.Join(dir, "freezer.state"), "FROZEN", "THAWED") // v1
				writeExisting(filepath.Join(dir, "cgroup.freeze"), "1", "0")           // v2
			}
			return nil
		})
	}
}

// writeExisting writes to to the control file at path when it holds
// from; a missing file is no cgroup of that kind.
func writeExisting(path, from, to string) {
	b, err := os.ReadFile(path)
	if err != nil || strings.TrimSpace(string(b)) != from {
		return
	}
	os.WriteFile(path, []byte(to), 0)
}

// killBusy kills the processes of every BusyError in err's tree.
func killBusy(err error) {
	switch e := err.(type) {
	case *BusyError:
		for _, s := range e.PIDs {
			if pid, err := strconv.Atoi(s); err == nil && pid > 1 {
				killProcess(pid)
			}
		}
	case interface{ Unwrap() []error }:
		for _, err := range e.Unwrap() {
			killBusy(err)
		}
	case interface{ Unwrap() error }:
		killBusy(e.Unwrap())
	}
}

// RemoveAll removes Parent itself and every cgroup below it, in every
// hierarchy: for an uninstall, or a test's cleanup of its own agent.
func (t Tree) RemoveAll() error {
	if t.Parent == "" || path.Clean(t.Parent) == "/" {
		return fmt.Errorf("cgroup parent %q: not below the root", t.Parent)
	}
	return t.removeAll(t.Parent)
}

// removeAll removes the cgroup at p, and those below it, in every
// hierarchy.
func (t Tree) removeAll(p string) error {
	hs, err := t.hierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		if err := removeTree(filepath.Join(h, p)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// hierarchies returns the mounted hierarchies' directories.
func (t Tree) hierarchies() ([]string, error) {
	root := t.Root
	if root == "" {
		root = DefaultRoot
	}
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return []string{root}, nil
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("cgroup hierarchies: %w", err)
	}
	var out []string
	for _, e := range entries {
		// cpu and cpuacct are often symbolic links to cpu,cpuacct:
		// DirEntry does not follow them, so each hierarchy comes once.
		if e.IsDir() {
			out = append(out, filepath.Join(root, e.Name()))
		}
	}
	return out, nil
}

// removeTree removes the cgroup dir and those below it, deepest first.
// A cgroup directory holds only its control files, which rmdir takes
// with it; rmdir refuses one with processes (EBUSY).
func removeTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	err = syscall.Rmdir(dir)
	switch {
	case err == nil, errors.Is(err, syscall.ENOENT):
		return nil
	case errors.Is(err, syscall.EBUSY), errors.Is(err, syscall.ENOTEMPTY):
		return &BusyError{Dir: dir, PIDs: pids(dir)}
	}
	return fmt.Errorf("remove cgroup %s: %w", dir, err)
}

// pids lists the processes in the cgroup dir.
func pids(dir string) []string {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}

// checkName refuses a UID or container ID that is not one path element.
func checkName(s string) error {
	if s == "" || s == "." || s == ".." || strings.ContainsAny(s, "/\x00") {
		return fmt.Errorf("cgroup name %q: not a pod UID or container ID", s)
	}
	return nil
}
