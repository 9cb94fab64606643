package arm

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Revision is a decoded Raspberry Pi revision code, as documented in
// "Raspberry Pi revision codes" (raspberrypi.com/documentation, computers,
// raspberry-pi.html#raspberry-pi-revision-codes). Unknown parts are empty
// or zero.
type Revision struct {
	// Code is the code as /proc/cpuinfo shows it, lowercase hex without
	// 0x: "c03114", "a020d3", "000e".
	Code string `json:"code"`
	// NewStyle reports whether the code is bit-packed (bit 23 set), as on
	// every board since the Pi 2; older boards have sequential codes.
	NewStyle bool `json:"newStyle"`
	// Type is the board type as the documentation names it: "B", "3B+",
	// "4B", "Zero 2 W", "CM4", "5".
	Type string `json:"type,omitempty"`
	// Revision is the board revision, "1.4".
	Revision string `json:"revision,omitempty"`
	// MemoryMB is the memory size; 0 when the code does not say (0015 is
	// documented as "256MB/512MB").
	MemoryMB int `json:"memoryMB,omitempty"`
	// Processor is the SoC: BCM2835, BCM2836, BCM2837, BCM2711 or BCM2712.
	Processor string `json:"processor,omitempty"`
	// Manufacturer is who made the board: "Sony UK", "Embest", ...
	Manufacturer string `json:"manufacturer,omitempty"`
}

// Memory is the memory size for people: "512 MB", "4 GB"; empty when
// unknown.
func (r Revision) Memory() string {
	switch {
	case r.MemoryMB == 0:
		return ""
	case r.MemoryMB < 1024:
		return fmt.Sprintf("%d MB", r.MemoryMB)
	}
	return fmt.Sprintf("%d GB", r.MemoryMB/1024)
}

// String is the short form `outpost status` shows: "4B rev 1.4, 4 GB".
func (r Revision) String() string {
	parts := []string{}
	if r.Type != "" {
		parts = append(parts, r.Type)
	}
	if r.Revision != "" {
		parts = append(parts, "rev "+r.Revision)
	}
	s := strings.Join(parts, " ")
	if m := r.Memory(); m != "" {
		if s != "" {
			s += ", "
		}
		s += m
	}
	if s == "" {
		return "revision " + r.Code
	}
	return s
}

// The fields of a new-style code: NOQuuuWuFMMMCCCCPPPPTTTTTTTTRRRR.
const (
	revNewFlag     = 1 << 23
	revOldWarranty = 1 << 24 // old-style codes of overvolted boards get 1000 in front
)

// newMemoryMB is MMM (bits 20-22).
var newMemoryMB = []int{256, 512, 1024, 2048, 4096, 8192, 16384}

// newManufacturers is CCCC (bits 16-19).
var newManufacturers = []string{"Sony UK", "Egoman", "Embest", "Sony Japan", "Embest", "Stadium"}

// newProcessors is PPPP (bits 12-15).
var newProcessors = []string{"BCM2835", "BCM2836", "BCM2837", "BCM2711", "BCM2712"}

// newTypes is TTTTTTTT (bits 4-11); the gaps are not documented.
var newTypes = map[uint32]string{
	0x00: "A", 0x01: "B", 0x02: "A+", 0x03: "B+", 0x04: "2B", 0x05: "Alpha", 0x06: "CM1",
	0x08: "3B", 0x09: "Zero", 0x0a: "CM3", 0x0c: "Zero W", 0x0d: "3B+", 0x0e: "3A+",
	0x0f: "Internal use only", 0x10: "CM3+", 0x11: "4B", 0x12: "Zero 2 W", 0x13: "400",
	0x14: "CM4", 0x15: "CM4S", 0x16: "Internal use only", 0x17: "5", 0x18: "CM5",
	0x19: "500", 0x1a: "CM5 Lite",
}

