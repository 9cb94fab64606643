//go:build outpostpprof

package main

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A build with -tags outpostpprof writes a heap profile to
// $OUTPOST_HEAPPROFILE (default /tmp/outpost-heap.pprof) on SIGUSR1, with
// the goroutines, MemStats and the runtime's /memory/ and /gc/ metrics
// beside it (.goroutine, .memstats, .metrics), for finding where the
// agent's memory goes; and with $OUTPOST_CPUPROFILE set, a CPU profile of
// its first seconds. Release builds leave it out.
func init() {
	// $OUTPOST_CPUPROFILE gets a CPU profile of the process's first
	// $OUTPOST_CPUPROFILE_SECONDS (default 10) seconds.
	if cpu := os.Getenv("OUTPOST_CPUPROFILE"); cpu != "" {
		// A %d in the path is the process ID: one profile per start.
		if strings.Contains(cpu, "%d") {
			cpu = fmt.Sprintf(cpu, os.Getpid())
		}
		secs, err := strconv.Atoi(os.Getenv("OUTPOST_CPUPROFILE_SECONDS"))
		if err != nil || secs <= 0 {
			secs = 10
		}
		if f, err := os.Create(cpu); err == nil && pprof.StartCPUProfile(f) == nil {
			time.AfterFunc(time.Duration(secs)*time.Second, func() { pprof.StopCPUProfile(); f.Close() })
		}
	}
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
			if f, err := os.Create(path + ".metrics"); err == nil {
				var ss []metrics.Sample
				for _, d := range metrics.All() {
					if d.Kind == metrics.KindUint64 && (strings.HasPrefix(d.Name, "/memory/") || strings.HasPrefix(d.Name, "/gc/")) {
						ss = append(ss, metrics.Sample{Name: d.Name})
					}
				}
				metrics.Read(ss)
				for _, s := range ss {
					fmt.Fprintf(f, "%s %d\n", s.Name, s.Value.Uint64())
				}
				f.Close()
			}
		}
	}()
}
