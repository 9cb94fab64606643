package procmetrics

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/internal/promtext"
)

// samples parses the text format into sample name (with labels) → value,
// and checks that every sample follows its own family's TYPE line.
func samples(t *testing.T, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	family := ""
	for line := range strings.SplitSeq(strings.TrimSuffix(text, "\n"), "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			family, _, _ = strings.Cut(rest, " ")
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		name, value := line[:i], line[i+1:]
		base, _, _ := strings.Cut(name, "{")
		if base != family && base != family+"_sum" && base != family+"_count" {
			t.Errorf("sample %s is not of family %s", name, family)
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Errorf("%s: %v", line, err)
		}
		if _, dup := out[name]; dup {
			t.Errorf("sample %s twice", name)
		}
		out[name] = v
	}
	return out
}

func TestWrite(t *testing.T) {
	var b strings.Builder
	p := promtext.New(&b)
	Write(p)
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	got := samples(t, b.String())
	for _, name := range []string{
		"process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
		"process_open_fds", "process_max_fds", "process_start_time_seconds",
		"go_goroutines", "go_gc_duration_seconds_sum", "go_gc_duration_seconds_count",
		"go_memstats_heap_alloc_bytes", "go_memstats_alloc_bytes_total", "go_memstats_sys_bytes",
	} {
		if _, ok := got[name]; !ok {
			t.Errorf("no sample %s in\n%s", name, b.String())
		}
	}
	if v := got[`go_info{version="`+runtime.Version()+`"}`]; v != 1 {
		t.Errorf("go_info = %v, want 1", v)
	}
	if got["process_resident_memory_bytes"] < 1<<20 {
		t.Errorf("RSS %v bytes is less than 1 MiB", got["process_resident_memory_bytes"])
	}
	if got["go_goroutines"] < 1 || got["go_memstats_heap_alloc_bytes"] <= 0 {
		t.Errorf("goroutines %v, heap %v", got["go_goroutines"], got["go_memstats_heap_alloc_bytes"])
	}
	if fds := got["process_open_fds"]; fds < 3 || fds > got["process_max_fds"] {
		t.Errorf("open fds %v (max %v)", fds, got["process_max_fds"])
	}
	// The test binary started in the last hour.
	if d := float64(time.Now().Unix()) - got["process_start_time_seconds"]; d < -2 || d > 3600 {
		t.Errorf("start time %v is %v s before now", got["process_start_time_seconds"], d)
	}
}

// TestProcFiles reads a made-up /proc: a command name with spaces and
// parentheses, and a kernel without the process files.
func TestProcFiles(t *testing.T) {
	proc := t.TempDir()
	os.MkdirAll(filepath.Join(proc, "self", "fd"), 0o755)
	for _, fd := range []string{"0", "1", "2", "3"} {
		os.WriteFile(filepath.Join(proc, "self", "fd", fd), nil, 0o644)
	}
	os.WriteFile(filepath.Join(proc, "self", "statm"), []byte("5000 1200 300 200 0 900 0\n"), 0o644)
	// Field 22 (starttime) is 12345 ticks.
	stat := "4242 (out post) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 9 0 12345 1000 1200 18446744073709551615\n"
	os.WriteFile(filepath.Join(proc, "self", "stat"), []byte(stat), 0o644)
	os.WriteFile(filepath.Join(proc, "stat"), []byte("cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n"), 0o644)

	var b strings.Builder
	p := promtext.New(&b)
	writeProcess(p, proc)
	p.Flush()
	got := samples(t, b.String())
	page := float64(os.Getpagesize())
	for name, want := range map[string]float64{
		"process_resident_memory_bytes": 1200 * page,
		"process_virtual_memory_bytes":  5000 * page,
		"process_open_fds":              3, // 4 entries, as if one were ReadDir's own
		"process_start_time_seconds":    1700000000 + 123.45,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}

	b.Reset()
	p = promtext.New(&b)
	writeProcess(p, t.TempDir())
	p.Flush()
	for _, name := range []string{"process_resident_memory_bytes", "process_open_fds", "process_start_time_seconds"} {
		if strings.Contains(b.String(), name) {
			t.Errorf("%s written without /proc:\n%s", name, b.String())
		}
	}
}
