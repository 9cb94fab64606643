package stats

import (
	"cmp"
	"io"
	"slices"
	"strings"

	"github.com/outpost-edge/outpost/internal/promtext"
)

// The families of /metrics/resource, with kubelet's help texts: its
// metrics framework prefixes the stability level. scrape_error has been
// deprecated since 1.29 in favour of resource_scrape_error, and kubelets
// from 1.30 hide it; we write both, as metrics-server reads neither.
const (
	containerCPU       = "container_cpu_usage_seconds_total"
	containerMemory    = "container_memory_working_set_bytes"
	containerStartTime = "container_start_time_seconds"
	nodeCPU            = "node_cpu_usage_seconds_total"
	nodeMemory         = "node_memory_working_set_bytes"
	podCPU             = "pod_cpu_usage_seconds_total"
	podMemory          = "pod_memory_working_set_bytes"
	resourceScrapeErr  = "resource_scrape_error"
	scrapeErr          = "scrape_error"

	containerCPUHelp       = "[STABLE] Cumulative cpu time consumed by the container in core-seconds"
	containerMemoryHelp    = "[STABLE] Current working set of the container in bytes"
	containerStartTimeHelp = "[STABLE] Start time of the container since unix epoch in seconds"
	nodeCPUHelp            = "[STABLE] Cumulative cpu time consumed by the node in core-seconds"
	nodeMemoryHelp         = "[STABLE] Current working set of the node in bytes"
	podCPUHelp             = "[STABLE] Cumulative cpu time consumed by the pod in core-seconds"
	podMemoryHelp          = "[STABLE] Current working set of the pod in bytes"
	resourceScrapeErrHelp  = "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise"
	scrapeErrHelp          = "[ALPHA] (Deprecated since 1.29.0) 1 if there was an error while getting container metrics, 0 otherwise"
)

// containerRow is one container with its pod's names, for the container
// families.
type containerRow struct {
	namespace, pod string
	c              *containerUsage
}

// writeResource writes s as kubelet's registry does: families sorted by
// name, each left out when it has no sample, labels sorted by name, and
// samples sorted by their label values in that order. Usage samples carry
// the read's time in milliseconds; container_start_time_seconds and the
// scrape errors carry none.
func writeResource(w io.Writer, s snapshot) error {
	var rows []containerRow
	for i := range s.pods {
		p := &s.pods[i]
		for j := range p.containers {
			rows = append(rows, containerRow{namespace: p.pod.Namespace, pod: p.pod.Name, c: &p.containers[j]})
		}
	}
	slices.SortFunc(rows, func(a, b containerRow) int {
		return cmp.Or(strings.Compare(a.c.name, b.c.name), strings.Compare(a.namespace, b.namespace), strings.Compare(a.pod, b.pod))
	})
	ms := s.at.UnixMilli()
	p := promtext.New(w)

	container := func(r containerRow) []string {
		return []string{"container", r.c.name, "namespace", r.namespace, "pod", r.pod}
	}
	family(p, containerCPU, containerCPUHelp, promtext.Counter, rows, all, func(r containerRow) {
		p.SampleAt(containerCPU, seconds(r.c.cpu), ms, container(r)...)
	})
	family(p, containerMemory, containerMemoryHelp, promtext.Gauge, rows, func(r containerRow) bool { return r.c.mem != nil }, func(r containerRow) {
		p.SampleAt(containerMemory, float64(r.c.mem.workingSet), ms, container(r)...)
	})
	// kubelet leaves out unknown start times, and stamps none.
	family(p, containerStartTime, containerStartTimeHelp, promtext.Gauge, rows, func(r containerRow) bool { return r.c.started.Unix() > 0 }, func(r containerRow) {
		p.Sample(containerStartTime, float64(r.c.started.UnixNano())/1e9, container(r)...)
	})

	var node []*usage
	if s.node != nil {
		node = append(node, s.node)
	}
	family(p, nodeCPU, nodeCPUHelp, promtext.Counter, node, all, func(u *usage) {
		p.SampleAt(nodeCPU, seconds(u.cpu), ms)
	})
	family(p, nodeMemory, nodeMemoryHelp, promtext.Gauge, node, func(u *usage) bool { return u.mem != nil }, func(u *usage) {
		p.SampleAt(nodeMemory, float64(u.mem.workingSet), ms)
	})

	// s.pods is sorted by namespace and name, the order of their labels.
	family(p, podCPU, podCPUHelp, promtext.Counter, s.pods, all, func(u podUsage) {
		p.SampleAt(podCPU, seconds(u.cpu), ms, "namespace", u.pod.Namespace, "pod", u.pod.Name)
	})
	family(p, podMemory, podMemoryHelp, promtext.Gauge, s.pods, func(u podUsage) bool { return u.mem != nil }, func(u podUsage) {
		p.SampleAt(podMemory, float64(u.mem.workingSet), ms, "namespace", u.pod.Namespace, "pod", u.pod.Name)
	})

	failed := 0.0
	if s.nodeErr != nil || s.failed {
		failed = 1
	}
	p.Family(resourceScrapeErr, resourceScrapeErrHelp, promtext.Gauge)
	p.Sample(resourceScrapeErr, failed)
	p.Family(scrapeErr, scrapeErrHelp, promtext.Gauge)
	p.Sample(scrapeErr, failed)
	return p.Flush()
}

// family writes the family's header and a sample of each item that keep
// keeps; nothing when it keeps none, as kubelet's registry drops empty
// families.
func family[T any](p *promtext.Writer, name, help string, t promtext.Type, items []T, keep func(T) bool, write func(T)) {
	started := false
	for _, it := range items {
		if !keep(it) {
			continue
		}
		if !started {
			p.Family(name, help, t)
			started = true
		}
		write(it)
	}
}

// all keeps every item.
func all[T any](T) bool { return true }

// seconds converts nanoseconds to seconds.
func seconds(ns uint64) float64 { return float64(ns) / 1e9 }
