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
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
)

// GC is the collector's GOGC while the changes come (Busy) and once they
// have quieted (Idle); zero leaves GOGC as it is. The heap the runtime
// lets grow between collections is GOGC percent of the live heap and the
// stacks. Busy, the agent allocates fast, and a low GOGC costs it CPU
// while pods start (GOGC 25 made 30 pods start 40 % slower); idle, it
// allocates little, and a low GOGC costs next to nothing.
type GC struct {
	Busy, Idle int
}

// Run trims once changes (a store subscription, say to pods) has been
// quiet for quiet after its first value, and again after each later burst
// of changes has quieted, setting GOGC to gc.Idle before each trim and
// back to gc.Busy at the first change after; while it stays quiet, it
// gives the heap's free pages back every quiet (see returnFree). It
// returns when ctx ends.
func Run(ctx context.Context, changes <-chan struct{}, clk clock.Clock, quiet time.Duration, log *slog.Logger, gc GC, files ...Unmapper) {
	timer := clk.NewTimer(quiet)
	defer timer.Stop()
	idle := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
			if idle && gc.Busy > 0 {
				debug.SetGCPercent(gc.Busy)
			}
			idle = false
			timer.Reset(quiet)
		case <-timer.C():
			timer.Reset(quiet)
			if idle {
				returnFree()
				log.Debug("returned the heap's free pages")
				continue
			}
			if gc.Idle > 0 {
				debug.SetGCPercent(gc.Idle)
			}
			idle = true
			n, err := Trim(files...)
			if err != nil {
				log.Debug("trim memory", "err", err)
			} else {
				log.Debug("trimmed memory", "unmapped", n)
			}
		}
	}
}

// returnFree collects and gives the heap's free pages back to the
// kernel. Idle, the agent still allocates (status reports, probes), and
// the spans its collections free stay mapped until the runtime's
// scavenger, which leaves alone the pages freed in the last cycle, gets
// to them: with 30 pods, 0.6 MiB of the heap was such free pages 25 s
// after the trim. A forced collection of a heap of a few MiB costs a
// millisecond or two.
func returnFree() { debug.FreeOSMemory() }

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
	shedThreads()
	n, err := unmapExecutable()
	for _, f := range files {
		if ferr := f.Unmap(); ferr != nil && err == nil {
			err = ferr
		}
	}
	debug.FreeOSMemory()
	return n, err
}

// spareThreads is how many OS threads shedThreads leaves beyond
// GOMAXPROCS: the runtime's own (sysmon, the template thread) and a few
// for blocking system calls.
const spareThreads = 4

// shedThreads ends the OS threads the process has beyond GOMAXPROCS and
// spareThreads. The Go runtime never ends a thread it made: a burst of
// blocking system calls (thirty pods' FIFOs opened, their logs and the
// store written at once) leaves a dozen idle, and each keeps 48 KiB of
// stacks from the heap (its scheduler stack and its signal stack). A
// goroutine that exits locked to its thread ends that thread, and the
// runtime hands its P to an idle thread; when none is idle, it makes
// one, so at worst this ends as many threads as it makes.
func shedThreads() {
	extra := threadCount() - runtime.GOMAXPROCS(0) - spareThreads
	if extra <= 0 {
		return
	}
	var wg sync.WaitGroup
	for range extra {
		wg.Go(runtime.LockOSThread) // never unlocked: the thread ends with it
	}
	wg.Wait()
}
