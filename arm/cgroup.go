package arm

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
)

// Cgroup layouts.
const (
	CgroupV1     = "v1"
	CgroupV2     = "v2"
	CgroupHybrid = "hybrid" // v1 controllers with a v2 hierarchy beside them
)

// The kernel command-line files of Raspberry Pi OS: the first since
// Bookworm, the second before.
const (
	CmdlineFirmware = "/boot/firmware/cmdline.txt"
	CmdlineBoot     = "/boot/cmdline.txt"
)

// memoryCmdline is what turns the memory controller on: Raspberry Pi
// kernels build it disabled unless the command line says otherwise.
const memoryCmdline = "cgroup_enable=memory cgroup_memory=1"

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

// memoryEnabled reports whether containers can be given memory limits.
// On v2 the root's cgroup.controllers must list memory. On v1 and hybrid
// the memory line of /proc/cgroups must say enabled, and be attached to a
// v1 hierarchy (hierarchy 0 means it is on no v1 mount, where runc in v1
// mode cannot use it).
func memoryEnabled(procCgroups, controllers, layout string) bool {
	if layout == CgroupV2 {
		b, err := os.ReadFile(controllers)
		return err == nil && strings.Contains(" "+strings.Join(strings.Fields(string(b)), " ")+" ", " memory ")
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
			return f[3] == "1" && f[1] != "0"
		}
	}
	return false
}

// bootCmdline returns the Raspberry Pi OS cmdline.txt present under root,
// as an absolute path on the board; "" when there is none.
func bootCmdline(root string) string {
	for _, f := range []string{CmdlineFirmware, CmdlineBoot} {
		if fi, err := os.Stat(filepath.Join(root, f)); err == nil && fi.Mode().IsRegular() {
			return f
		}
	}
	return ""
}

// cmdlineDisablesMemory reports whether /proc/cmdline has
// cgroup_disable=memory.
func cmdlineDisablesMemory(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	for _, w := range strings.Fields(string(b)) {
		if k, v, ok := strings.Cut(w, "="); ok && k == "cgroup_disable" {
			for _, c := range strings.Split(v, ",") {
				if c == "memory" {
					return true
				}
			}
		}
	}
	return false
}

// MemoryCgroupError says that the memory cgroup controller is off and
// how to turn it on. Its message names the file to edit and what to add.
type MemoryCgroupError struct {
	// Cmdline is the file holding the kernel command line, as found on
	// the board; empty when none was found.
	Cmdline string
	// Pi reports whether the board is a Raspberry Pi.
	Pi bool
	// Disabled reports whether the running command line has
	// cgroup_disable=memory, which must go.
	Disabled bool
}

// Fix is what to do, as one sentence without a capital or full stop.
func (e *MemoryCgroupError) Fix() string {
	where := "the kernel command line in the boot loader's configuration"
	switch {
	case e.Cmdline != "":
		where = "the single line of " + e.Cmdline
	case e.Pi:
		where = "the single line of " + CmdlineFirmware + " (" + CmdlineBoot + " before Raspberry Pi OS Bookworm)"
	}
	fix := "add " + memoryCmdline + " to " + where
	if e.Disabled {
		fix += " and remove cgroup_disable=memory from it"
	}
	return fix + ", then reboot"
}

// Error implements error.
func (e *MemoryCgroupError) Error() string {
	return "memory cgroup controller is off, so pod memory limits are not enforced: " + e.Fix()
}

// MemoryCgroupError returns nil when the memory controller is usable,
// else a *MemoryCgroupError saying how to turn it on.
func (f Facts) MemoryCgroupError() error {
	if f.MemoryCgroup {
		return nil
	}
	return &MemoryCgroupError{Cmdline: f.BootCmdline, Pi: f.IsPi(), Disabled: f.CmdlineDisablesMemory}
}
