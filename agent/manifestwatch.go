package agent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"unsafe"

	"github.com/outpost-edge/outpost/agent/staticpods"
	"golang.org/x/sys/unix"
)

// manifestWatch tells, through inotify, when a manifest file in a
// directory may have changed, as kubelet's file source does. Changes to
// other names (editor swap files, backups, dotfiles) wake no one.
type manifestWatch struct {
	f *os.File
	// changed holds a token once a manifest file was created, written,
	// renamed, removed or had its attributes changed, or the kernel's
	// event queue overflowed (not when the directory itself went: done).
	changed chan struct{}
	// done is closed when the watch has ended: Close was called, or the
	// directory was removed or renamed, or reading failed.
	done chan struct{}
	// seen, if set, is told of each event's name and whether it woke.
	seen func(name string, woke bool)
}

// manifestEvents are the events that may change what a manifest file
// holds. IN_MODIFY comes with every write; a burst is coalesced by the
// agent before it reads.
const manifestEvents = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MODIFY | unix.IN_CLOSE_WRITE |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_ATTRIB |
	unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// watchManifests starts watching dir; seen, if not nil, is told of every
// event (tests). The caller must Close the watch.
func watchManifests(dir string, seen func(name string, woke bool)) (*manifestWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("watch manifest dir %s: inotify: %w", dir, err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, manifestEvents); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watch manifest dir %s: %w", dir, err)
	}
	// A non-blocking descriptor goes to the runtime's poller, so Close
	// wakes the reader.
	w := &manifestWatch{
		f:       os.NewFile(uintptr(fd), "inotify:"+dir),
		changed: make(chan struct{}, 1),
		done:    make(chan struct{}),
		seen:    seen,
	}
	go w.read()
	return w, nil
}

// read delivers events until the watch ends.
func (w *manifestWatch) read() {
	defer close(w.done)
	buf := make([]byte, 4096)
	for {
		n, err := w.f.Read(buf)
		if err != nil || n < unix.SizeofInotifyEvent {
			return
		}
		ended := false
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := buf[off+unix.SizeofInotifyEvent : min(off+unix.SizeofInotifyEvent+int(ev.Len), n)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			file := string(bytes.TrimRight(name, "\x00"))
			woke := false
			switch {
			case ev.Mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_UNMOUNT) != 0:
				ended = true // done says so; the agent reads at once
			case ev.Mask&unix.IN_Q_OVERFLOW != 0, staticpods.IsManifest(file):
				woke = true
				w.notify()
			}
			if w.seen != nil {
				w.seen(file, woke)
			}
		}
		if ended {
			return
		}
	}
}

func (w *manifestWatch) notify() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// Close ends the watch and waits for its reader to return.
func (w *manifestWatch) Close() error {
	err := w.f.Close()
	<-w.done
	if errors.Is(err, os.ErrClosed) {
		err = nil
	}
	return err
}
