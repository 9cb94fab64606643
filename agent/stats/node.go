package stats

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// readNode reads the node's usage the way kubelet does, from the root
// cgroup:
//
//   - CPU: v1's root cpuacct.usage, v2's root cpu.stat usage_usec. When
//     there is none (older v2 kernels have no root cpu.stat; a v1 board
//     without cpuacct), the busy time of /proc/stat's cpu line.
//   - Memory: v1's root memory.usage_in_bytes and memory.stat. v2's root
//     has no memory.current: usage is anon + file of the root memory.stat,
//     as runc's cgroups library emulates it for cAdvisor, so the figure is
//     kubelet's and is counted like the pods' (MemTotal − MemAvailable
//     would be close but counts kernel memory the pods' figures do not).
//     The working set is usage − inactive_file either way. With the memory
//     controller off there is no root memory.stat, and /proc/meminfo's
//     MemTotal − MemAvailable is the working set.
//
// The limit, for AvailableBytes, is MemTotal, as cAdvisor gives the root.
func (r *Reader) readNode(l layout, mi meminfo, miErr error) (usage, error) {
	cpu, err := readCPU(l, "/")
	if gone(err) {
		var perr error
		if cpu, _, perr = readProcStat(r.procRoot); perr != nil {
			return usage{}, errors.Join(err, perr)
		}
	} else if err != nil {
		return usage{}, err
	}
	mem, err := readRootMemory(l)
	switch {
	case err == nil:
	case gone(err) && miErr == nil:
		mem = mi.memory()
	case gone(err):
		return usage{}, errors.Join(err, miErr)
	default:
		return usage{}, err
	}
	mem.limit = mi.total
	return usage{cpu: cpu, mem: mem}, nil
}

// meminfo is what we use of /proc/meminfo, in bytes.
type meminfo struct {
	total, free, available, anon uint64
}

// memory is the node's memory by /proc/meminfo alone: usage is what is
// not free, the working set what the kernel cannot reclaim.
func (mi meminfo) memory() *memory {
	m := &memory{rss: mi.anon}
	if mi.total > mi.free {
		m.usage = mi.total - mi.free
	}
	if mi.total > mi.available {
		m.workingSet = mi.total - mi.available
	}
	return m
}

func readMeminfo(procRoot string) (meminfo, error) {
	path := filepath.Join(procRoot, "meminfo")
	b, err := os.ReadFile(path)
	if err != nil {
		return meminfo{}, err
	}
	mi, err := parseMeminfo(string(b))
	if err != nil {
		return meminfo{}, fmt.Errorf("parse %s: %w", path, err)
	}
	return mi, nil
}

// parseMeminfo reads "Key:   value kB" lines. MemTotal and MemAvailable
// must be there.
func parseMeminfo(data string) (meminfo, error) {
	var mi meminfo
	var haveTotal, haveAvailable bool
	for line := range strings.Lines(data) {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var p *uint64
		switch k {
		case "MemTotal":
			p, haveTotal = &mi.total, true
		case "MemFree":
			p = &mi.free
		case "MemAvailable":
			p, haveAvailable = &mi.available, true
		case "AnonPages":
			p = &mi.anon
		default:
			continue
		}
		v = strings.TrimSpace(v)
		unit := uint64(1)
		if n, ok := strings.CutSuffix(v, " kB"); ok {
			v, unit = strings.TrimSpace(n), 1024
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return meminfo{}, fmt.Errorf("key %s: %w", k, err)
		}
		*p = n * unit
	}
	if !haveTotal || !haveAvailable {
		return meminfo{}, errors.New("no MemTotal or MemAvailable")
	}
	return mi, nil
}

// userHZ is the unit of /proc/stat's CPU times, USER_HZ, which is 100 on
// every Linux architecture we run on.
const userHZ = 100

// readProcStat returns the CPU time all cores spent busy since boot, in
// nanoseconds, and the boot time.
func readProcStat(procRoot string) (busy uint64, boot time.Time, err error) {
	path := filepath.Join(procRoot, "stat")
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, time.Time{}, err
	}
	busy, boot, err = parseProcStat(string(b))
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("parse %s: %w", path, err)
	}
	return busy, boot, nil
}

// readBootTime returns when the node booted, from /proc/stat's btime.
func readBootTime(procRoot string) (time.Time, error) {
	_, boot, err := readProcStat(procRoot)
	return boot, err
}

// parseProcStat reads the aggregate "cpu" line (user nice system idle
// iowait irq softirq steal ...; busy is all but idle and iowait, guest time
// being counted in user already) and the btime line.
func parseProcStat(data string) (busy uint64, boot time.Time, err error) {
	var haveCPU, haveBoot bool
	for line := range strings.Lines(data) {
		f := strings.Fields(line)
		switch {
		case len(f) >= 8 && f[0] == "cpu":
			var ticks uint64
			for i, s := range f[1:min(len(f), 9)] {
				n, err := strconv.ParseUint(s, 10, 64)
				if err != nil {
					return 0, time.Time{}, fmt.Errorf("cpu field %d: %w", i+1, err)
				}
				if i != 3 && i != 4 { // idle, iowait
					ticks += n
				}
			}
			busy, haveCPU = ticks*(1e9/userHZ), true
		case len(f) == 2 && f[0] == "btime":
			s, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, time.Time{}, fmt.Errorf("btime: %w", err)
			}
			boot, haveBoot = time.Unix(s, 0), true
		}
	}
	if !haveCPU || !haveBoot {
		return 0, time.Time{}, errors.New("no cpu or btime line")
	}
	return busy, boot, nil
}
