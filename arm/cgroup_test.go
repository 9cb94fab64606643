package arm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMemoryCgroupError(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    Facts
		want string // the whole message; "" for no error
	}{
		{"pi4 on", Read(fixture(t, "pi4")), ""},
		{"pi3bplus off, Buster's cmdline.txt", Read(fixture(t, "pi3bplus")),
			"memory cgroup controller is off, so pod memory limits are not enforced: " +
				"add cgroup_enable=memory cgroup_memory=1 to the single line of /boot/cmdline.txt, then reboot"},
		{"Bookworm", Facts{Model: "Raspberry Pi 4 Model B Rev 1.5", Cgroup: CgroupV2, BootCmdline: CmdlineFirmware},
			"memory cgroup controller is off, so pod memory limits are not enforced: " +
				"add cgroup_enable=memory cgroup_memory=1 to the single line of /boot/firmware/cmdline.txt, then reboot"},
		{"Pi, boot partition not mounted", Facts{Model: "Raspberry Pi 3 Model B Rev 1.2", Cgroup: CgroupV2},
			"memory cgroup controller is off, so pod memory limits are not enforced: " +
				"add cgroup_enable=memory cgroup_memory=1 to the single line of /boot/firmware/cmdline.txt " +
				"(/boot/cmdline.txt before Raspberry Pi OS Bookworm), then reboot"},
		{"other board, disabled on the command line", Facts{Model: "Radxa ROCK Pi 4B", Cgroup: CgroupV2, CmdlineDisablesMemory: true},
			"memory cgroup controller is off, so pod memory limits are not enforced: " +
				"add cgroup_enable=memory cgroup_memory=1 to the kernel command line in the boot loader's configuration " +
				"and remove cgroup_disable=memory from it, then reboot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.f.MemoryCgroupError()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("got %v, want none", err)
				}
				return
			}
			var me *MemoryCgroupError
			if !errors.As(err, &me) {
				t.Fatalf("got %T %v", err, err)
			}
			if err.Error() != tc.want {
				t.Errorf("got  %s\nwant %s", err, tc.want)
			}
			if !strings.HasSuffix(err.Error(), me.Fix()) {
				t.Errorf("message %q does not end with the fix %q", err, me.Fix())
			}
		})
	}
}

func TestMemoryEnabled(t *testing.T) {
	const header = "#subsys_name\thierarchy\tnum_cgroups\tenabled\n"
	for _, tc := range []struct {
		name, layout, procCgroups, controllers string
		want                                   bool
	}{
		{"v2 with memory", CgroupV2, header + "memory\t0\t60\t1\n", "cpuset cpu io memory pids\n", true},
		{"v2 without memory", CgroupV2, header + "memory\t0\t60\t0\n", "cpuset cpu io pids\n", false},
		{"v2 memory last, no newline", CgroupV2, "", "cpu memory", true},
		{"v2 a longer name is not memory", CgroupV2, "", "cpu memoryx", false},
		{"v1 on", CgroupV1, header + "memory\t3\t71\t1\n", "", true},
		{"v1 off", CgroupV1, header + "memory\t0\t71\t0\n", "", false},
		{"hybrid, memory on the v2 mount only", CgroupHybrid, header + "memory\t0\t71\t1\n", "memory\n", false},
		{"v1, kernel without memcg", CgroupV1, header + "cpu\t3\t71\t1\n", "", false},
		{"v1, no /proc/cgroups", CgroupV1, "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			pc, cc := filepath.Join(dir, "cgroups"), filepath.Join(dir, "cgroup.controllers")
			if tc.procCgroups != "" {
				os.WriteFile(pc, []byte(tc.procCgroups), 0o644)
			}
			if tc.controllers != "" {
				os.WriteFile(cc, []byte(tc.controllers), 0o644)
			}
			if got := memoryEnabled(pc, cc, tc.layout); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCmdlineDisablesMemory(t *testing.T) {
	for line, want := range map[string]bool{
		"console=tty1 cgroup_disable=memory rootwait\n": true,
		"cgroup_disable=cpuset,memory":                  true,
		"cgroup_disable=cpuset cgroup_enable=memory":    false,
		"xcgroup_disable=memory":                        false,
		"":                                              false,
	} {
		p := filepath.Join(t.TempDir(), "cmdline")
		os.WriteFile(p, []byte(line), 0o644)
		if got := cmdlineDisablesMemory(p); got != want {
			t.Errorf("%q: got %v, want %v", line, got, want)
		}
	}
}
