package stats

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

func summary(t *testing.T, r *Reader, pods []*corev1.Pod) statsv1alpha1.Summary {
	t.Helper()
	v, err := r.Summary(pods)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := v.(statsv1alpha1.Summary)
	if !ok {
		t.Fatalf("Summary returned %T, want statsv1alpha1.Summary", v)
	}
	return s
}

// TestSummaryGolden checks the JSON document of a first call (no
// UsageNanoCores yet) for both layouts, which give the same one.
func TestSummaryGolden(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			e := newEnv(t, l.files(fixture))
			b, err := json.MarshalIndent(summary(t, e.r, pods()), "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			golden(t, "summary.json", string(b)+"\n")
		})
	}
}

func findPod(s statsv1alpha1.Summary, name string) *statsv1alpha1.PodStats {
	for i := range s.Pods {
		if s.Pods[i].PodRef.Name == name {
			return &s.Pods[i]
		}
	}
	return nil
}

func findContainer(p *statsv1alpha1.PodStats, name string) *statsv1alpha1.ContainerStats {
	if p == nil {
		return nil
	}
	for i := range p.Containers {
		if p.Containers[i].Name == name {
			return &p.Containers[i]
		}
	}
	return nil
}

func nanoCoresOf(c *statsv1alpha1.CPUStats) string {
	if c == nil || c.UsageNanoCores == nil {
		return "nil"
	}
	return fmt.Sprint(*c.UsageNanoCores)
}

// setCPU sets a cgroup's CPU counter in a fake tree.
func setCPU(t *testing.T, e *env, v2 bool, cgroup string, ns uint64) {
	t.Helper()
	if v2 {
		writeFiles(t, e.cgroupRoot, map[string]string{filepath.Join(cgroup, "cpu.stat"): fmt.Sprintf("usage_usec %d\n", ns/1000)})
		return
	}
	writeFiles(t, e.cgroupRoot, map[string]string{filepath.Join("cpu,cpuacct", cgroup, "cpuacct.usage"): fmt.Sprintf("%d\n", ns)})
}

// TestSummaryNanoCores checks UsageNanoCores over successive calls: none
// on the first, the rate since the previous call after, none when the
// counter went back or no time passed, and that cgroups no longer seen
// are forgotten.
func TestSummaryNanoCores(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			v2 := l.name == "v2"
			e := newEnv(t, l.files(fixture))
			ps := pods()
			s := summary(t, e.r, ps)
			if got := nanoCoresOf(findContainer(findPod(s, "web"), "nginx").CPU); got != "nil" {
				t.Errorf("first call: nginx nanocores %s, want nil", got)
			}

			// 10 s later nginx used 5 s more (half a core), the node 20 s
			// more (two cores); coredns' counter went back (made again).
			e.clock.Advance(10 * time.Second)
			setCPU(t, e, v2, "/outpost/poduid-web/c1", fixture["/outpost/poduid-web/c1"].cpu+5e9)
			setCPU(t, e, v2, "/", fixture["/"].cpu+20e9)
			setCPU(t, e, v2, "/outpost/poduid-dns/c3", 1000)
			s = summary(t, e.r, ps)
			web := findPod(s, "web")
			for _, c := range []struct {
				what string
				cpu  *statsv1alpha1.CPUStats
				want string
			}{
				{"nginx", findContainer(web, "nginx").CPU, "500000000"},
				{"sidecar", findContainer(web, "sidecar").CPU, "0"},
				{"pod web", web.CPU, "0"},
				{"node", s.Node.CPU, "2000000000"},
				{"coredns", findContainer(findPod(s, "coredns-558bd4d5db-4dpjz"), "coredns").CPU, "nil"},
			} {
				if got := nanoCoresOf(c.cpu); got != c.want {
					t.Errorf("%s nanocores %s, want %s", c.what, got, c.want)
				}
			}

			// No time passed: no rate, and the previous sample is kept.
			s = summary(t, e.r, ps)
			if got := nanoCoresOf(s.Node.CPU); got != "nil" {
				t.Errorf("same time: node nanocores %s, want nil", got)
			}
			e.clock.Advance(10 * time.Second)
			setCPU(t, e, v2, "/", fixture["/"].cpu+30e9)
			if got := nanoCoresOf(summary(t, e.r, ps).Node.CPU); got != "1000000000" {
				t.Errorf("node nanocores %s, want 1000000000", got)
			}

			// web's nginx exits and its cgroup goes: it is forgotten.
			dirs := []string{"outpost/poduid-web/c1"}
			if !v2 {
				dirs = []string{"cpu,cpuacct/outpost/poduid-web/c1", "memory/outpost/poduid-web/c1"}
			}
			for _, d := range dirs {
				if err := os.RemoveAll(filepath.Join(e.cgroupRoot, d)); err != nil {
					t.Fatal(err)
				}
			}
			e.clock.Advance(10 * time.Second)
			s = summary(t, e.r, ps)
			if findContainer(findPod(s, "web"), "nginx") != nil {
				t.Error("nginx reported without its cgroup")
			}
			e.r.mu.Lock()
			_, remembered := e.r.prev["/outpost/poduid-web/c1"]
			n := len(e.r.prev)
			e.r.mu.Unlock()
			if remembered {
				t.Error("the previous sample of a gone cgroup is kept")
			}
			// node, 4 pods, sidecar, api's nginx, coredns
			if n != 8 {
				t.Errorf("%d cgroups remembered, want 8", n)
			}
		})
	}
}

