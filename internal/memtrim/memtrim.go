// Package memtrim gives back to the kernel what the agent touched while it
// was busy (starting, starting pods) and does not use when idle: the Go
// heap's free pages, and the pages of its executable and of the store's
// file it mapped then (the store unmaps its own: Unmapper). Those are clean pages of the file: unmapped, they stay in the page cache
// until the kernel wants the memory, and a page used again is mapped again
// from there (a minor fault), so the agent's RSS comes down to what it
// uses, and the rest is the kernel's to reclaim without touching the
// agent's page tables.
package memtrim

import (
	"context"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
)

// Run trims once changes (a store subscription, say to pods) has been
// quiet for quiet after its first value, and again after each later burst
// of changes has quieted; it returns when ctx ends.
func Run(ctx context.Context, changes <-chan struct{}, clk clock.Clock, quiet time.Duration, log *slog.Logger, files ...Unmapper) {
	timer := clk.NewTimer(quiet)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
			timer.Reset(quiet)
		case <-timer.C():
			n, err := Trim(files...)
			if err != nil {
				log.Debug("trim memory", "err", err)
			} else {
				log.Debug("trimmed memory", "unmapped", n)
			}
		}
	}
}

// Unmapper drops the pages of a file it maps from the process's page
// tables, as store.Store does with bbolt's mapping of the store's file.
type Unmapper interface {
	Unmap() error
}

// Trim unmaps the executable's read-only pages and the pages files (the
// store) mapped, and returns the heap's free pages to the kernel; it
// returns how many bytes of the executable's mappings it advised away
// (mapped or not). A file unmaps its own pages: only its owner knows when
// its mapping cannot move (bbolt remaps a growing file), and advising
// away a range that was remapped to something else would zero it.
func Trim(files ...Unmapper) (int64, error) {
	n, err := unmapExecutable()
	for _, f := range files {
		if ferr := f.Unmap(); ferr != nil && err == nil {
			err = ferr
		}
	}
	debug.FreeOSMemory()
	return n, err
}
