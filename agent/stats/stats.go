// Package stats reads the CPU and memory usage of the node, its pods and
// their containers from cgroups (v1 and v2) and renders it the way kubelet
// does: /metrics/resource in the Prometheus text format metrics-server
// scrapes, and /stats/summary as a statsv1alpha1.Summary.
//
// Basics: a Reader reads files on each call and keeps nothing but the
// previous CPU sample of each cgroup, from which Summary computes
// UsageNanoCores. It starts no goroutines.
//
// Caveats: a pod or container whose cgroup is gone is left out, not an
// error; a cgroup that exists but cannot be read is left out too and turns
// scrape_error to 1. Memory is left out when the memory controller is off
// (Raspberry Pi kernels without cgroup_enable=memory), which metrics-server
// treats as no metrics for that pod.
package stats

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
	corev1 "k8s.io/api/core/v1"
)

// Defaults of Options.
const (
	DefaultCgroupRoot = "/sys/fs/cgroup"
	DefaultProcRoot   = "/proc"
)

// DefaultCgroupParent is the agent's cgroup by default. A pod's cgroup is
// the parent's plus "/pod" and the pod's UID; a container's is its pod's
// plus "/" and the container ID, as agent/worker.go gives containers.
const DefaultCgroupParent = "/outpost"

// Options configure a Reader.
type Options struct {
	// CgroupRoot is where cgroups are mounted; DefaultCgroupRoot when
	// empty. A cgroup.controllers file at its top means v2, else it holds
	// one directory per v1 controller.
	CgroupRoot string
	// ProcRoot is where procfs is mounted; DefaultProcRoot when empty.
	ProcRoot string
	// CgroupParent holds the pods' cgroups; DefaultCgroupParent when
	// empty.
	CgroupParent string
	// NodeName is the node's name in Summary.
	NodeName string
	// Clock stamps the samples; clock.Real{} when nil.
	Clock clock.Clock
}

// Reader reads usage from cgroups. Zero value is not usable; use New.
// Its methods are safe to call concurrently.
type Reader struct {
	cgroupRoot, procRoot, nodeName string
	podCgroupPrefix                string
	clock                          clock.Clock

	mu sync.Mutex
	// prev holds the CPU sample of each cgroup seen by the last Summary
	// call, by cgroup path ("/" for the node).
	prev map[string]cpuSample
}

// cpuSample is a cumulative CPU usage at a time.
type cpuSample struct {
	at time.Time
	ns uint64
}

// New returns a Reader. It reads nothing until called.
func New(o Options) *Reader {
	r := &Reader{cgroupRoot: o.CgroupRoot, procRoot: o.ProcRoot, nodeName: o.NodeName, clock: o.Clock}
	if r.cgroupRoot == "" {
		r.cgroupRoot = DefaultCgroupRoot
	}
	if r.procRoot == "" {
		r.procRoot = DefaultProcRoot
	}
	if o.CgroupParent == "" {
		o.CgroupParent = DefaultCgroupParent
	}
	r.podCgroupPrefix = path.Join(o.CgroupParent, "pod")
	if r.clock == nil {
		r.clock = clock.Real{}
	}
	return r
}

// snapshot is one read of the node and the pods, stamped with one time.
type snapshot struct {
	at time.Time
	// node is nil when nodeErr says why it could not be read.
	node    *usage
	nodeErr error
	// pods are sorted by namespace and name, their containers by name.
	pods []podUsage
	// failed reports whether a pod or container cgroup that exists could
	// not be read, and was left out.
	failed bool
}

// usage is what one cgroup used.
type usage struct {
	// cpu is the cumulative CPU time in core-nanoseconds.
	cpu uint64
	// mem is nil when the memory controller is off.
	mem *memory
}

// memory is a cgroup's memory usage, in bytes.
type memory struct {
	usage, workingSet, rss uint64
	pgfault, pgmajfault    uint64
	// limit is the cgroup's limit; unlimited when above 1<<62, as kubelet
	// counts it.
	limit uint64
}

// unlimited is kubelet's bound above which a memory limit is none: the
// kernel rounds "no limit" to a page-aligned value just below MaxInt64.
const unlimited = uint64(1) << 62

// available returns limit − working set, or nil without a limit.
func (m *memory) available() *uint64 {
	if m.limit == 0 || m.limit > unlimited {
		return nil
	}
	a := uint64(0)
	if m.limit > m.workingSet {
		a = m.limit - m.workingSet
	}
	return &a
}