// TestSummaryNode checks the node's figures, and its memory when the
// memory controller is off (v1 without a memory mount, v2 with no root
// memory.stat) and its CPU without a root counter, from /proc.
func TestSummaryNode(t *testing.T) {
	const (
		procBusy = (1000 + 500) * 1e7 // user + system ticks of procStatText, in ns
		memTotal = 4000000000
	)
	v1NoMem := v1Files(fixture)
	for p := range v1NoMem {
		if strings.HasPrefix(p, "memory/") {
			delete(v1NoMem, p)
		}
	}
	v1NoCPU := v1Files(fixture)
	delete(v1NoCPU, "cpu,cpuacct/cpuacct.usage")
	v2Bare := v2Files(fixture)
	delete(v2Bare, "/cpu.stat")
	delete(v2Bare, "/memory.stat")
	for _, tc := range []struct {
		name                  string
		files                 map[string]string
		cpu, usage, ws, rss   uint64
		available             uint64
		containerMemoryReport bool
	}{
		{"v1", v1Files(fixture), 357354910000, 2000000000, 1616273408, 900000000, memTotal - 1616273408, true},
		{"v2", v2Files(fixture), 357354910000, 2000000000, 1616273408, 900000000, memTotal - 1616273408, true},
		// meminfo: usage MemTotal − MemFree, working set MemTotal − MemAvailable.
		{"v1 memory off", v1NoMem, 357354910000, memTotal - 1024000000, memTotal - 2048000000, 819200000, 2048000000, false},
		{"v1 no root cpuacct.usage", v1NoCPU, procBusy, 2000000000, 1616273408, 900000000, memTotal - 1616273408, true},
		{"v2 bare root", v2Bare, procBusy, memTotal - 1024000000, memTotal - 2048000000, 819200000, 2048000000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.files)
			s := summary(t, e.r, pods())
			n := s.Node
			if n.NodeName != "pi-1" || !n.StartTime.Time.Equal(time.Unix(1782800000, 0)) {
				t.Errorf("node %q started %v", n.NodeName, n.StartTime)
			}
			if n.CPU == nil || *n.CPU.UsageCoreNanoSeconds != tc.cpu || !n.CPU.Time.Time.Equal(now) {
				t.Errorf("node CPU %+v, want %d at %v", n.CPU, tc.cpu, now)
			}
			m := n.Memory
			if m == nil || *m.UsageBytes != tc.usage || *m.WorkingSetBytes != tc.ws || *m.RSSBytes != tc.rss || m.AvailableBytes == nil || *m.AvailableBytes != tc.available {
				t.Fatalf("node memory %s, want usage %d working set %d rss %d available %d", jsonOf(m), tc.usage, tc.ws, tc.rss, tc.available)
			}
			nginx := findContainer(findPod(s, "web"), "nginx")
			if nginx == nil || (nginx.Memory != nil) != tc.containerMemoryReport {
				t.Errorf("nginx %s, want memory reported: %v", jsonOf(nginx), tc.containerMemoryReport)
			}
		})
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestSummaryUnsafeIDs checks that a UID or container ID that could
// leave the pod cgroups is not followed.
func TestSummaryUnsafeIDs(t *testing.T) {
	e := newEnv(t, v2Files(fixture))
	// ../poduid-web/c1 from any pod's cgroup would read web's nginx.
	evil := pod("default", "evil", "uid-api", runningStatus("x", "../poduid-web/c1"))
	dots := pod("default", "dots", "..", runningStatus("y", "c1"))
	s := summary(t, e.r, []*corev1.Pod{evil, dots})
	if len(s.Pods) != 1 || s.Pods[0].PodRef.Name != "evil" || len(s.Pods[0].Containers) != 0 {
		t.Errorf("pods %s", jsonOf(s.Pods))
	}
}

// TestConcurrentCalls is for -race: the server may serve both endpoints
// at once.
func TestConcurrentCalls(t *testing.T) {
	e := newEnv(t, v2Files(fixture))
	done := make(chan struct{})
	for range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 20 {
				if _, err := e.r.Summary(pods()); err != nil {
					t.Error(err)
				}
				if err := e.r.WriteResource(io.Discard, pods()); err != nil {
					t.Error(err)
				}
				e.clock.Advance(time.Second)
			}
		}()
	}
	<-done
	<-done
}
