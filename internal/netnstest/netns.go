// Package netnstest gives a test a network namespace of its own, so that
// tests of the kernel's tables never program the namespace the test
// process runs in.
package netnstest

import (
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// New creates an anonymous network namespace for the test and returns a
// file descriptor for it, closed when the test ends. It skips the test
// when not root and fails it when the namespace cannot be made.
func New(t testing.TB) int {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	fd, err := Create()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// Create creates an anonymous network namespace from a thread of its
// own, which goes back to the original namespace, and returns a file
// descriptor for the new one; the caller closes it.
func Create() (int, error) {
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, err}
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, err}
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if serr := unix.Setns(orig, unix.CLONE_NEWNET); serr == nil {
			runtime.UnlockOSThread() // else the thread dies with the goroutine
		}
		done <- result{fd, err}
	}()
	r := <-done
	return r.fd, r.err
}
