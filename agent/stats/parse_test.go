package stats

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestLayout(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		want  layout
	}{
		{"v2", []string{"cgroup.controllers", "unified/x"}, layout{v2: true, cpu: ".", mem: "."}},
		{"v1 hybrid, separate cpuacct", []string{"unified/cgroup.controllers", "cpu/cgroup.procs", "cpuacct/cgroup.procs", "memory/cgroup.procs"}, layout{cpu: "cpuacct", mem: "memory"}},
		{"v1 cpu,cpuacct", []string{"cpu,cpuacct/cgroup.procs", "memory/cgroup.procs"}, layout{cpu: "cpu,cpuacct", mem: "memory"}},
		{"v1 cpuacct,cpu", []string{"cpuacct,cpu/cgroup.procs", "memory/cgroup.procs"}, layout{cpu: "cpuacct,cpu", mem: "memory"}},
		{"v1 memory off", []string{"cpuacct/cgroup.procs", "memory/.keep"}, layout{cpu: "cpuacct"}},
		{"nothing", nil, layout{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			files := map[string]string{}
			for _, f := range tc.files {
				files[f] = ""
			}
			writeFiles(t, root, files)
			got := New(Options{CgroupRoot: root}).layout()
			want := tc.want
			for _, p := range []*string{&want.cpu, &want.mem} {
				if *p != "" {
					*p = filepath.Join(root, *p)
				}
			}
			if got != want {
				t.Errorf("got %+v, want %+v", got, want)
			}
		})
	}
}

func TestParseMemStat(t *testing.T) {
	v1 := "cache 1\nrss 2\ninactive_file 3\ntotal_cache 10\ntotal_rss 20\ntotal_inactive_file 30\ntotal_pgfault 40\ntotal_pgmajfault 50\ntotal_rss_huge 99\n"
	if got, err := parseMemStat(v1, false); err != nil || got != (memStat{anon: 20, file: 10, inactiveFile: 30, pgfault: 40, pgmajfault: 50}) {
		t.Errorf("v1: %+v, %v", got, err)
	}
	v2 := "anon 20\nfile 10\nkernel 5\nanon_thp 99\ninactive_file 30\npgfault 40\npgmajfault 50\n"
	if got, err := parseMemStat(v2, true); err != nil || got != (memStat{anon: 20, file: 10, inactiveFile: 30, pgfault: 40, pgmajfault: 50}) {
		t.Errorf("v2: %+v, %v", got, err)
	}
	if _, err := parseMemStat("anon x\n", true); err == nil || !strings.Contains(err.Error(), "key anon") {
		t.Errorf("bad value: %v", err)
	}
	if _, err := parseMemStat("weird line\nanon_thp x\n", true); err != nil {
		t.Errorf("unused keys must not be parsed: %v", err)
	}
}

func TestWorkingSet(t *testing.T) {
	for _, tc := range []struct{ usage, inactive, want uint64 }{
		{100, 30, 70}, {100, 100, 0}, {100, 130, 0}, {0, 0, 0},
	} {
		if got := (memStat{inactiveFile: tc.inactive}).memory(tc.usage, 0).workingSet; got != tc.want {
			t.Errorf("usage %d inactive %d: working set %d, want %d", tc.usage, tc.inactive, got, tc.want)
		}
	}
}

func TestAvailable(t *testing.T) {
	for _, tc := range []struct {
		limit, ws uint64
		want      string
	}{
		{1000, 300, "700"}, {1000, 1300, "0"}, {0, 1, "nil"}, {9223372036854771712, 1, "nil"}, {^uint64(0), 1, "nil"}, {1 << 62, 1, "4611686018427387903"},
	} {
		got := "nil"
		if a := (&memory{limit: tc.limit, workingSet: tc.ws}).available(); a != nil {
			got = strconv.FormatUint(*a, 10)
		}
		if got != tc.want {
			t.Errorf("limit %d ws %d: %s, want %s", tc.limit, tc.ws, got, tc.want)
		}
	}
}

