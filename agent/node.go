package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/outpost-edge/outpost/internal/clock"
)

// Node status defaults and thresholds, kubelet's unless said otherwise.
const (
	// DefaultMaxPods is the pods capacity when NodeConfig.MaxPods is 0,
	// kubelet's maxPods default.
	DefaultMaxPods = 110
	// DefaultKubeletPort is daemonEndpoints.kubeletEndpoint.Port when
	// NodeConfig.KubeletPort is 0.
	DefaultKubeletPort = 10250
	// DefaultStaleAfter is how long the agent's main loop may go without
	// turning before the node is not Ready (outpost's choice: the loop
	// turns every second or so, and a minute rides out a slow SD card).
	DefaultStaleAfter = time.Minute

	// EvictionMemoryAvailable is kubelet's default hard eviction threshold
	// memory.available<100Mi: below it MemoryPressure is True, and
	// allocatable memory is capacity minus it.
	EvictionMemoryAvailable = 100 << 20
	// EvictionNodefsAvailablePercent is kubelet's default hard eviction
	// threshold nodefs.available<10%: below it DiskPressure is True, and
	// allocatable ephemeral-storage is capacity minus that share.
	EvictionNodefsAvailablePercent = 10
	// PIDPressurePercent is the share of the kernel's task limit in use
	// from which PIDPressure is True (kubelet has no default pid.available
	// threshold; this one leaves 10% for the system).
	PIDPressurePercent = 90
)

// Reasons of the node conditions, as kubelet sets them.
const (
	ReasonKubeletReady                 = "KubeletReady"
	ReasonKubeletNotReady              = "KubeletNotReady"
	ReasonKubeletHasSufficientMemory   = "KubeletHasSufficientMemory"
	ReasonKubeletHasInsufficientMemory = "KubeletHasInsufficientMemory"
	ReasonKubeletHasNoDiskPressure     = "KubeletHasNoDiskPressure"
	ReasonKubeletHasDiskPressure       = "KubeletHasDiskPressure"
	ReasonKubeletHasSufficientPID      = "KubeletHasSufficientPID"
	ReasonKubeletHasInsufficientPID    = "KubeletHasInsufficientPID"
	// ReasonNodeStatsUnknown is outpost's: a pressure condition is
	// Unknown because what it is computed from could not be read.
	ReasonNodeStatsUnknown = "NodeStatsUnknown"
)

// NodeConfig is what the node's status says that the agent does not read
// from the system itself.
type NodeConfig struct {
	// Root is the file system root that /proc, /sys and /etc are read
	// under; "" is "/". Tests point it at a fixture.
	Root string
	// Hostname is the node's Hostname address.
	Hostname string
	// HostIP is the node's InternalIP address; "" leaves it out.
	HostIP string
	// MaxPods is the pods capacity (default DefaultMaxPods).
	MaxPods int
	// StorageDir is a directory on the file system that holds the pods'
	// writable layers and volumes (containerd's root, or the state dir
	// when they share a file system); that file system's size is the
	// ephemeral-storage capacity and its free space decides DiskPressure.
	// It is a path on the running system, not under Root; "" is "/".
	StorageDir string
	// RuntimeVersion is the container runtime's version as
	// Runtime.Version gives it ("containerd://2.1.4"); a bare version
	// gets the "containerd://" prefix.
	RuntimeVersion string
	// KubeletPort is daemonEndpoints.kubeletEndpoint.Port, the port of
	// the kubelet-style API (default DefaultKubeletPort).
	KubeletPort int32
	// StaleAfter is how long the agent's heartbeat may be old before the
	// node is not Ready (default DefaultStaleAfter).
	StaleAfter time.Duration
}

// NodeDeps are what NodeStatus asks at each call. A nil func is not
// asked, and what it would tell is not checked.
type NodeDeps struct {
	// Clock tells how old the heartbeat is; it is required with Heartbeat.
	Clock clock.Clock
	// Heartbeat returns when the agent's main loop last turned
	// (Agent.Heartbeat).
	Heartbeat func() time.Time
	// RuntimeHealth returns nil while the container runtime answers, or
	// why it does not. It is called for every status, so it should
	// return the outcome of the last check rather than make one.
	RuntimeHealth func() error
	// Statfs returns the size and free space of the file system holding
	// path; nil uses statfs(2).
	Statfs func(path string) (FSStats, error)
	// StoreWrites returns whether the store takes writes
	// (Agent.StoreWrites), for the StoreWritable condition; nil leaves
	// the condition out.
	StoreWrites func() StoreWrites
}

