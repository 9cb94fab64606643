package stats

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The Reader must fit the server's Resources interface.
var _ interface {
	WriteResource(io.Writer, []*corev1.Pod) error
	Summary([]*corev1.Pod) (any, error)
} = (*Reader)(nil)

// now is the fake clock's time: 1782900000123 ms.
var now = time.Date(2026, 7, 1, 10, 0, 0, 123e6, time.UTC)

// cg is one cgroup of a fake tree, in layout-neutral terms.
type cg struct {
	cpu                         uint64 // ns
	usage, inactive, anon, file uint64
	limit                       string // "" for none written, "max" for unlimited, else bytes
}

// fixture is the node and pods of the fake trees. The root's usage is
// anon + file, as v2 computes it, so both layouts read the same figures.
var fixture = map[string]cg{
	"/": {cpu: 357354910000, usage: 2000000000, inactive: 383726592, anon: 900000000, file: 1100000000},
	// default/web: the pod has no limit; nginx has 256 MiB; sidecar is a
	// running restartable init container.
	"/outpost/poduid-web":    {cpu: 4678120000, usage: 20000000, inactive: 7372032, anon: 10000000, limit: "max"},
	"/outpost/poduid-web/c1": {cpu: 4710169000, usage: 15000000, inactive: 2466240, anon: 9000000, limit: "268435456"},
	"/outpost/poduid-web/c0": {cpu: 1000000, usage: 300000, anon: 200000, limit: "max"},
	// a terminated container's cgroup still there: not reported.
	"/outpost/poduid-web/c9": {cpu: 1, usage: 1},
	// default/api: another nginx, to sort by container then namespace/pod.
	"/outpost/poduid-api":    {cpu: 2000000000, usage: 5000000, inactive: 1000000, anon: 3000000, limit: "max"},
	"/outpost/poduid-api/c5": {cpu: 1500000000, usage: 4000000, inactive: 500000, anon: 2500000, limit: "max"},
	// kube-system/coredns: the pod's inactive_file exceeds its usage, so
	// its working set floors at 0.
	"/outpost/poduid-dns":    {cpu: 3000000000, usage: 9000000, inactive: 9500000, anon: 1000000, limit: "max"},
	"/outpost/poduid-dns/c3": {cpu: 2500000000, usage: 8000000, inactive: 1000000, anon: 6000000, limit: "max"},
	// default/done: its running container's cgroup is gone.
	"/outpost/poduid-done": {cpu: 100000000, usage: 1000000, anon: 1000000, limit: "max"},
	// default/gone has no cgroup at all.
}

const (
	meminfoText  = "MemTotal:        3906250 kB\nMemFree:         1000000 kB\nMemAvailable:    2000000 kB\nBuffers:           12345 kB\nAnonPages:        800000 kB\n"
	procStatText = "cpu  1000 0 500 8000 100 0 0 0 0 0\ncpu0 500 0 250 4000 50 0 0 0 0 0\nintr 1 2 3\nbtime 1782800000\nprocesses 1234\n"
)

