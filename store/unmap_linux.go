package store

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// Unmap drops the store file's pages from this process's page tables:
// bbolt reads through a read-only shared mapping of the file and writes
// through the file, so those pages are the file's and clean. Unmapped,
// they stay in the page cache until the kernel wants the memory, and a
// page read again is mapped again from there (a minor fault; bbolt maps
// the file MADV_RANDOM, so alone). A process that keeps many stores but
// reads most of their pages rarely (`outpost bridge`, a store for each
// node) holds only what it used lately. It runs inside a read
// transaction, which keeps bbolt from moving its mapping meanwhile.
func (s *Store) Unmap() error {
	return s.db.View(func(tx *bolt.Tx) error {
		start, size := tx.DB().Info().Data, uintptr(tx.Size())
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, start, size, unix.MADV_DONTNEED); errno != 0 {
			return fmt.Errorf("store %s: unmap: %w", s.path, errno)
		}
		return nil
	})
}
