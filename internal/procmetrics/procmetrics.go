// Package procmetrics writes the process and Go runtime families a
// Prometheus client library's default collectors export, under their
// usual names (process_resident_memory_bytes, go_goroutines,
// go_memstats_heap_alloc_bytes...), with the standard library only.
//
// The process families are read from /proc (Linux); on a system without
// it they are left out. go_gc_duration_seconds is a promtext.Summary with only its
// sum and count: the total stop-the-world pause time and the number of
// completed GC cycles.
package procmetrics

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/outpost-edge/outpost/internal/promtext"
)

// userHZ is the unit of the times in /proc/<pid>/stat: USER_HZ is 100 on
// every Linux architecture the agent runs on (it is fixed by the ABI, not
// by CONFIG_HZ).
const userHZ = 100

// Write writes the process families, then the Go runtime families.
func Write(p *promtext.Writer) {
	writeProcess(p, "/proc")
	writeGo(p)
}

func writeProcess(p *promtext.Writer, proc string) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		p.Family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", promtext.Counter)
		p.Sample("process_cpu_seconds_total", seconds(ru.Utime)+seconds(ru.Stime))
	}
	if rss, vsz, ok := statm(proc); ok {
		p.Family("process_resident_memory_bytes", "Resident memory size in bytes.", promtext.Gauge)
		p.Sample("process_resident_memory_bytes", float64(rss))
		p.Family("process_virtual_memory_bytes", "Virtual memory size in bytes.", promtext.Gauge)
		p.Sample("process_virtual_memory_bytes", float64(vsz))
	}
	if fds, err := os.ReadDir(proc + "/self/fd"); err == nil {
		p.Family("process_open_fds", "Number of open file descriptors.", promtext.Gauge)
		// ReadDir's own descriptor on the directory is among them.
		p.Sample("process_open_fds", float64(max(len(fds)-1, 0)))
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil {
		p.Family("process_max_fds", "Maximum number of open file descriptors.", promtext.Gauge)
		p.Sample("process_max_fds", float64(lim.Cur))
	}
	if start, ok := startTime(proc); ok {
		p.Family("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", promtext.Gauge)
		p.Sample("process_start_time_seconds", start)
	}
}

func seconds(t syscall.Timeval) float64 { return float64(int64(t.Sec)*1e6+int64(t.Usec)) / 1e6 }

// statm returns the resident and virtual sizes in bytes from
// /proc/self/statm, whose first two fields count pages.
func statm(proc string) (rss, vsz uint64, ok bool) {
	b, err := os.ReadFile(proc + "/self/statm")
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, 0, false
	}
	size, err1 := strconv.ParseUint(f[0], 10, 64)
	res, err2 := strconv.ParseUint(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	page := uint64(os.Getpagesize())
	return res * page, size * page, true
}

// startTime is when the process started, in seconds since the epoch: the
// boot time (btime of /proc/stat) plus the process's start (field 22 of
// /proc/self/stat, in USER_HZ ticks since boot).
func startTime(proc string) (float64, bool) {
	stat, err := os.ReadFile(proc + "/self/stat")
	if err != nil {
		return 0, false
	}
	// The command name (field 2) is in parentheses and may hold spaces
	// and parentheses: the fields that follow start after the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state), so field 22 is f[19].
	if len(f) < 20 {
		return 0, false
	}
	ticks, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, false
	}
	sys, err := os.ReadFile(proc + "/stat")
	if err != nil {
		return 0, false
	}
	for line := range strings.SplitSeq(string(sys), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			btime, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, false
			}
			return float64(btime) + float64(ticks)/userHZ, true
		}
	}
	return 0, false
}

func writeGo(p *promtext.Writer) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	p.Family("go_info", "Information about the Go environment.", promtext.Gauge)
	p.Sample("go_info", 1, "version", runtime.Version())
	p.Family("go_goroutines", "Number of goroutines that currently exist.", promtext.Gauge)
	p.Sample("go_goroutines", float64(runtime.NumGoroutine()))
	p.Family("go_gc_duration_seconds", "Stop-the-world pause time of the garbage collector: its sum in seconds and the number of completed GC cycles.", promtext.Summary)
	p.Sample("go_gc_duration_seconds_sum", float64(ms.PauseTotalNs)/1e9)
	p.Sample("go_gc_duration_seconds_count", float64(ms.NumGC))
	for _, g := range []struct {
		name, help string
		t          promtext.Type
		v          uint64
	}{
		{"go_memstats_alloc_bytes_total", "Total number of bytes allocated in the heap, even if freed.", promtext.Counter, ms.TotalAlloc},
		{"go_memstats_heap_alloc_bytes", "Number of heap bytes allocated and still in use (live objects and garbage not yet swept).", promtext.Gauge, ms.HeapAlloc},
		{"go_memstats_heap_inuse_bytes", "Number of heap bytes in spans that hold objects.", promtext.Gauge, ms.HeapInuse},
		{"go_memstats_heap_idle_bytes", "Number of heap bytes in spans that hold no objects.", promtext.Gauge, ms.HeapIdle},
		{"go_memstats_heap_released_bytes", "Number of heap bytes returned to the operating system.", promtext.Gauge, ms.HeapReleased},
		{"go_memstats_heap_objects", "Number of allocated heap objects.", promtext.Gauge, ms.HeapObjects},
		{"go_memstats_stack_inuse_bytes", "Number of bytes in stack spans.", promtext.Gauge, ms.StackInuse},
		{"go_memstats_sys_bytes", "Number of bytes obtained from the operating system.", promtext.Gauge, ms.Sys},
		{"go_memstats_next_gc_bytes", "Heap size at which the next garbage collection cycle ends.", promtext.Gauge, ms.NextGC},
		{"go_memstats_mallocs_total", "Total number of heap objects allocated.", promtext.Counter, ms.Mallocs},
		{"go_memstats_frees_total", "Total number of heap objects freed.", promtext.Counter, ms.Frees},
	} {
		p.Family(g.name, g.help, g.t)
		p.Sample(g.name, float64(g.v))
	}
	p.Family("go_memstats_last_gc_time_seconds", "Number of seconds since the epoch of the last garbage collection; 0 before the first.", promtext.Gauge)
	p.Sample("go_memstats_last_gc_time_seconds", float64(ms.LastGC)/1e9)
	p.Family("go_sched_gomaxprocs_threads", "The current runtime.GOMAXPROCS setting.", promtext.Gauge)
	p.Sample("go_sched_gomaxprocs_threads", float64(runtime.GOMAXPROCS(0)))
}
