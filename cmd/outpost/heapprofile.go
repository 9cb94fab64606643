//go:build outpostpprof

package main

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"syscall"
)

// A build with -tags outpostpprof writes a heap profile to
// $OUTPOST_HEAPPROFILE (default /tmp/outpost-heap.pprof) on SIGUSR1, for
// finding where the agent's memory goes. Release builds leave it out.
func init() {
	path := os.Getenv("OUTPOST_HEAPPROFILE")
	if path == "" {
		path = "/tmp/outpost-heap.pprof"
	}
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGUSR1)
	go func() {
		for range c {
			runtime.GC()
			f, err := os.Create(path)
			if err != nil {
				continue
			}
			pprof.WriteHeapProfile(f)
			f.Close()
			if f, err := os.Create(path + ".goroutine"); err == nil {
				pprof.Lookup("goroutine").WriteTo(f, 1)
				f.Close()
			}
			if f, err := os.Create(path + ".memstats"); err == nil {
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				fmt.Fprintf(f, "HeapAlloc %d\nHeapInuse %d\nHeapIdle %d\nHeapReleased %d\nHeapSys %d\nStackInuse %d\nStackSys %d\nMSpanSys %d\nMCacheSys %d\nBuckHashSys %d\nGCSys %d\nOtherSys %d\nSys %d\nNextGC %d\nNumGoroutine %d\n",
					m.HeapAlloc, m.HeapInuse, m.HeapIdle, m.HeapReleased, m.HeapSys, m.StackInuse, m.StackSys, m.MSpanSys, m.MCacheSys, m.BuckHashSys, m.GCSys, m.OtherSys, m.Sys, m.NextGC, runtime.NumGoroutine())
				f.Close()
			}
		}
	}()
}
