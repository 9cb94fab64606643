package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWriteReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{&fs.PathError{Op: "write", Path: "/x/outpost.db", Err: syscall.ENOSPC}, ReasonNoSpace},
		{fmt.Errorf("journal append pod/a: %w", syscall.EDQUOT), ReasonNoSpace},
		{&fs.PathError{Op: "fdatasync", Path: "/x/outpost.db", Err: syscall.EROFS}, ReasonReadOnly},
		// bbolt's grow formats its error with %s.
		{fmt.Errorf("file resize error: %s", &fs.PathError{Op: "truncate", Path: "/x", Err: syscall.ENOSPC}), ReasonNoSpace},
		{fmt.Errorf("file resize error: %s", syscall.EROFS), ReasonReadOnly},
		{syscall.EIO, ReasonWriteFailed},
	} {
		if got := WriteReason(tc.err); got != tc.want {
			t.Errorf("WriteReason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// A write refused for what it asks says nothing of the disk: WriteError
// stays nil, and the error is no write failure.
func TestRefusedWriteIsNoWriteFailure(t *testing.T) {
	s := openTemp(t)
	must(t, s.Reserve("10.0.0.2", "pod-a"))
	err := s.Reserve("10.0.0.2", "pod-b")
	if err == nil {
		t.Fatal("reserving another pod's address succeeded")
	}
	if IsWriteFailure(err) || s.WriteError() != nil {
		t.Errorf("refused write: IsWriteFailure %v, WriteError %v; want false, nil", IsWriteFailure(err), s.WriteError())
	}
}

// A failed commit is recorded until a write succeeds, and each change
// notifies KindWrite once.
func TestWriteErrorFollowsCommits(t *testing.T) {
	s := openTemp(t)
	ch, cancel := s.Subscribe(KindWrite)
	defer cancel()
	full := &fs.PathError{Op: "write", Path: s.Path(), Err: syscall.ENOSPC}
	for range 3 {
		if err := s.noteWrite(full, nil); !IsWriteFailure(err) || !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("noteWrite = %v, want a write failure wrapping ENOSPC", err)
		}
	}
	if WriteReason(s.WriteError()) != ReasonNoSpace {
		t.Fatalf("WriteError = %v, want NoSpace", s.WriteError())
	}
	select {
	case <-ch:
	default:
		t.Fatal("no notification for the first failure")
	}
	s.noteWrite(&fs.PathError{Op: "write", Path: s.Path(), Err: syscall.ENOSPC}, nil)
	select {
	case <-ch:
		t.Fatal("a second failure of the same reason notified")
	default:
	}
	s.noteWrite(&fs.PathError{Op: "write", Path: s.Path(), Err: syscall.EROFS}, nil)
	if WriteReason(s.WriteError()) != ReasonReadOnly {
		t.Fatalf("WriteError = %v, want ReadOnly", s.WriteError())
	}
	<-ch
	must(t, s.CheckWrite())
	if s.WriteError() != nil {
		t.Fatalf("WriteError after a good write = %v", s.WriteError())
	}
	<-ch
}

// Regression: Open wrote the schema and node name into the meta bucket
// at every start, so an agent restarted on a full or failing disk could
// not open its store. A store already laid out is not written.
func TestOpenOfLaidOutStoreDoesNotWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s, err := Open(path, Options{NodeName: "node-a"})
	must(t, err)
	before := lastTxID(t, s)
	s.Close()
	s, err = Open(path, Options{NodeName: "node-a"})
	must(t, err)
	defer s.Close()
	if after := lastTxID(t, s); after != before {
		t.Errorf("open committed %d write(s) to a laid-out store", after-before)
	}
	if m, _ := s.Meta(); m.Schema != SchemaVersion || m.NodeName != "node-a" {
		t.Errorf("meta = %+v", m)
	}
}

// On a real full file system (a 2 MiB tmpfs): writes fail with NoSpace
// and change nothing, the store stays readable and consistent, and once
// space returns CheckWrite succeeds and the writes go in.
func TestFullFileSystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=2m"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	defer syscall.Unmount(dir, syscall.MNT_DETACH)
	s, err := Open(filepath.Join(dir, FileName), Options{NodeName: "node-a"})
	must(t, err)
	defer s.Close()
	must(t, s.Pods().Put(SourceStatic, pod("default", "before", "busybox:1")))
	filler := filepath.Join(dir, "filler")
	fill(t, filler)
	var werr error
	written := 0
	for i := range 200 {
		if werr = s.Pods().Put(SourceStatic, pod("default", fmt.Sprintf("p%03d", i), strings.Repeat("x", 8<<10))); werr != nil {
			break
		}
		written++
	}
	if werr == nil {
		t.Fatal("200 writes of 8 KiB to a full 2 MiB file system succeeded")
	}
	if !IsWriteFailure(werr) || WriteReason(s.WriteError()) != ReasonNoSpace {
		t.Fatalf("write on a full file system: %v (IsWriteFailure %v), WriteError %v; want NoSpace", werr, IsWriteFailure(werr), s.WriteError())
	}
	if err := s.CheckWrite(); err != nil && WriteReason(err) != ReasonNoSpace {
		t.Errorf("CheckWrite on a full file system: %v", err)
	}
	if err := s.Check(); err != nil {
		t.Fatalf("consistency check on a full file system: %v", err)
	}
	if _, ok, err := s.Pods().Get("default", "before"); err != nil || !ok {
		t.Fatalf("read on a full file system: found %v, %v", ok, err)
	}
	must(t, os.Remove(filler))
	must(t, s.CheckWrite())
	if s.WriteError() != nil {
		t.Fatalf("WriteError with space back: %v", s.WriteError())
	}
	must(t, s.Pods().Put(SourceStatic, pod("default", "after", "busybox:1")))
	recs, err := s.Pods().List()
	must(t, err)
	if len(recs) != written+2 {
		t.Errorf("%d pods stored, want %d (%d written before the disk filled, and 2)", len(recs), written+2, written)
	}
	s.Close()
	s, err = Open(filepath.Join(dir, FileName), Options{ReadOnly: true})
	must(t, err)
	must(t, s.Check())
}

// fill writes path until its file system is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	must(t, err)
	defer f.Close()
	for _, n := range []int{1 << 20, 4 << 10, 512} {
		buf := make([]byte, n)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("fill %s: %v", path, err)
				}
				break
			}
		}
	}
}
