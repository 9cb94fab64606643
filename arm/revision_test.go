package arm

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestParseRevision(t *testing.T) {
	for _, tc := range []struct {
		code string
		want Revision
		str  string
	}{
		{"c03114", Revision{Code: "c03114", NewStyle: true, Type: "4B", Revision: "1.4", MemoryMB: 4096, Processor: "BCM2711", Manufacturer: "Sony UK"}, "4B rev 1.4, 4 GB"},
		{"a020d3", Revision{Code: "a020d3", NewStyle: true, Type: "3B+", Revision: "1.3", MemoryMB: 1024, Processor: "BCM2837", Manufacturer: "Sony UK"}, "3B+ rev 1.3, 1 GB"},
		{"c04170", Revision{Code: "c04170", NewStyle: true, Type: "5", Revision: "1.0", MemoryMB: 4096, Processor: "BCM2712", Manufacturer: "Sony UK"}, "5 rev 1.0, 4 GB"},
		{"902120", Revision{Code: "902120", NewStyle: true, Type: "Zero 2 W", Revision: "1.0", MemoryMB: 512, Processor: "BCM2837", Manufacturer: "Sony UK"}, "Zero 2 W rev 1.0, 512 MB"},
		{"a03140", Revision{Code: "a03140", NewStyle: true, Type: "CM4", Revision: "1.0", MemoryMB: 1024, Processor: "BCM2711", Manufacturer: "Sony UK"}, "CM4 rev 1.0, 1 GB"},
		{"a22082", Revision{Code: "a22082", NewStyle: true, Type: "3B", Revision: "1.2", MemoryMB: 1024, Processor: "BCM2837", Manufacturer: "Embest"}, "3B rev 1.2, 1 GB"},
		{"d04190", Revision{Code: "d04190", NewStyle: true, Type: "500", Revision: "1.0", MemoryMB: 8192, Processor: "BCM2712", Manufacturer: "Sony UK"}, "500 rev 1.0, 8 GB"},
		// Bit 25 (warranty) and 31-29 (OTP, overvoltage) do not change the board.
		{"2a020d3", Revision{Code: "2a020d3", NewStyle: true, Type: "3B+", Revision: "1.3", MemoryMB: 1024, Processor: "BCM2837", Manufacturer: "Sony UK"}, "3B+ rev 1.3, 1 GB"},
		// A type the documentation does not list yet.
		{"e04ff1", Revision{Code: "e04ff1", NewStyle: true, Revision: "1.1", MemoryMB: 16384, Processor: "BCM2712", Manufacturer: "Sony UK"}, "rev 1.1, 16 GB"},
		{"000e", Revision{Code: "000e", Type: "B", Revision: "2.0", MemoryMB: 512, Processor: "BCM2835", Manufacturer: "Sony UK"}, "B rev 2.0, 512 MB"},
		{"0x0002", Revision{Code: "0002", Type: "B", Revision: "1.0", MemoryMB: 256, Processor: "BCM2835", Manufacturer: "Egoman"}, "B rev 1.0, 256 MB"},
		// An overvolted old board: 1000 in front.
		{"1000002", Revision{Code: "1000002", Type: "B", Revision: "1.0", MemoryMB: 256, Processor: "BCM2835", Manufacturer: "Egoman"}, "B rev 1.0, 256 MB"},
		{"0015", Revision{Code: "0015", Type: "A+", Revision: "1.1", Processor: "BCM2835", Manufacturer: "Embest"}, "A+ rev 1.1"},
		{" A020D3 ", Revision{Code: "a020d3", NewStyle: true, Type: "3B+", Revision: "1.3", MemoryMB: 1024, Processor: "BCM2837", Manufacturer: "Sony UK"}, "3B+ rev 1.3, 1 GB"},
	} {
		t.Run(tc.code, func(t *testing.T) {
			got, err := ParseRevision(tc.code)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
			if s := got.String(); s != tc.str {
				t.Errorf("String() = %q, want %q", s, tc.str)
			}
		})
	}
	for _, bad := range []string{"", "0000", "0001", "000a", "0016", "1000016", "zz", "0x", "c0311g", "123456789", "-c03114", "+c03114"} {
		if r, err := ParseRevision(bad); err == nil {
			t.Errorf("ParseRevision(%q) = %+v, want an error", bad, r)
		}
	}
}

func TestCpuinfoRevision(t *testing.T) {
	for _, tc := range []struct{ fixture, want string }{
		{"pi4", "c03114"}, {"pi3bplus", "a020d3"}, {"pi1b", "000e"}, {"pi5", "c04170"}, {"rockpi4", ""},
	} {
		b, err := os.ReadFile(filepath.Join("testdata", tc.fixture, "proc/cpuinfo"))
		if err != nil {
			t.Fatal(err)
		}
		if got := CpuinfoRevision(bytes.NewReader(b)); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.fixture, got, tc.want)
		}
	}
}

// FuzzCpuinfoRevision feeds /proc/cpuinfo texts through the revision
// parser: a code it accepts is a label-safe, lowercase hex string that
// parses to the same board again.
func FuzzCpuinfoRevision(f *testing.F) {
	for _, b := range []string{"pi4", "pi3bplus", "pi1b", "pi5", "rockpi4"} {
		data, err := os.ReadFile(filepath.Join("testdata", b, "proc/cpuinfo"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("Revision\t: 1000002\n"))
	f.Add([]byte("Revision : 0x00e04ff1\r\n"))
	f.Add([]byte("Revision\t: 0000\nRevision\t: c03114\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		code := CpuinfoRevision(bytes.NewReader(data))
		r, err := ParseRevision(code)
		if err != nil {
			return
		}
		if !validLabelValue(r.Code) || len(r.Code) > 8 {
			t.Fatalf("code %q from %q is no label value", r.Code, code)
		}
		again, err := ParseRevision(r.Code)
		if err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("%q parsed to %+v, its code %q to %+v, %v", code, r, r.Code, again, err)
		}
		if r.String() == "" || (r.NewStyle && r.Revision == "") || (!r.NewStyle && r.Type == "") {
			t.Fatalf("%q: %+v", code, r)
		}
	})
}