// FSStats is the size of a file system and the space an unprivileged
// process may still use on it, in bytes.
type FSStats struct {
	Capacity, Available uint64
}

// NodeStatus returns what the agent knows of the node, in the shape of a
// Node's status: capacity and allocatable, the Ready, MemoryPressure,
// DiskPressure and PIDPressure conditions (and outpost's StoreWritable
// with deps.StoreWrites), addresses, the kubelet-style
// API's port and nodeInfo. It leaves to the API sync what only it knows:
// the conditions' heartbeat and transition times and
// nodeInfo.kubeletVersion. Node labels are the board's (arm.Facts.Labels).
//
// Capacity is cpu (online CPUs), memory (MemTotal), pods (MaxPods) and
// ephemeral-storage (the size of StorageDir's file system). Allocatable
// is capacity minus kubelet's default hard eviction thresholds, as
// kubelet computes it with no kube-reserved or system-reserved
// configured (outpost has neither): memory minus 100Mi, ephemeral-storage
// minus 10%; cpu and pods are not reduced. A value that cannot be read
// is left out, and the condition that depends on it is Unknown.
func NodeStatus(cfg NodeConfig, deps NodeDeps) corev1.NodeStatus {
	cfg.setDefaults()
	r := nodeFiles(cfg.Root)
	capacity, allocatable := corev1.ResourceList{}, corev1.ResourceList{}

	if n, err := r.onlineCPUs(); err == nil {
		capacity[corev1.ResourceCPU] = *resource.NewQuantity(int64(n), resource.DecimalSI)
		allocatable[corev1.ResourceCPU] = *resource.NewQuantity(int64(n), resource.DecimalSI)
	}
	mem, memErr := r.meminfo()
	if memErr == nil && mem.total > 0 {
		capacity[corev1.ResourceMemory] = *resource.NewQuantity(mem.total, resource.BinarySI)
		allocatable[corev1.ResourceMemory] = *resource.NewQuantity(max(0, mem.total-EvictionMemoryAvailable), resource.BinarySI)
	}
	capacity[corev1.ResourcePods] = *resource.NewQuantity(int64(cfg.MaxPods), resource.DecimalSI)
	allocatable[corev1.ResourcePods] = *resource.NewQuantity(int64(cfg.MaxPods), resource.DecimalSI)
	statfs := deps.Statfs
	if statfs == nil {
		statfs = statFS
	}
	fs, fsErr := statfs(cfg.StorageDir)
	if fsErr == nil && fs.Capacity > 0 {
		c := int64(fs.Capacity)
		capacity[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(c, resource.BinarySI)
		allocatable[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(c-c*EvictionNodefsAvailablePercent/100, resource.BinarySI)
	} else if fsErr == nil {
		fsErr = fmt.Errorf("statfs %s: file system of size 0", cfg.StorageDir)
	}

	st := corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: allocatable,
		Conditions: []corev1.NodeCondition{
			memoryCondition(mem, memErr),
			diskCondition(cfg.StorageDir, fs, fsErr),
			r.pidCondition(),
			readyCondition(cfg, deps),
		},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: cfg.KubeletPort}},
		NodeInfo: corev1.NodeSystemInfo{
			MachineID:               r.firstLine("etc/machine-id", "var/lib/dbus/machine-id"),
			SystemUUID:              r.firstLine("sys/class/dmi/id/product_uuid"),
			BootID:                  r.firstLine("proc/sys/kernel/random/boot_id"),
			KernelVersion:           r.firstLine("proc/sys/kernel/osrelease"),
			OSImage:                 r.osImage(),
			ContainerRuntimeVersion: runtimeVersion(cfg.RuntimeVersion),
			OperatingSystem:         "linux",
			Architecture:            runtime.GOARCH,
		},
	}
	if deps.StoreWrites != nil {
		st.Conditions = append(st.Conditions, storeCondition(deps.StoreWrites()))
	}
	if cfg.HostIP != "" {
		st.Addresses = append(st.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: cfg.HostIP})
	}
	if cfg.Hostname != "" {
		st.Addresses = append(st.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: cfg.Hostname})
	}
	return st
}

func (c *NodeConfig) setDefaults() {
	if c.Root == "" {
		c.Root = "/"
	}
	if c.StorageDir == "" {
		c.StorageDir = "/"
	}
	if c.MaxPods <= 0 {
		c.MaxPods = DefaultMaxPods
	}
	if c.KubeletPort <= 0 {
		c.KubeletPort = DefaultKubeletPort
	}
	if c.StaleAfter <= 0 {
		c.StaleAfter = DefaultStaleAfter
	}
}

