//go:build !linux

package memtrim

func unmapExecutable() (int64, error) { return 0, nil }

func threadCount() int { return 0 }
