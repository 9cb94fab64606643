package podnet

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// onFreshThread runs f on a goroutine locked to its own OS thread and
// returns f's error. f reports whether it left the thread as it found
// it; if not, the thread is never unlocked, so it exits with the
// goroutine instead of going back to the scheduler in the wrong netns.
func onFreshThread(f func() (clean bool, err error)) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		clean, err := f()
		if clean {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// inNetNS runs f with the calling thread switched into ns, on a fresh
// locked thread, and switches back afterwards.
func inNetNS(ns netns.NsHandle, f func() error) error {
	return onFreshThread(func() (bool, error) {
		orig, err := netns.Get()
		if err != nil {
			return true, fmt.Errorf("open current netns: %w", err)
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			return true, fmt.Errorf("enter netns: %w", err)
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			return false, errors.Join(ferr, fmt.Errorf("return to original netns: %w", err))
		}
		return true, ferr
	})
}

// isNetNS reports whether path is a mounted network namespace (a file on
// nsfs, as a bind mount of /proc/…/ns/net is).
func isNetNS(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("statfs %s: %w", path, err)
	}
	return st.Type == unix.NSFS_MAGIC, nil
}

// makeSharedMount makes dir a mount point with shared propagation, as
// `ip netns add` does for /run/netns: netns bind mounts under it then
// propagate to mount namespaces created later (container runtimes), and
// unmounting one here unmounts it there too, so a namespace is not kept
// alive by a copy of its mount elsewhere.
func makeSharedMount(dir string) error {
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("make %s a shared mount: %w", dir, err)
	}
	// Not a mount point yet: bind it onto itself first.
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind mount %s onto itself: %w", dir, err)
	}
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s a shared mount: %w", dir, err)
	}
	return nil
}

// createNetNS creates a new network namespace and bind-mounts it on path,
// like `ip netns add`. A file left at path by an earlier, interrupted
// attempt is reused.
func createNetNS(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o444)
	if err != nil {
		return fmt.Errorf("create netns file %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("create netns file %s: %w", path, err)
	}
	err = onFreshThread(func() (bool, error) {
		orig, err := netns.Get()
		if err != nil {
			return true, fmt.Errorf("open current netns: %w", err)
		}
		defer orig.Close()
		// Unshare moves only this locked thread into the new namespace.
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return true, fmt.Errorf("unshare netns: %w", err)
		}
		src := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		merr := unix.Mount(src, path, "none", unix.MS_BIND, "")
		if merr != nil {
			merr = fmt.Errorf("bind mount %s on %s: %w", src, path, merr)
		}
		if err := netns.Set(orig); err != nil {
			return false, errors.Join(merr, fmt.Errorf("return to original netns: %w", err))
		}
		return true, merr
	})
	if err != nil {
		_ = os.Remove(path) // not a namespace; the next attempt starts over
		return err
	}
	return nil
}

// maxStackedMounts bounds how many mounts removeNetNS peels off one file.
const maxStackedMounts = 8

// removeNetNS unmounts and removes the netns file at path. A missing or
// unmounted file is not an error.
func removeNetNS(path string) error {
	// Mounts can be stacked on the file (a crash between two attempts);
	// unmount until it is a plain file again.
	for i := 0; ; i++ {
		ok, err := isNetNS(path)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if i == maxStackedMounts {
			return fmt.Errorf("unmount netns %s: still mounted after %d unmounts", path, i)
		}
		// Lazy unmount: a process still inside keeps the namespace, but
		// the name goes away now.
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount netns %s: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns file %s: %w", path, err)
	}
	return nil
}