func runtimeVersion(v string) string {
	if v == "" || strings.Contains(v, "://") {
		return v
	}
	return "containerd://" + v
}

// readyCondition is True while the agent's main loop turns and the
// runtime answers. Its messages carry no changing numbers, so a node
// that stays in one state does not make a new status every time.
func readyCondition(cfg NodeConfig, deps NodeDeps) corev1.NodeCondition {
	c := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: ReasonKubeletNotReady}
	var runtimeErr error
	if deps.RuntimeHealth != nil {
		runtimeErr = deps.RuntimeHealth()
	}
	switch {
	case deps.Heartbeat != nil && deps.Clock.Since(deps.Heartbeat()) > cfg.StaleAfter:
		c.Message = fmt.Sprintf("outpost's main loop has not turned for more than %s", cfg.StaleAfter)
	case runtimeErr != nil:
		c.Message = "container runtime is down: " + runtimeErr.Error()
	default:
		c.Status, c.Reason, c.Message = corev1.ConditionTrue, ReasonKubeletReady, "outpost is posting ready status"
	}
	return c
}

func memoryCondition(m meminfo, err error) corev1.NodeCondition {
	c := corev1.NodeCondition{Type: corev1.NodeMemoryPressure}
	threshold := resource.NewQuantity(EvictionMemoryAvailable, resource.BinarySI).String()
	switch {
	case err != nil:
		c.Status, c.Reason, c.Message = corev1.ConditionUnknown, ReasonNodeStatsUnknown, err.Error()
	case m.available < EvictionMemoryAvailable:
		c.Status, c.Reason = corev1.ConditionTrue, ReasonKubeletHasInsufficientMemory
		c.Message = "outpost has insufficient memory available: MemAvailable is below " + threshold
	default:
		c.Status, c.Reason = corev1.ConditionFalse, ReasonKubeletHasSufficientMemory
		c.Message = "outpost has sufficient memory available"
	}
	return c
}

func diskCondition(dir string, fs FSStats, err error) corev1.NodeCondition {
	c := corev1.NodeCondition{Type: corev1.NodeDiskPressure}
	switch {
	case err != nil:
		c.Status, c.Reason, c.Message = corev1.ConditionUnknown, ReasonNodeStatsUnknown, err.Error()
	case fs.Available*100 < fs.Capacity*EvictionNodefsAvailablePercent:
		c.Status, c.Reason = corev1.ConditionTrue, ReasonKubeletHasDiskPressure
		c.Message = fmt.Sprintf("outpost has disk pressure: less than %d%% of the file system holding %s is available", EvictionNodefsAvailablePercent, dir)
	default:
		c.Status, c.Reason = corev1.ConditionFalse, ReasonKubeletHasNoDiskPressure
		c.Message = "outpost has no disk pressure"
	}
	return c
}

// pidCondition compares the tasks (processes and threads) that exist, the
// denominator of /proc/loadavg's fourth field (sysinfo(2)'s count
// saturates at 65535), with the kernel's limit on them: the lower of
// kernel.pid_max and kernel.threads-max, as kubelet does. The message says
// which one it is.
func (r nodeFiles) pidCondition() corev1.NodeCondition {
	c := corev1.NodeCondition{Type: corev1.NodePIDPressure}
	limit, name, err := r.taskLimit()
	var tasks int64
	if err == nil {
		tasks, err = r.taskCount()
	}
	switch {
	case err != nil:
		c.Status, c.Reason, c.Message = corev1.ConditionUnknown, ReasonNodeStatsUnknown, err.Error()
	case tasks*100 > limit*PIDPressurePercent:
		c.Status, c.Reason = corev1.ConditionTrue, ReasonKubeletHasInsufficientPID
		c.Message = fmt.Sprintf("outpost has insufficient PID available: more than %d%% of %s (%d) in use", PIDPressurePercent, name, limit)
	default:
		c.Status, c.Reason = corev1.ConditionFalse, ReasonKubeletHasSufficientPID
		c.Message = fmt.Sprintf("outpost has sufficient PID available (limit %s, %d)", name, limit)
	}
	return c
}

// nodeFiles reads the node's facts from the file system rooted at it.
type nodeFiles string

func (r nodeFiles) path(rel string) string { return filepath.Join(string(r), rel) }

func (r nodeFiles) read(rel string) ([]byte, error) { return os.ReadFile(r.path(rel)) }

