// Package arm reads the facts of the board outpost runs on: its model from
// the device tree, the Raspberry Pi revision code, the cgroup layout and
// whether the memory controller is on, and the SoC temperature. It reads
// files only, so it works the same on any Linux and in tests over a fake
// root.
package arm

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Cgroup layouts.
const (
	CgroupV1     = "v1"
	CgroupV2     = "v2"
	CgroupHybrid = "hybrid" // v1 controllers with a v2 hierarchy beside them
)

// Facts are what the board says about itself. Unknown values are empty.
type Facts struct {
	// Model is the device-tree model, e.g. "Raspberry Pi 4 Model B Rev 1.4".
	Model string `json:"model,omitempty"`
	// PiRevision is the Raspberry Pi revision code from /proc/cpuinfo.
	PiRevision string `json:"piRevision,omitempty"`
	// Cgroup is v1, v2 or hybrid.
	Cgroup string `json:"cgroup"`
	// MemoryCgroup reports whether the memory controller is enabled; on
	// Raspberry Pi OS it needs cgroup_enable=memory on the kernel command line.
	MemoryCgroup bool `json:"memoryCgroup"`
	// TempMilliC is the first thermal zone's temperature, 0 if unknown.
	TempMilliC int `json:"tempMilliC,omitempty"`
}

// Read reads the facts from the file system rooted at root ("/" on a
// real board).
func Read(root string) Facts {
	p := func(rel string) string { return filepath.Join(root, rel) }
	var f Facts
	for _, m := range []string{"proc/device-tree/model", "sys/firmware/devicetree/base/model"} {
		if b, err := os.ReadFile(p(m)); err == nil {
			f.Model = strings.TrimSpace(string(bytes.TrimRight(b, "\x00")))
			break
		}
	}
	f.PiRevision = cpuinfoField(p("proc/cpuinfo"), "Revision")
	f.Cgroup = cgroupLayout(p("sys/fs/cgroup"))
	f.MemoryCgroup = memoryEnabled(p("proc/cgroups"), p("sys/fs/cgroup/cgroup.controllers"), f.Cgroup)
	if b, err := os.ReadFile(p("sys/class/thermal/thermal_zone0/temp")); err == nil {
		f.TempMilliC, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	return f
}

func cpuinfoField(path, key string) string {
	file, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// cgroupLayout tells the layout from the files under /sys/fs/cgroup: a
// unified mount has cgroup.controllers at its top; a v1 mount has one
// directory per controller, and hybrid adds a "unified" v2 mount.
func cgroupLayout(dir string) string {
	if _, err := os.Stat(filepath.Join(dir, "cgroup.controllers")); err == nil {
		return CgroupV2
	}
	if _, err := os.Stat(filepath.Join(dir, "unified", "cgroup.controllers")); err == nil {
		return CgroupHybrid
	}
	return CgroupV1
}

func memoryEnabled(procCgroups, controllers, layout string) bool {
	if layout == CgroupV2 {
		b, err := os.ReadFile(controllers)
		return err == nil && strings.Contains(" "+strings.TrimSpace(string(b))+" ", " memory ")
	}
	file, err := os.Open(procCgroups)
	if err != nil {
		return false
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		// #subsys_name hierarchy num_cgroups enabled
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[0] == "memory" {
			return f[3] == "1"
		}
	}
	return false
}
