//go:build !linux

package store

// Unmap does nothing here: dropping mapped pages is Linux's madvise.
func (s *Store) Unmap() error { return nil }
