package stats

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// nodeKey is the node's key among the previous CPU samples.
const nodeKey = "/"

// summarize turns s into a Summary. prev holds the CPU samples of the
// last call, by cgroup; summarize puts this call's into next, so that
// cgroups not seen now are forgotten.
func summarize(s snapshot, nodeName string, boot time.Time, prev, next map[string]cpuSample) statsv1alpha1.Summary {
	at := metav1.NewTime(s.at)
	cpu := func(key string, ns uint64) *statsv1alpha1.CPUStats {
		return &statsv1alpha1.CPUStats{Time: at, UsageCoreNanoSeconds: &ns, UsageNanoCores: nanoCores(key, cpuSample{at: s.at, ns: ns}, prev, next)}
	}
	mem := func(m *memory) *statsv1alpha1.MemoryStats {
		if m == nil {
			return nil
		}
		return &statsv1alpha1.MemoryStats{
			Time: at, AvailableBytes: m.available(), UsageBytes: &m.usage, WorkingSetBytes: &m.workingSet,
			RSSBytes: &m.rss, PageFaults: &m.pgfault, MajorPageFaults: &m.pgmajfault,
		}
	}

	sum := statsv1alpha1.Summary{
		Node: statsv1alpha1.NodeStats{NodeName: nodeName, StartTime: metav1.NewTime(boot)}, // zero boot: no startTime
		Pods: make([]statsv1alpha1.PodStats, 0, len(s.pods)),
	}
	if s.node != nil {
		sum.Node.CPU = cpu(nodeKey, s.node.cpu)
		sum.Node.Memory = mem(s.node.mem)
	}
	for i := range s.pods {
		p := &s.pods[i]
		ps := statsv1alpha1.PodStats{
			PodRef:     statsv1alpha1.PodReference{Name: p.pod.Name, Namespace: p.pod.Namespace, UID: string(p.pod.UID)},
			Containers: make([]statsv1alpha1.ContainerStats, 0, len(p.containers)),
			CPU:        cpu(p.cgroup, p.cpu),
			Memory:     mem(p.mem),
		}
		if p.pod.Status.StartTime != nil {
			ps.StartTime = *p.pod.Status.StartTime
		}
		for j := range p.containers {
			c := &p.containers[j]
			ps.Containers = append(ps.Containers, statsv1alpha1.ContainerStats{
				Name:      c.name,
				StartTime: metav1.NewTime(c.started),
				CPU:       cpu(c.cgroup, c.cpu),
				Memory:    mem(c.mem),
			})
		}
		sum.Pods = append(sum.Pods, ps)
	}
	return sum
}

// nanoCores records cur as key's sample in next and returns the CPU
// usage since key's sample in prev, in nanocores; nil without one, or when
// the counter went back (the cgroup was made again). A sample no newer
// than the previous one keeps the previous one, to measure from later.
func nanoCores(key string, cur cpuSample, prev, next map[string]cpuSample) *uint64 {
	p, ok := prev[key]
	if ok && !cur.at.After(p.at) {
		next[key] = p
		return nil
	}
	next[key] = cur
	if !ok || cur.ns < p.ns {
		return nil
	}
	// As kubelet computes it, in floating point: the product of the
	// nanoseconds used and a billion overflows uint64 past ~18 s of CPU.
	n := uint64(float64(cur.ns-p.ns) / float64(cur.at.Sub(p.at).Nanoseconds()) * 1e9)
	return &n
}
