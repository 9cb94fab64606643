// Package arm reads the facts of the board outpost runs on: its model from
// the device tree, the Raspberry Pi revision code, the cgroup layout and
// whether the memory controller is on, and its health: thermal zones and
// the Raspberry Pi firmware's under-voltage and throttling flags. It turns
// them into node labels, conditions and metric samples. It reads files
// only, so it works the same on any Linux and in tests over a fake root.
package arm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Facts are what the board says about itself. Unknown values are empty.
type Facts struct {
	// Model is the device-tree model, e.g. "Raspberry Pi 4 Model B Rev 1.4".
	Model string `json:"model,omitempty"`
	// PiRevision is the decoded Raspberry Pi revision code; nil on other
	// boards.
	PiRevision *Revision `json:"piRevision,omitempty"`
	// Cgroup is v1, v2 or hybrid.
	Cgroup string `json:"cgroup"`
	// MemoryCgroup reports whether the memory controller is enabled; on
	// Raspberry Pi OS it needs cgroup_enable=memory on the kernel command
	// line. MemoryCgroupError says how to turn it on.
	MemoryCgroup bool `json:"memoryCgroup"`
	// BootCmdline is the Raspberry Pi OS file holding the kernel command
	// line, CmdlineFirmware or CmdlineBoot, when present.
	BootCmdline string `json:"bootCmdline,omitempty"`
	// CmdlineDisablesMemory reports whether the running kernel's command
	// line has cgroup_disable=memory.
	CmdlineDisablesMemory bool `json:"cmdlineDisablesMemory,omitempty"`
	// Health is what the sensors said when the facts were read.
	Health Readings `json:"health"`
}

// IsPi reports whether the board is a Raspberry Pi.
func (f Facts) IsPi() bool {
	return f.PiRevision != nil || strings.HasPrefix(f.Model, "Raspberry Pi")
}

// Read reads the facts from the file system rooted at root ("/" on a
// real board).
func Read(root string) Facts {
	p := func(rel string) string { return filepath.Join(root, rel) }
	var f Facts
	f.Model = strings.TrimSpace(string(bytes.TrimRight(deviceTree(root, "model"), "\x00")))
	f.PiRevision = piRevision(root, f.Model)
	f.Cgroup = cgroupLayout(p("sys/fs/cgroup"))
	f.MemoryCgroup = memoryEnabled(p("proc/cgroups"), p("sys/fs/cgroup/cgroup.controllers"), f.Cgroup)
	f.BootCmdline = bootCmdline(root)
	f.CmdlineDisablesMemory = cmdlineDisablesMemory(p("proc/cmdline"))
	f.Health = Health(root)
	return f
}

// deviceTree reads a device-tree property, from /proc/device-tree or, when
// /proc is not the usual one, from /sys/firmware/devicetree/base.
func deviceTree(root, prop string) []byte {
	for _, d := range []string{"proc/device-tree", "sys/firmware/devicetree/base"} {
		if b, err := os.ReadFile(filepath.Join(root, d, prop)); err == nil {
			return b
		}
	}
	return nil
}

// piRevision decodes the revision code of a Raspberry Pi: from the
// Revision line of /proc/cpuinfo (Raspberry Pi kernels), else from the
// device tree's /system/linux,revision that the firmware sets (a 32-bit
// big-endian number; mainline arm64 kernels print no Revision line). A
// board whose model is known and is not a Raspberry Pi has none: 32-bit
// ARM kernels print "Revision : 0000" on every board, and other vendors'
// kernels may print their own numbers.
func piRevision(root, model string) *Revision {
	if model != "" && !strings.HasPrefix(model, "Raspberry Pi") {
		return nil
	}
	var code string
	if file, err := os.Open(filepath.Join(root, "proc/cpuinfo")); err == nil {
		code = CpuinfoRevision(file)
		file.Close()
	}
	if code == "" {
		if b := deviceTree(root, "system/linux,revision"); len(b) == 4 {
			code = fmt.Sprintf("%04x", binary.BigEndian.Uint32(b))
		}
	}
	r, err := ParseRevision(code)
	if err != nil {
		return nil
	}
	return &r
}
