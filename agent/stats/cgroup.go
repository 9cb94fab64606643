package stats

import (
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// layout is where the files of a cgroup are. It is found again on each
// read: a stat or two, nothing to go stale.
type layout struct {
	v2 bool
	// cpu is the v1 hierarchy holding cpuacct.usage, or the v2 root; ""
	// when v1 has no cpuacct mount.
	cpu string
	// mem is the v1 memory hierarchy, or the v2 root; "" when v1 has no
	// memory mount (the controller is off).
	mem string
}

// v1CPUDirs are where distributions mount the v1 cpuacct controller:
// alone, or co-mounted with cpu under either name (with or without the
// cpu and cpuacct symlinks beside it).
var v1CPUDirs = []string{"cpuacct", "cpu,cpuacct", "cpuacct,cpu"}

// layout tells v2 from v1 the way arm's cgroupLayout does: a unified
// mount has cgroup.controllers at its top. Hybrid (v1 controllers with a
// "unified" v2 mount beside them) is v1 here, since containerd puts
// containers in the v1 controllers then.
func (r *Reader) layout() layout {
	root := r.cgroupRoot
	if exists(filepath.Join(root, "cgroup.controllers")) {
		return layout{v2: true, cpu: root, mem: root}
	}
	// A mounted v1 hierarchy has cgroup.procs at its top; an unmounted
	// one is at most an empty directory.
	var l layout
	for _, d := range v1CPUDirs {
		if dir := filepath.Join(root, d); exists(filepath.Join(dir, "cgroup.procs")) {
			l.cpu = dir
			break
		}
	}
	if dir := filepath.Join(root, "memory"); exists(filepath.Join(dir, "cgroup.procs")) {
		l.mem = dir
	}
	return l
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// notMounted is the error for a file of a v1 controller that is not
// mounted: gone, like a cgroup that is not there.
func notMounted(controller, cgroup string) error {
	return &fs.PathError{Op: "read", Path: controller + " controller, cgroup " + cgroup, Err: fs.ErrNotExist}
}

// readUsage reads a cgroup's CPU and memory. Its error is the CPU's: a
// cgroup without memory (the controller is off, or the cgroup went away
// between the two reads) has a nil mem.
func readUsage(l layout, cgroup string) (usage, error) {
	cpu, err := readCPU(l, cgroup)
	if err != nil {
		return usage{}, err
	}
	mem, err := readMemory(l, cgroup)
	if err != nil && !gone(err) {
		return usage{}, err
	}
	return usage{cpu: cpu, mem: mem}, nil
}

// readCPU returns a cgroup's cumulative CPU time in nanoseconds: v1's
// cpuacct.usage, v2's cpu.stat usage_usec.
func readCPU(l layout, cgroup string) (uint64, error) {
	if l.v2 {
		b, err := os.ReadFile(filepath.Join(l.cpu, cgroup, "cpu.stat"))
		if err != nil {
			return 0, err
		}
		usec, err := keyedValue(string(b), "usage_usec")
		if err != nil {
			return 0, fmt.Errorf("parse %s: %w", filepath.Join(l.cpu, cgroup, "cpu.stat"), err)
		}
		return usec * 1000, nil
	}
	if l.cpu == "" {
		return 0, notMounted("cpuacct", cgroup)
	}
	return readUint(filepath.Join(l.cpu, cgroup, "cpuacct.usage"))
}

// readMemory reads a cgroup's memory: usage (v1 memory.usage_in_bytes,
// v2 memory.current), and the working set computed as cAdvisor does:
// usage minus inactive file pages, floored at 0.
func readMemory(l layout, cgroup string) (*memory, error) {
	if l.mem == "" {
		return nil, notMounted("memory", cgroup)
	}
	dir := filepath.Join(l.mem, cgroup)
	usageFile, limitFile := "memory.usage_in_bytes", "memory.limit_in_bytes"
	if l.v2 {
		usageFile, limitFile = "memory.current", "memory.max"
	}
	u, err := readUint(filepath.Join(dir, usageFile))
	if err != nil {
		return nil, err
	}
	st, err := readMemStat(dir, l.v2)
	if err != nil {
		return nil, err
	}
	limit, err := readLimit(filepath.Join(dir, limitFile))
	if err != nil && !gone(err) {
		return nil, err
	}
	return st.memory(u, limit), nil
}

// readRootMemory reads the memory of the root cgroup, which v2 gives no
// memory.current: there usage is anon + file of the root's memory.stat,
// as runc's cgroups library (and so cAdvisor, and so kubelet) emulates
// it, which is also what v1's root memory.usage_in_bytes counts. An error
// for which gone is true means the memory controller is off.
func readRootMemory(l layout) (*memory, error) {
	if !l.v2 {
		return readMemory(l, "/")
	}
	st, err := readMemStat(l.mem, true)
	if err != nil {
		return nil, err
	}
	return st.memory(st.anon+st.file, 0), nil
}

// memStat is what we use of memory.stat. On v1 these are the
// hierarchical total_* counters, which count the cgroup and everything
// below it, as v2's always do.
type memStat struct {
	anon, file, inactiveFile uint64
	pgfault, pgmajfault      uint64
}

func (st memStat) memory(usage, limit uint64) *memory {
	ws := uint64(0)
	if usage > st.inactiveFile {
		ws = usage - st.inactiveFile
	}
	return &memory{usage: usage, workingSet: ws, rss: st.anon, pgfault: st.pgfault, pgmajfault: st.pgmajfault, limit: limit}
}

func readMemStat(dir string, v2 bool) (memStat, error) {
	path := filepath.Join(dir, "memory.stat")
	b, err := os.ReadFile(path)
	if err != nil {
		return memStat{}, err
	}
	st, err := parseMemStat(string(b), v2)
	if err != nil {
		return memStat{}, fmt.Errorf("parse %s: %w", path, err)
	}
	return st, nil
}

// parseMemStat reads memory.stat's "key value" lines. Keys it does not
// use are skipped unparsed; a missing key reads 0. v1's total_rss and
// total_cache are v2's anon and file, and neither version has the
// other's names, so one switch serves both.
func parseMemStat(data string, v2 bool) (memStat, error) {
	var st memStat
	for line := range strings.Lines(data) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), " ")
		name := k
		if !v2 {
			var ok bool
			if name, ok = strings.CutPrefix(k, "total_"); !ok {
				continue
			}
		}
		var p *uint64
		switch name {
		case "anon", "rss":
			p = &st.anon
		case "file", "cache":
			p = &st.file
		case "inactive_file":
			p = &st.inactiveFile
		case "pgfault":
			p = &st.pgfault
		case "pgmajfault":
			p = &st.pgmajfault
		default:
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return memStat{}, fmt.Errorf("key %s: %w", k, err)
		}
		*p = n
	}
	return st, nil
}

// keyedValue returns the value of key in a flat-keyed file ("key value"
// lines, as cpu.stat).
func keyedValue(data, key string) (uint64, error) {
	for line := range strings.Lines(data) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), " ")
		if k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("key %s: %w", key, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("no key %s", key)
}

// readUint reads a file holding one decimal number.
func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return n, nil
}

// readLimit reads a memory limit: a number, or v2's "max" for none.
func readLimit(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return math.MaxUint64, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return n, nil
}
