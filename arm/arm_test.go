package arm

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// fixture copies testdata/name to a temporary root and returns it. Module
// zips allow no ":" in file names, so the sysfs names that have one (the
// firmware's "soc:firmware") are stored with "%3A" in its place.
func fixture(t *testing.T, name string) string {
	t.Helper()
	src := filepath.Join("testdata", name)
	root := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		dst := filepath.Join(root, strings.ReplaceAll(rel, "%3A", ":"))
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func throttle(t Throttle) *Throttle { return &t }
func alarm(b bool) *bool            { return &b }

func TestRead(t *testing.T) {
	for _, tc := range []struct {
		fixture string
		want    Facts
	}{{
		fixture: "pi4",
		want: Facts{
			Model: "Raspberry Pi 4 Model B Rev 1.4",
			PiRevision: &Revision{Code: "c03114", NewStyle: true, Type: "4B", Revision: "1.4", MemoryMB: 4096,
				Processor: "BCM2711", Manufacturer: "Sony UK"},
			Cgroup: CgroupV2, MemoryCgroup: true, BootCmdline: CmdlineFirmware,
			Health: Readings{
				Zones: []Zone{{Name: "thermal_zone0", Type: "cpu-thermal", MilliC: 48312}},
				// The kernel has rpi_volt, so get_throttled (deprecated
				// there: reading it warns and taints) is not read.
				UnderVoltageAlarm: alarm(false),
			},
		},
	}, {
		fixture: "pi3bplus",
		want: Facts{
			Model: "Raspberry Pi 3 Model B Plus Rev 1.3",
			PiRevision: &Revision{Code: "a020d3", NewStyle: true, Type: "3B+", Revision: "1.3", MemoryMB: 1024,
				Processor: "BCM2837", Manufacturer: "Sony UK"},
			Cgroup: CgroupHybrid, MemoryCgroup: false, BootCmdline: CmdlineBoot,
			Health: Readings{
				// An older kernel: no rpi_volt hwmon, so get_throttled.
				Zones:    []Zone{{Name: "thermal_zone0", Type: "cpu-thermal", MilliC: 61224}},
				Throttle: throttle(0x50005),
			},
		},
	}, {
		fixture: "pi1b",
		want: Facts{
			Model:      "Raspberry Pi Model B Rev 2",
			PiRevision: &Revision{Code: "000e", Type: "B", Revision: "2.0", MemoryMB: 512, Processor: "BCM2835", Manufacturer: "Sony UK"},
			Cgroup:     CgroupV1, MemoryCgroup: true, BootCmdline: CmdlineBoot,
			Health: Readings{Zones: []Zone{{Name: "thermal_zone0", Type: "cpu-thermal", MilliC: 45464}}},
		},
	}, {
		fixture: "pi5",
		want: Facts{
			Model: "Raspberry Pi 5 Model B Rev 1.0",
			PiRevision: &Revision{Code: "c04170", NewStyle: true, Type: "5", Revision: "1.0", MemoryMB: 4096,
				Processor: "BCM2712", Manufacturer: "Sony UK"},
			Cgroup: CgroupV2, MemoryCgroup: true, BootCmdline: CmdlineFirmware,
			Health: Readings{
				Zones:             []Zone{{Name: "thermal_zone0", Type: "cpu-thermal", MilliC: 81550}},
				UnderVoltageAlarm: alarm(false),
			},
		},
	}, {
		fixture: "rockpi4",
		want: Facts{
			Model:  "Radxa ROCK Pi 4B",
			Cgroup: CgroupV2, MemoryCgroup: true,
			Health: Readings{Zones: []Zone{
				{Name: "thermal_zone0", Type: "soc-thermal", MilliC: 42222},
				{Name: "thermal_zone1", Type: "gpu-thermal", MilliC: 40555},
			}},
		},
	}, {
		fixture: "hybrid",
		want:    Facts{Cgroup: CgroupHybrid},
	}} {
		t.Run(tc.fixture, func(t *testing.T) {
			got := Read(fixture(t, tc.fixture))
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %s\nwant %s", dump(got), dump(tc.want))
			}
		})
	}
}

// dump shows facts with what their pointers point to.
func dump(f Facts) string {
	b, _ := json.Marshal(f)
	return string(b)
}

func TestReadEmptyRoot(t *testing.T) {
	f := Read(t.TempDir())
	if !reflect.DeepEqual(f, Facts{Cgroup: CgroupV1}) {
		t.Fatalf("got %+v", f)
	}
	if f.Labels() != nil {
		t.Errorf("labels %v, want none", f.Labels())
	}
}

// A mainline arm64 kernel prints no Revision line; the firmware's
// device-tree property still has the code.
func TestReadRevisionFromDeviceTree(t *testing.T) {
	root := t.TempDir()
	for p, b := range map[string]string{
		"proc/device-tree/model":                 "Raspberry Pi 4 Model B\x00",
		"proc/device-tree/system/linux,revision": "\x00\xc0\x31\x14",
		"proc/cpuinfo":                           "processor\t: 0\nBogoMIPS\t: 108.00\nCPU revision\t: 3\n",
	} {
		os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(root, p), []byte(b), 0o644)
	}
	f := Read(root)
	if f.PiRevision == nil || f.PiRevision.Code != "c03114" || f.PiRevision.Type != "4B" {
		t.Fatalf("got %+v", f.PiRevision)
	}
}

// 32-bit ARM kernels print "Revision : 0000" on boards that set none; on
// a board whose model is not a Raspberry Pi no line is taken for a code.
func TestReadOtherBoardsRevisionLineIsNotPi(t *testing.T) {
	for _, tc := range []struct{ model, revision string }{
		{"Hardkernel ODROID-XU4\x00", "0000"},
		{"Radxa ROCK Pi 4B\x00", "a02082"}, // a vendor kernel's own number
		{"", "0000"},
	} {
		root := t.TempDir()
		os.MkdirAll(filepath.Join(root, "proc/device-tree"), 0o755)
		if tc.model != "" {
			os.WriteFile(filepath.Join(root, "proc/device-tree/model"), []byte(tc.model), 0o644)
		}
		os.WriteFile(filepath.Join(root, "proc/cpuinfo"), []byte("Hardware\t: SAMSUNG EXYNOS\nRevision\t: "+tc.revision+"\n"), 0o644)
		f := Read(root)
		if f.PiRevision != nil || f.IsPi() {
			t.Errorf("model %q revision %s: got %+v", tc.model, tc.revision, f.PiRevision)
		}
		if _, ok := f.Labels()[LabelBoardRevision]; ok {
			t.Errorf("model %q: revision label %v", tc.model, f.Labels())
		}
	}
}