// oldCodes are the documented old-style codes, 0002 to 0015, all BCM2835.
var oldCodes = map[uint32]Revision{
	0x02: {Type: "B", Revision: "1.0", MemoryMB: 256, Manufacturer: "Egoman"},
	0x03: {Type: "B", Revision: "1.0", MemoryMB: 256, Manufacturer: "Egoman"},
	0x04: {Type: "B", Revision: "2.0", MemoryMB: 256, Manufacturer: "Sony UK"},
	0x05: {Type: "B", Revision: "2.0", MemoryMB: 256, Manufacturer: "Qisda"},
	0x06: {Type: "B", Revision: "2.0", MemoryMB: 256, Manufacturer: "Egoman"},
	0x07: {Type: "A", Revision: "2.0", MemoryMB: 256, Manufacturer: "Egoman"},
	0x08: {Type: "A", Revision: "2.0", MemoryMB: 256, Manufacturer: "Sony UK"},
	0x09: {Type: "A", Revision: "2.0", MemoryMB: 256, Manufacturer: "Qisda"},
	0x0d: {Type: "B", Revision: "2.0", MemoryMB: 512, Manufacturer: "Egoman"},
	0x0e: {Type: "B", Revision: "2.0", MemoryMB: 512, Manufacturer: "Sony UK"},
	0x0f: {Type: "B", Revision: "2.0", MemoryMB: 512, Manufacturer: "Egoman"},
	0x10: {Type: "B+", Revision: "1.2", MemoryMB: 512, Manufacturer: "Sony UK"},
	0x11: {Type: "CM1", Revision: "1.0", MemoryMB: 512, Manufacturer: "Sony UK"},
	0x12: {Type: "A+", Revision: "1.1", MemoryMB: 256, Manufacturer: "Sony UK"},
	0x13: {Type: "B+", Revision: "1.2", MemoryMB: 512, Manufacturer: "Embest"},
	0x14: {Type: "CM1", Revision: "1.0", MemoryMB: 512, Manufacturer: "Embest"},
	0x15: {Type: "A+", Revision: "1.1", Manufacturer: "Embest"}, // 256MB/512MB
}

// errNotRevision is returned for a code that is neither new-style nor a
// documented old-style code, such as the "0000" every 32-bit ARM kernel
// prints for boards that set no revision.
var errNotRevision = errors.New("not a Raspberry Pi revision code")

// ParseRevision decodes a revision code as /proc/cpuinfo shows it
// ("c03114", "000e", "1000002" for an overvolted old board); a leading 0x
// is allowed. New-style codes decode field by field, with Type empty for a
// type the documentation does not list; old-style codes must be in the
// documented table.
func ParseRevision(code string) (Revision, error) {
	s := strings.ToLower(strings.TrimSpace(code))
	s = strings.TrimPrefix(s, "0x")
	if s == "" || len(s) > 8 {
		return Revision{}, fmt.Errorf("revision code %q: %w", code, errNotRevision)
	}
	v, err := strconv.ParseUint(s, 16, 32)
	if err != nil {
		return Revision{}, fmt.Errorf("revision code %q: %w", code, errNotRevision)
	}
	c := uint32(v)
	if c&revNewFlag == 0 {
		r, ok := oldCodes[c&^revOldWarranty]
		if !ok {
			return Revision{}, fmt.Errorf("revision code %q: %w", code, errNotRevision)
		}
		r.Code, r.Processor = s, "BCM2835"
		return r, nil
	}
	r := Revision{Code: s, NewStyle: true, Type: newTypes[c>>4&0xff], Revision: fmt.Sprintf("1.%d", c&0xf)}
	if m := c >> 20 & 0x7; int(m) < len(newMemoryMB) {
		r.MemoryMB = newMemoryMB[m]
	}
	if m := c >> 16 & 0xf; int(m) < len(newManufacturers) {
		r.Manufacturer = newManufacturers[m]
	}
	if p := c >> 12 & 0xf; int(p) < len(newProcessors) {
		r.Processor = newProcessors[p]
	}
	return r, nil
}

// CpuinfoRevision returns the value of the "Revision" line of
// /proc/cpuinfo, the board's revision code on Raspberry Pi kernels (and
// "0000" for most other boards on 32-bit ARM kernels); "" when there is
// none. "CPU revision" lines are not it.
func CpuinfoRevision(r io.Reader) string {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "Revision" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
