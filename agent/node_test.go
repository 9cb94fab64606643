package agent

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/outpost-edge/outpost/internal/clock/clocktest"
)

const gib = 1 << 30

// nodeFixture copies testdata/node/NAME to a temporary root and writes
// the given files over it (a nil content removes the file).
func nodeFixture(t *testing.T, name string, files map[string][]byte) string {
	t.Helper()
	src := filepath.Join("testdata", "node", name)
	dst := t.TempDir()
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	for rel, b := range files {
		p := filepath.Join(dst, rel)
		if b == nil {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// fakeStatfs answers for one directory only.
func fakeStatfs(dir string, fs FSStats) func(string) (FSStats, error) {
	return func(p string) (FSStats, error) {
		if p != dir {
			return FSStats{}, errors.New("statfs of unexpected path " + p)
		}
		return fs, nil
	}
}

func condition(st corev1.NodeStatus, typ corev1.NodeConditionType) corev1.NodeCondition {
	for _, c := range st.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return corev1.NodeCondition{}
}

func quantity(t *testing.T, l corev1.ResourceList, name corev1.ResourceName) int64 {
	t.Helper()
	q, ok := l[name]
	if !ok {
		t.Fatalf("no %s in %v", name, l)
	}
	return q.Value()
}

// Each fixture's capacity, allocatable, nodeInfo, addresses and
// conditions, as a node of that kind reports them.
func TestNodeStatusFromFixtures(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	type want struct {
		cpu, memory, storage            int64
		allocMemory, allocStorage, pods int64
		info                            corev1.NodeSystemInfo
		conditions                      map[corev1.NodeConditionType]string // status/reason
		pidMessage                      string
	}
	for _, tc := range []struct {
		fixture string
		fs      FSStats
		want    want
	}{
		{
			fixture: "pi4",
			fs:      FSStats{Capacity: 29 * gib, Available: 20 * gib},
			want: want{
				cpu: 4, memory: 3884108 << 10, storage: 29 * gib, pods: 110,
				allocMemory: 3884108<<10 - 100<<20, allocStorage: 29*gib - 29*gib/10,
				info: corev1.NodeSystemInfo{
					MachineID: "8f1c2a7e4b5d4e6f9a0b1c2d3e4f5a6b", BootID: "5d3f0c8a-2b1e-4c7d-9a6f-1e2d3c4b5a69",
					KernelVersion: "6.6.51+rpt-rpi-v8", OSImage: "Debian GNU/Linux 12 (bookworm)",
					ContainerRuntimeVersion: "containerd://2.1.4", OperatingSystem: "linux", Architecture: runtime.GOARCH,
				},
				conditions: map[corev1.NodeConditionType]string{
					corev1.NodeReady:          "True/KubeletReady",
					corev1.NodeMemoryPressure: "False/KubeletHasSufficientMemory",
					corev1.NodeDiskPressure:   "False/KubeletHasNoDiskPressure",
					corev1.NodePIDPressure:    "False/KubeletHasSufficientPID",
				},
				pidMessage: "kernel.threads-max, 30297",
			},
		},
		{
			fixture: "amd64vm",
			fs:      FSStats{Capacity: 100 * gib, Available: 9 * gib},
			want: want{
				cpu: 3, memory: 8148344 << 10, storage: 100 * gib, pods: 110,
				allocMemory: 8148344<<10 - 100<<20, allocStorage: 90 * gib,
				info: corev1.NodeSystemInfo{
					MachineID: "2a9e6c1f0d7b4c3e8f5a6b7c8d9e0f1a", SystemUUID: "4c4c4544-0042-3510-8052-b4c04f4e3332",
					BootID: "0b6f8e1c-77a2-4f0e-8c1d-2e3f4a5b6c7d", KernelVersion: "6.8.0-49-generic", OSImage: "Ubuntu 24.04.1 LTS",
					ContainerRuntimeVersion: "containerd://2.1.4", OperatingSystem: "linux", Architecture: runtime.GOARCH,
				},
				conditions: map[corev1.NodeConditionType]string{
					corev1.NodeReady:          "True/KubeletReady",
					corev1.NodeMemoryPressure: "True/KubeletHasInsufficientMemory",
					corev1.NodeDiskPressure:   "True/KubeletHasDiskPressure",
					corev1.NodePIDPressure:    "True/KubeletHasInsufficientPID",
				},
				pidMessage: "kernel.pid_max (4096)",
			},
		},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			cfg := NodeConfig{
				Root: filepath.Join("testdata", "node", tc.fixture), Hostname: "edge-1", HostIP: "192.168.1.20",
				StorageDir: "/var/lib/containerd", RuntimeVersion: "containerd://2.1.4",
			}
			st := NodeStatus(cfg, NodeDeps{
				Clock: clk, Heartbeat: clk.Now, RuntimeHealth: func() error { return nil },
				Statfs: fakeStatfs("/var/lib/containerd", tc.fs),
			})
			w := tc.want
			for _, q := range []struct {
				name      string
				got, want int64
			}{
				{"capacity cpu", quantity(t, st.Capacity, corev1.ResourceCPU), w.cpu},
				{"capacity memory", quantity(t, st.Capacity, corev1.ResourceMemory), w.memory},
				{"capacity pods", quantity(t, st.Capacity, corev1.ResourcePods), w.pods},
				{"capacity ephemeral-storage", quantity(t, st.Capacity, corev1.ResourceEphemeralStorage), w.storage},
				{"allocatable cpu", quantity(t, st.Allocatable, corev1.ResourceCPU), w.cpu},
				{"allocatable memory", quantity(t, st.Allocatable, corev1.ResourceMemory), w.allocMemory},
				{"allocatable pods", quantity(t, st.Allocatable, corev1.ResourcePods), w.pods},
				{"allocatable ephemeral-storage", quantity(t, st.Allocatable, corev1.ResourceEphemeralStorage), w.allocStorage},
			} {
				if q.got != q.want {
					t.Errorf("%s = %d, want %d", q.name, q.got, q.want)
				}
			}
			if st.NodeInfo != w.info {
				t.Errorf("nodeInfo\n got %+v\nwant %+v", st.NodeInfo, w.info)
			}
			if len(st.Conditions) != len(w.conditions) {
				t.Errorf("%d conditions, want %d: %+v", len(st.Conditions), len(w.conditions), st.Conditions)
			}
			for typ, want := range w.conditions {
				c := condition(st, typ)
				if got := string(c.Status) + "/" + c.Reason; got != want {
					t.Errorf("%s = %s (%s), want %s", typ, got, c.Message, want)
				}
				if c.Message == "" {
					t.Errorf("%s has no message", typ)
				}
				if !c.LastHeartbeatTime.IsZero() || !c.LastTransitionTime.IsZero() {
					t.Errorf("%s has times set; the API sync fills them", typ)
				}
			}
			if m := condition(st, corev1.NodePIDPressure).Message; !strings.Contains(m, w.pidMessage) {
				t.Errorf("PIDPressure message %q does not name the limit %q", m, w.pidMessage)
			}
			wantAddrs := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.1.20"}, {Type: corev1.NodeHostName, Address: "edge-1"}}
			if len(st.Addresses) != 2 || st.Addresses[0] != wantAddrs[0] || st.Addresses[1] != wantAddrs[1] {
				t.Errorf("addresses %+v, want %+v", st.Addresses, wantAddrs)
			}
			if p := st.DaemonEndpoints.KubeletEndpoint.Port; p != 10250 {
				t.Errorf("kubelet endpoint port %d, want 10250", p)
			}
		})
	}
}

// Each condition on both sides of its threshold, and Unknown when what
// it is computed from cannot be read.
func TestNodeConditions(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	started := clk.Now()
	clk.Advance(10 * time.Minute)
	meminfo := func(availKB int) []byte {
		return []byte("MemTotal:        3884108 kB\nMemFree:          100000 kB\nMemAvailable:   " + strconv.Itoa(availKB) + " kB\n")
	}
	loadavg := func(tasks int) []byte { return []byte("0.10 0.20 0.30 2/" + strconv.Itoa(tasks) + " 4242\n") }
	healthy := func() error { return nil }
	fresh := func() time.Time { return clk.Now().Add(-2 * time.Second) }
	roomy := FSStats{Capacity: 1000 * gib, Available: 500 * gib}

	for _, tc := range []struct {
		name      string
		files     map[string][]byte
		fs        FSStats
		fsErr     error
		heartbeat func() time.Time
		health    func() error
		noChecks  bool // no Heartbeat nor RuntimeHealth
		typ       corev1.NodeConditionType
		want      string // status/reason
		message   string // a part of the message
	}{
		{name: "ready", typ: corev1.NodeReady, want: "True/KubeletReady", message: "outpost is posting ready status"},
		{name: "ready without health checks", typ: corev1.NodeReady, noChecks: true, want: "True/KubeletReady"},
		{name: "heartbeat 59s old", typ: corev1.NodeReady, heartbeat: func() time.Time { return clk.Now().Add(-59 * time.Second) }, want: "True/KubeletReady"},
		{name: "heartbeat stale", typ: corev1.NodeReady, heartbeat: func() time.Time { return clk.Now().Add(-61 * time.Second) },
			want: "False/KubeletNotReady", message: "main loop has not turned for more than 1m0s"},
		{name: "agent never beat", typ: corev1.NodeReady, heartbeat: func() time.Time { return started.Add(-time.Hour) }, want: "False/KubeletNotReady"},
		{name: "runtime down", typ: corev1.NodeReady, health: func() error { return errors.New("containerd /run/containerd/containerd.sock: connection refused") },
			want: "False/KubeletNotReady", message: "container runtime is down: containerd /run/containerd/containerd.sock: connection refused"},

		{name: "memory at threshold", typ: corev1.NodeMemoryPressure, files: map[string][]byte{"proc/meminfo": meminfo(102400)},
			want: "False/KubeletHasSufficientMemory"},
		{name: "memory below threshold", typ: corev1.NodeMemoryPressure, files: map[string][]byte{"proc/meminfo": meminfo(102399)},
			want: "True/KubeletHasInsufficientMemory", message: "MemAvailable is below 100Mi"},
		{name: "meminfo missing", typ: corev1.NodeMemoryPressure, files: map[string][]byte{"proc/meminfo": nil},
			want: "Unknown/NodeStatsUnknown", message: "meminfo"},
		{name: "meminfo without MemAvailable", typ: corev1.NodeMemoryPressure, files: map[string][]byte{"proc/meminfo": []byte("MemTotal: 1000 kB\n")},
			want: "Unknown/NodeStatsUnknown", message: "no MemTotal or MemAvailable"},

		{name: "disk at 10%", typ: corev1.NodeDiskPressure, fs: FSStats{Capacity: 1000, Available: 100}, want: "False/KubeletHasNoDiskPressure"},
		{name: "disk below 10%", typ: corev1.NodeDiskPressure, fs: FSStats{Capacity: 1000, Available: 99},
			want: "True/KubeletHasDiskPressure", message: "less than 10% of the file system holding /var/lib/outpost"},
		{name: "statfs fails", typ: corev1.NodeDiskPressure, fsErr: errors.New("statfs /var/lib/outpost: no such file or directory"),
			want: "Unknown/NodeStatsUnknown", message: "no such file"},

		// pi4: threads-max 30297 is the limit; 90% of it is 27267.3.
		{name: "tasks at 90% of threads-max", typ: corev1.NodePIDPressure, files: map[string][]byte{"proc/loadavg": loadavg(27267)},
			want: "False/KubeletHasSufficientPID", message: "kernel.threads-max"},
		{name: "tasks over 90% of threads-max", typ: corev1.NodePIDPressure, files: map[string][]byte{"proc/loadavg": loadavg(27268)},
			want: "True/KubeletHasInsufficientPID", message: "more than 90% of kernel.threads-max (30297) in use"},
		{name: "pid_max lower than threads-max", typ: corev1.NodePIDPressure,
			files: map[string][]byte{"proc/sys/kernel/pid_max": []byte("1000\n"), "proc/loadavg": loadavg(901)},
			want:  "True/KubeletHasInsufficientPID", message: "kernel.pid_max (1000)"},
		{name: "only threads-max readable", typ: corev1.NodePIDPressure, files: map[string][]byte{"proc/sys/kernel/pid_max": nil},
			want: "False/KubeletHasSufficientPID", message: "kernel.threads-max"},
		{name: "loadavg missing", typ: corev1.NodePIDPressure, files: map[string][]byte{"proc/loadavg": nil},
			want: "Unknown/NodeStatsUnknown", message: "loadavg"},
		{name: "no task limit", typ: corev1.NodePIDPressure,
			files: map[string][]byte{"proc/sys/kernel/pid_max": nil, "proc/sys/kernel/threads-max": []byte("lots\n")},
			want:  "Unknown/NodeStatsUnknown", message: "not a positive number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := tc.fs
			if fs == (FSStats{}) {
				fs = roomy
			}
			hb, health := fresh, healthy
			if tc.heartbeat != nil {
				hb = tc.heartbeat
			}
			if tc.health != nil {
				health = tc.health
			}
			if tc.noChecks {
				hb, health = nil, nil
			}
			deps := NodeDeps{Clock: clk, Heartbeat: hb, RuntimeHealth: health, Statfs: func(string) (FSStats, error) { return fs, tc.fsErr }}
			st := NodeStatus(NodeConfig{Root: nodeFixture(t, "pi4", tc.files), StorageDir: "/var/lib/outpost"}, deps)
			c := condition(st, tc.typ)
			if got := string(c.Status) + "/" + c.Reason; got != tc.want {
				t.Errorf("%s = %s (%q), want %s", tc.typ, got, c.Message, tc.want)
			}
			if !strings.Contains(c.Message, tc.message) {
				t.Errorf("%s message %q does not contain %q", tc.typ, c.Message, tc.message)
			}
			if len(st.Conditions) != 4 {
				t.Errorf("%d conditions, want 4", len(st.Conditions))
			}
		})
	}
}