func TestParseMeminfo(t *testing.T) {
	mi, err := parseMeminfo(meminfoText)
	if err != nil || mi != (meminfo{total: 4000000000, free: 1024000000, available: 2048000000, anon: 819200000}) {
		t.Errorf("%+v, %v", mi, err)
	}
	if _, err := parseMeminfo("MemTotal: 10 kB\n"); err == nil {
		t.Error("no MemAvailable: no error")
	}
	if _, err := parseMeminfo("MemTotal: x kB\nMemAvailable: 1 kB\n"); err == nil || !strings.Contains(err.Error(), "MemTotal") {
		t.Errorf("bad value: %v", err)
	}
}

func TestParseProcStat(t *testing.T) {
	busy, boot, err := parseProcStat(procStatText)
	if err != nil || busy != 15e9 || !boot.Equal(time.Unix(1782800000, 0)) {
		t.Errorf("busy %d boot %v err %v", busy, boot, err)
	}
	// An old kernel's shorter cpu line (no guest fields).
	if busy, _, err := parseProcStat("cpu 1 2 3 4 5 6 7 8\nbtime 1\n"); err != nil || busy != (1+2+3+6+7+8)*1e7 {
		t.Errorf("short line: busy %d err %v", busy, err)
	}
	if _, _, err := parseProcStat("cpu0 1 2 3 4 5 6 7 8\n"); err == nil {
		t.Error("no cpu line: no error")
	}
}

func TestKeyedValue(t *testing.T) {
	if v, err := keyedValue("usage_usec 12\nuser_usec 3\n", "usage_usec"); err != nil || v != 12 {
		t.Errorf("%d %v", v, err)
	}
	if _, err := keyedValue("user_usec 3\n", "usage_usec"); err == nil {
		t.Error("missing key: no error")
	}
}

func FuzzParseMemStat(f *testing.F) {
	f.Add("total_rss 1\ntotal_inactive_file 2\n", false)
	f.Add("anon 1\ninactive_file 2\n", true)
	f.Fuzz(func(t *testing.T, data string, v2 bool) {
		st, err := parseMemStat(data, v2)
		if err == nil {
			if m := st.memory(st.anon+st.file, 0); m.workingSet > m.usage {
				t.Errorf("working set %d > usage %d", m.workingSet, m.usage)
			}
		}
	})
}

func FuzzParseMeminfo(f *testing.F) {
	f.Add(meminfoText)
	f.Fuzz(func(t *testing.T, data string) {
		mi, err := parseMeminfo(data)
		if err == nil {
			if m := mi.memory(); m.workingSet > mi.total || m.usage > mi.total {
				t.Errorf("%+v from %+v", m, mi)
			}
		}
	})
}

func FuzzParseProcStat(f *testing.F) {
	f.Add(procStatText)
	f.Fuzz(func(t *testing.T, data string) { parseProcStat(data) })
}

func FuzzKeyedValue(f *testing.F) {
	f.Add("usage_usec 12\n")
	f.Fuzz(func(t *testing.T, data string) { keyedValue(data, "usage_usec") })
}

// TestThisMachine reads this machine's cgroups and /proc, whichever
// version they are: the node's figures must be there and non-zero, as
// metrics-server drops a node without them.
func TestThisMachine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("cgroups are Linux's")
	}
	if _, err := os.Stat(DefaultCgroupRoot); err != nil {
		t.Skip(err)
	}
	r := New(Options{NodeName: "here"})
	var b bytes.Buffer
	if err := r.WriteResource(&b, nil); err != nil {
		t.Fatal(err)
	}
	text := b.String()
	for _, s := range []string{"\nnode_cpu_usage_seconds_total ", "\nnode_memory_working_set_bytes ", "\nscrape_error 0\n"} {
		if !strings.Contains(text, s) {
			t.Errorf("no %q in\n%s", s, text)
		}
	}
	s := summary(t, r, nil)
	if s.Node.CPU == nil || *s.Node.CPU.UsageCoreNanoSeconds == 0 || s.Node.Memory == nil || *s.Node.Memory.WorkingSetBytes == 0 {
		t.Errorf("node %s", jsonOf(s.Node))
	}
	t.Logf("layout %+v, node %s", r.layout(), jsonOf(s.Node))
}
