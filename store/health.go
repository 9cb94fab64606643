package store

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// KindWrite is notified when the store's writes start failing to reach
// the disk, when the reason changes, and when a write succeeds again
// (WriteError tells which).
const KindWrite Kind = "write"

// Why a write did not reach the disk, as WriteReason names it.
const (
	// ReasonNoSpace: the file system is full (ENOSPC, EDQUOT).
	ReasonNoSpace = "NoSpace"
	// ReasonReadOnly: the file system is read-only (EROFS), as after the
	// kernel remounts a failing disk read-only.
	ReasonReadOnly = "ReadOnly"
	// ReasonWriteFailed: any other write error (EIO).
	ReasonWriteFailed = "WriteFailed"
)

// WriteError returns the error of the newest write whose commit failed
// (the disk refused it; the store is unchanged by it), or nil when none
// failed since the newest that succeeded. A write refused for what it
// asks (ErrSourceConflict, an address held by another pod) leaves it as
// it was: it says nothing of the disk.
func (s *Store) WriteError() error {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	return s.writeErr
}

// WriteReason names why err, a failed write, did not reach the disk:
// ReasonNoSpace, ReasonReadOnly or ReasonWriteFailed; "" for nil.
func WriteReason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return ReasonNoSpace
	case errors.Is(err, syscall.EROFS):
		return ReasonReadOnly
	}
	// bbolt formats some errors with %s (growing the file), which loses
	// the errno: match its text.
	switch msg := err.Error(); {
	case strings.Contains(msg, syscall.ENOSPC.Error()), strings.Contains(msg, syscall.EDQUOT.Error()):
		return ReasonNoSpace
	case strings.Contains(msg, syscall.EROFS.Error()):
		return ReasonReadOnly
	}
	return ReasonWriteFailed
}

// IsWriteFailure reports whether err is a write whose commit the disk
// refused, as WriteError records them, rather than one refused for what
// it asked.
func IsWriteFailure(err error) bool {
	var w *writeFailure
	return errors.As(err, &w)
}

// writeFailure marks an error of a commit, so callers can tell a disk's
// refusal from a refused request (IsWriteFailure).
type writeFailure struct{ err error }

func (w *writeFailure) Error() string { return w.err.Error() }
func (w *writeFailure) Unwrap() error { return w.err }

// CheckWrite commits a write of the meta bucket, so that a store whose
// writes failed learns when the disk takes them again even when nothing
// else needs writing. It returns the write's error.
func (s *Store) CheckWrite() error {
	return s.batch(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyWriteCheck, []byte{1})
	})
}

// noteWrite records the outcome of a write transaction: err is what it
// returned, fnErr what its function returned. It returns err, marked as
// a writeFailure when the commit failed.
func (s *Store) noteWrite(err, fnErr error) error {
	if err != nil && (fnErr != nil || errors.Is(err, berrors.ErrDatabaseNotOpen) ||
		errors.Is(err, berrors.ErrDatabaseReadOnly) || errors.Is(err, berrors.ErrTxClosed)) {
		return err // refused for what it asked: nothing known of the disk
	}
	if err != nil {
		err = &writeFailure{fmt.Errorf("commit %s: %w", s.path, err)}
	}
	s.healthMu.Lock()
	changed := (err == nil) != (s.writeErr == nil) || WriteReason(err) != WriteReason(s.writeErr)
	s.writeErr = err
	s.healthMu.Unlock()
	if changed {
		s.notify(KindWrite)
	}
	return err
}
