package arm

import "testing"

func TestReadPi4(t *testing.T) {
	f := Read("testdata/pi4")
	want := Facts{Model: "Raspberry Pi 4 Model B Rev 1.4", PiRevision: "c03114", Cgroup: CgroupV2, MemoryCgroup: true, TempMilliC: 48312}
	if f != want {
		t.Fatalf("got %+v\nwant %+v", f, want)
	}
}

func TestReadHybridWithMemoryControllerOff(t *testing.T) {
	f := Read("testdata/hybrid")
	if f.Cgroup != CgroupHybrid || f.MemoryCgroup || f.Model != "" {
		t.Fatalf("got %+v", f)
	}
}

func TestReadEmptyRoot(t *testing.T) {
	f := Read(t.TempDir())
	if f != (Facts{Cgroup: CgroupV1}) {
		t.Fatalf("got %+v", f)
	}
}
