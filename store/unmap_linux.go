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
//
// A store that no transaction used since its last Unmap has nothing
// mapped and is left alone, so calling it often for thousands of stores
// costs only those in use.
func (s *Store) Unmap() error {
	used := s.txCount()
	if s.unmappedAt.Load() == used {
		return nil
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		start, size := tx.DB().Info().Data, uintptr(tx.Size())
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, start, size, unix.MADV_DONTNEED); errno != 0 {
			return fmt.Errorf("store %s: unmap: %w", s.path, errno)
		}
		return nil
	})
	if err == nil {
		// The View above is one read transaction; any other begun since
		// txCount makes the count differ next time.
		s.unmappedAt.Store(used + 1)
	}
	return err
}

// txCount is the number of read transactions begun and pages written so
// far: it changes whenever a transaction may have mapped a page.
func (s *Store) txCount() int64 {
	st := s.db.Stats()
	return int64(st.TxN) + st.TxStats.GetWrite()
}