// firstLine returns the first line of the first of files that has one,
// trimmed, or "".
func (r nodeFiles) firstLine(files ...string) string {
	for _, f := range files {
		b, err := r.read(f)
		if err != nil {
			continue
		}
		line, _, _ := bytes.Cut(b, []byte("\n"))
		if s := strings.TrimSpace(string(line)); s != "" {
			return s
		}
	}
	return ""
}

// onlineCPUs counts the CPUs in /sys/devices/system/cpu/online, a list of
// ranges such as "0-3" or "0,2-3".
func (r nodeFiles) onlineCPUs() (int, error) {
	const rel = "sys/devices/system/cpu/online"
	b, err := r.read(rel)
	if err != nil {
		return 0, err
	}
	n := 0
	for part := range strings.SplitSeq(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		first, err1 := strconv.Atoi(lo)
		last, err2 := first, error(nil)
		if isRange {
			last, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || last < first {
			return 0, fmt.Errorf("%s: bad CPU list %q", r.path(rel), strings.TrimSpace(string(b)))
		}
		n += last - first + 1
	}
	return n, nil
}

type meminfo struct{ total, available int64 }

// meminfo reads MemTotal and MemAvailable from /proc/meminfo, in bytes.
func (r nodeFiles) meminfo() (meminfo, error) {
	const rel = "proc/meminfo"
	b, err := r.read(rel)
	if err != nil {
		return meminfo{}, err
	}
	var m meminfo
	var haveTotal, haveAvail bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "MemTotal" && name != "MemAvailable") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return meminfo{}, fmt.Errorf("%s: bad %s line %q", r.path(rel), name, sc.Text())
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return meminfo{}, fmt.Errorf("%s: bad %s line %q", r.path(rel), name, sc.Text())
		}
		if name == "MemTotal" {
			m.total, haveTotal = kb<<10, true
		} else {
			m.available, haveAvail = kb<<10, true
		}
	}
	if !haveTotal || !haveAvail {
		return meminfo{}, fmt.Errorf("%s: no MemTotal or MemAvailable (kernels before 3.14 lack MemAvailable)", r.path(rel))
	}
	return m, nil
}

// taskLimit returns the lower of kernel.pid_max and kernel.threads-max,
// and its name.
func (r nodeFiles) taskLimit() (int64, string, error) {
	var limit int64
	var name string
	var errs []error
	for _, k := range []struct{ rel, name string }{
		{"proc/sys/kernel/pid_max", "kernel.pid_max"},
		{"proc/sys/kernel/threads-max", "kernel.threads-max"},
	} {
		b, err := r.read(k.rel)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || v <= 0 {
			errs = append(errs, fmt.Errorf("%s: not a positive number: %q", r.path(k.rel), strings.TrimSpace(string(b))))
			continue
		}
		if name == "" || v < limit {
			limit, name = v, k.name
		}
	}
	if name == "" {
		return 0, "", errors.Join(errs...)
	}
	return limit, name, nil
}

// taskCount reads the number of tasks from /proc/loadavg
// ("0.48 0.84 1.26 1/84 26083": 84).
func (r nodeFiles) taskCount() (int64, error) {
	const rel = "proc/loadavg"
	b, err := r.read(rel)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) >= 4 {
		if _, total, ok := strings.Cut(f[3], "/"); ok {
			if n, err := strconv.ParseInt(total, 10, 64); err == nil {
				return n, nil
			}
		}
	}
	return 0, fmt.Errorf("%s: no task count in %q", r.path(rel), strings.TrimSpace(string(b)))
}

// osImage is PRETTY_NAME from os-release(5): /etc/os-release, else
// /usr/lib/os-release; "Linux" when neither names one, the default the
// format defines.
func (r nodeFiles) osImage() string {
	for _, rel := range []string{"etc/os-release", "usr/lib/os-release"} {
		b, err := r.read(rel)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			v, ok := strings.CutPrefix(strings.TrimSpace(line), "PRETTY_NAME=")
			if !ok {
				continue
			}
			if u, err := strconv.Unquote(v); err == nil {
				v = u
			} else {
				v = strings.Trim(v, `'"`)
			}
			if v != "" {
				return v
			}
		}
	}
	return "Linux"
}

// statFS is statfs(2) on path.
func statFS(path string) (FSStats, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return FSStats{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := uint64(st.Bsize)
	return FSStats{Capacity: st.Blocks * bs, Available: st.Bavail * bs}, nil
}