// writeFiles writes files (path under root → content).
func writeFiles(t testing.TB, root string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// v1Files renders cgs as a v1 tree: cpuacct co-mounted with cpu, as
// Raspberry Pi OS before Bookworm mounts it, and memory. memory.stat
// holds the non-hierarchical keys too, with values that would show if
// they were read instead of the total_ ones.
func v1Files(cgs map[string]cg) map[string]string {
	files := map[string]string{"cpu,cpuacct/cgroup.procs": "1\n", "memory/cgroup.procs": "1\n"}
	for path, c := range cgs {
		cpu := filepath.Join("cpu,cpuacct", path)
		mem := filepath.Join("memory", path)
		files[filepath.Join(cpu, "cpuacct.usage")] = fmt.Sprintf("%d\n", c.cpu)
		files[filepath.Join(mem, "memory.usage_in_bytes")] = fmt.Sprintf("%d\n", c.usage)
		files[filepath.Join(mem, "memory.stat")] = fmt.Sprintf("cache 1\nrss 2\ninactive_file 3\npgfault 4\npgmajfault 5\n"+
			"hierarchical_memory_limit 9223372036854771712\ntotal_cache %d\ntotal_rss %d\ntotal_inactive_file %d\ntotal_pgfault 42\ntotal_pgmajfault 3\n",
			c.file, c.anon, c.inactive)
		switch c.limit {
		case "":
		case "max":
			files[filepath.Join(mem, "memory.limit_in_bytes")] = "9223372036854771712\n"
		default:
			files[filepath.Join(mem, "memory.limit_in_bytes")] = c.limit + "\n"
		}
	}
	return files
}

// v2Files renders cgs as a v2 tree. The root, as on a real one, has
// cpu.stat and memory.stat but no memory.current or memory.max.
func v2Files(cgs map[string]cg) map[string]string {
	files := map[string]string{"cgroup.controllers": "cpuset cpu io memory pids\n"}
	for path, c := range cgs {
		files[filepath.Join(path, "cpu.stat")] = fmt.Sprintf("usage_usec %d\nuser_usec 1\nsystem_usec 2\n", c.cpu/1000)
		files[filepath.Join(path, "memory.stat")] = fmt.Sprintf("anon %d\nfile %d\nkernel 7\nanon_thp 0\ninactive_anon 8\nactive_file 9\ninactive_file %d\npgfault 42\npgmajfault 3\n",
			c.anon, c.file, c.inactive)
		if path == "/" {
			continue
		}
		files[filepath.Join(path, "memory.current")] = fmt.Sprintf("%d\n", c.usage)
		if c.limit != "" {
			files[filepath.Join(path, "memory.max")] = c.limit + "\n"
		}
	}
	return files
}

// layouts are the fake trees every test runs on.
var layouts = []struct {
	name  string
	files func(map[string]cg) map[string]string
}{
	{"v1", v1Files},
	{"v2", v2Files},
}

// env is a fake node: cgroup and proc trees and a fake clock.
type env struct {
	cgroupRoot, procRoot string
	clock                *clocktest.Fake
	r                    *Reader
}

func newEnv(t testing.TB, files map[string]string) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{cgroupRoot: filepath.Join(dir, "cgroup"), procRoot: filepath.Join(dir, "proc"), clock: clocktest.New(now)}
	writeFiles(t, e.cgroupRoot, files)
	writeFiles(t, e.procRoot, map[string]string{"meminfo": meminfoText, "stat": procStatText})
	e.r = New(Options{CgroupRoot: e.cgroupRoot, ProcRoot: e.procRoot, NodeName: "pi-1", Clock: e.clock})
	return e
}

var started = metav1.NewTime(time.Date(2026, 7, 1, 9, 0, 0, 0, time.UTC))

func runningStatus(name, id string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, ContainerID: "containerd://" + id, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}}
}

func pod(ns, name, uid string, statuses ...corev1.ContainerStatus) *corev1.Pod {
	st := metav1.NewTime(started.Add(-time.Minute))
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, StartTime: &st, ContainerStatuses: statuses},
	}
}

// pods are the fixture's pods with their statuses, in no particular order.
func pods() []*corev1.Pod {
	web := pod("default", "web", "uid-web",
		runningStatus("nginx", "c1"),
		corev1.ContainerStatus{Name: "job", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}},
		corev1.ContainerStatus{Name: "old", ContainerID: "containerd://c9", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}},
	)
	web.Status.InitContainerStatuses = []corev1.ContainerStatus{runningStatus("sidecar", "c0")}
	return []*corev1.Pod{
		pod("kube-system", "coredns-558bd4d5db-4dpjz", "uid-dns", runningStatus("coredns", "c3")),
		web,
		pod("default", "gone", "uid-gone", runningStatus("main", "c6")),
		pod("default", "done", "uid-done", runningStatus("main", "c7")),
		pod("default", "api", "uid-api", runningStatus("nginx", "c5")),
	}
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (run with -update to accept):\n%s", path, lineDiff(string(want), got))
	}
}

// lineDiff lists the lines that differ, good enough for short outputs.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n  want %q\n  got  %q\n", i+1, wl, gl)
		}
	}
	return b.String()
}