type podUsage struct {
	pod    *corev1.Pod
	cgroup string
	usage
	containers []containerUsage
}

type containerUsage struct {
	name    string
	cgroup  string
	started time.Time
	usage
}

// running is a running container of a pod, from its status.
type running struct {
	name, id string
	started  time.Time
}

// runningContainers returns the pod's running containers, init and
// ephemeral ones included, as kubelet reports every container with a
// cgroup. A container ID that could escape the pod's cgroup is skipped.
func runningContainers(pod *corev1.Pod) []running {
	var out []running
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for i := range list {
			cs := &list[i]
			if cs.State.Running == nil || cs.ContainerID == "" {
				continue
			}
			id := cs.ContainerID
			if _, after, ok := strings.Cut(id, "://"); ok {
				id = after
			}
			if !safeName(id) {
				continue
			}
			out = append(out, running{name: cs.Name, id: id, started: cs.State.Running.StartedAt.Time})
		}
	}
	return out
}

// safeName reports whether s can be one element of a cgroup path.
func safeName(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\x00")
}

// read reads the node and the pods. A pod or container whose cgroup is
// gone is left out; one that cannot be read is left out and sets failed.
func (r *Reader) read(pods []*corev1.Pod) snapshot {
	l := r.layout()
	s := snapshot{at: r.clock.Now()}
	mi, miErr := readMeminfo(r.procRoot)
	node, err := r.readNode(l, mi, miErr)
	if err != nil {
		s.nodeErr = fmt.Errorf("read node stats: %w", err)
	} else {
		s.node = &node
	}
	seen := make(map[string]bool, len(pods))
	for _, pod := range pods {
		if pod == nil {
			continue
		}
		uid := string(pod.UID)
		if !safeName(uid) || seen[uid] {
			continue
		}
		seen[uid] = true
		pu := podUsage{pod: pod, cgroup: r.podCgroupPrefix + uid}
		u, err := readUsage(l, pu.cgroup)
		if err != nil {
			s.failed = s.failed || !gone(err)
			continue
		}
		pu.usage = u
		for _, c := range runningContainers(pod) {
			cu := containerUsage{name: c.name, cgroup: pu.cgroup + "/" + c.id, started: c.started}
			u, err := readUsage(l, cu.cgroup)
			if err != nil {
				s.failed = s.failed || !gone(err)
				continue
			}
			cu.usage = u
			pu.containers = append(pu.containers, cu)
		}
		slices.SortFunc(pu.containers, func(a, b containerUsage) int { return strings.Compare(a.name, b.name) })
		s.pods = append(s.pods, pu)
	}
	slices.SortFunc(s.pods, func(a, b podUsage) int {
		return cmp.Or(strings.Compare(a.pod.Namespace, b.pod.Namespace), strings.Compare(a.pod.Name, b.pod.Name))
	})
	return s
}

// WriteResource writes /metrics/resource for the node and these pods:
// kubelet's families, in its order, with its names, help, types and label
// order, as metrics-server v0.8 decodes them. Its error is only that of
// writing to w; what could not be read is left out and reported by the
// scrape_error and resource_scrape_error samples.
func (r *Reader) WriteResource(w io.Writer, pods []*corev1.Pod) error {
	if err := writeResource(w, r.read(pods)); err != nil {
		return fmt.Errorf("write resource metrics: %w", err)
	}
	return nil
}

// Summary returns /stats/summary for the node and these pods, a
// statsv1alpha1.Summary. It fails only when the node's own usage cannot
// be read, as kubelet's fails without its root cgroup's; pods and
// containers that cannot be read are left out. It remembers each cgroup's CPU usage to
// compute UsageNanoCores on the next call.
func (r *Reader) Summary(pods []*corev1.Pod) (any, error) {
	s := r.read(pods)
	if s.nodeErr != nil {
		return nil, s.nodeErr
	}
	boot, _ := readBootTime(r.procRoot) // zero when unknown, as an unset StartTime
	r.mu.Lock()
	defer r.mu.Unlock()
	next := make(map[string]cpuSample, len(r.prev))
	sum := summarize(s, r.nodeName, boot, r.prev, next)
	r.prev = next
	return sum, nil
}

// gone reports whether err says a cgroup or its file is not there (any
// more): the container exited between the status and the read.
// Reading a file of a cgroup removed after the open gives ENODEV.
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENODEV)
}