// What cannot be read is left out of capacity rather than reported as 0.
func TestNodeCapacityLeavesOutWhatCannotBeRead(t *testing.T) {
	root := nodeFixture(t, "pi4", map[string][]byte{"proc/meminfo": nil, "sys/devices/system/cpu/online": []byte("0-x\n")})
	st := NodeStatus(NodeConfig{Root: root}, NodeDeps{Statfs: func(p string) (FSStats, error) { return FSStats{}, errors.New("statfs " + p + ": permission denied") }})
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage} {
		if q, ok := st.Capacity[name]; ok {
			t.Errorf("capacity has %s = %s, want it left out", name, q.String())
		}
		if q, ok := st.Allocatable[name]; ok {
			t.Errorf("allocatable has %s = %s, want it left out", name, q.String())
		}
	}
	if got := quantity(t, st.Capacity, corev1.ResourcePods); got != DefaultMaxPods {
		t.Errorf("pods = %d, want %d", got, DefaultMaxPods)
	}
	if c := condition(st, corev1.NodeDiskPressure); c.Status != corev1.ConditionUnknown || !strings.Contains(c.Message, "statfs /:") {
		t.Errorf("DiskPressure = %s %q, want Unknown naming the default storage dir /", c.Status, c.Message)
	}
}

// Configured values: max pods, the kubelet port, a bare runtime version,
// no host IP; and the real statfs(2) of the storage directory.
func TestNodeStatusConfig(t *testing.T) {
	dir := t.TempDir()
	st := NodeStatus(NodeConfig{
		Root: filepath.Join("testdata", "node", "pi4"), StorageDir: dir, MaxPods: 16, KubeletPort: 10350,
		RuntimeVersion: "2.0.5", Hostname: "edge-2",
	}, NodeDeps{})
	if got := quantity(t, st.Capacity, corev1.ResourcePods); got != 16 {
		t.Errorf("pods = %d, want 16", got)
	}
	if p := st.DaemonEndpoints.KubeletEndpoint.Port; p != 10350 {
		t.Errorf("kubelet port %d, want 10350", p)
	}
	if v := st.NodeInfo.ContainerRuntimeVersion; v != "containerd://2.0.5" {
		t.Errorf("containerRuntimeVersion %q, want containerd://2.0.5", v)
	}
	if len(st.Addresses) != 1 || st.Addresses[0].Type != corev1.NodeHostName {
		t.Errorf("addresses %+v, want only the Hostname", st.Addresses)
	}
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(dir, &sfs); err != nil {
		t.Fatal(err)
	}
	want := resource.NewQuantity(int64(sfs.Blocks*uint64(sfs.Bsize)), resource.BinarySI)
	if got := st.Capacity[corev1.ResourceEphemeralStorage]; got.Cmp(*want) != 0 {
		t.Errorf("ephemeral-storage %s, want %s (statfs of %s)", got.String(), want.String(), dir)
	}
}

func TestNodeOnlineCPUs(t *testing.T) {
	for _, tc := range []struct {
		online string
		want   int
		bad    bool
	}{
		{online: "0\n", want: 1},
		{online: "0-3\n", want: 4},
		{online: "0-1,3\n", want: 3},
		{online: "0,2-3,5-7\n", want: 6},
		{online: "3-1\n", bad: true},
		{online: "\n", bad: true},
		{online: "0-\n", bad: true},
	} {
		root := nodeFixture(t, "pi4", map[string][]byte{"sys/devices/system/cpu/online": []byte(tc.online)})
		n, err := nodeFiles(root).onlineCPUs()
		if tc.bad {
			if err == nil {
				t.Errorf("online %q: %d CPUs, want an error", tc.online, n)
			}
			continue
		}
		if err != nil || n != tc.want {
			t.Errorf("online %q: %d, %v; want %d", tc.online, n, err, tc.want)
		}
	}
}
