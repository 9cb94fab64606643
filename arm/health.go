package arm

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Zone is one thermal zone's reading.
type Zone struct {
	// Name is the zone's directory, "thermal_zone0".
	Name string `json:"name"`
	// Type is what the zone measures, "cpu-thermal", "soc-thermal".
	Type string `json:"type,omitempty"`
	// MilliC is the temperature in thousandths of a degree Celsius.
	MilliC int `json:"milliC"`
}

// Celsius is the temperature in degrees Celsius.
func (z Zone) Celsius() float64 { return float64(z.MilliC) / 1000 }

// Throttle is the Raspberry Pi firmware's throttling bitmask, as
// `vcgencmd get_throttled` and the get_throttled sysfs file report it:
// the low bits are what is true now, bits 16-19 the same flags as
// "has occurred".
type Throttle uint32

// The flags of a Throttle.
const (
	UnderVoltageNow         Throttle = 1 << 0
	FrequencyCappedNow      Throttle = 1 << 1
	ThrottledNow            Throttle = 1 << 2
	SoftTempLimitNow        Throttle = 1 << 3
	UnderVoltageOccurred    Throttle = 1 << 16
	FrequencyCappedOccurred Throttle = 1 << 17
	ThrottledOccurred       Throttle = 1 << 18
	SoftTempLimitOccurred   Throttle = 1 << 19
)

// throttleFlags names the flags of the low half; each one's "occurred"
// bit is 16 above it.
var throttleFlags = []struct {
	bit  Throttle
	name string
}{
	{UnderVoltageNow, "under-voltage"},
	{FrequencyCappedNow, "arm-frequency-capped"},
	{ThrottledNow, "throttled"},
	{SoftTempLimitNow, "soft-temperature-limit"},
}

// Now returns the names of the flags set now, in bit order.
func (t Throttle) Now() []string { return t.names(0) }

// Occurred returns the names of the flags set as having occurred.
func (t Throttle) Occurred() []string { return t.names(16) }

func (t Throttle) names(shift uint) []string {
	var n []string
	for _, f := range throttleFlags {
		if t&(f.bit<<shift) != 0 {
			n = append(n, f.name)
		}
	}
	return n
}

// MarshalText writes the mask as vcgencmd does, "0x50005".
func (t Throttle) MarshalText() ([]byte, error) {
	return []byte(fmt.Sprintf("%#x", uint32(t))), nil
}

// UnmarshalText reads what ParseThrottled reads.
func (t *Throttle) UnmarshalText(b []byte) error {
	v, err := ParseThrottled(b)
	if err != nil {
		return err
	}
	*t = v
	return nil
}

// ParseThrottled reads a throttling mask: the get_throttled sysfs file's
// "50005\n", or vcgencmd's "throttled=0x50005".
func ParseThrottled(b []byte) (Throttle, error) {
	s := strings.TrimSpace(string(b))
	s = strings.TrimPrefix(s, "throttled=")
	h := strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
	if h == "" || len(h) > 8 {
		return 0, fmt.Errorf("throttled value %q: not a 32-bit hex number", s)
	}
	v, err := strconv.ParseUint(h, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("throttled value %q: not a 32-bit hex number", s)
	}
	return Throttle(v), nil
}

// Readings are the board's health sensors at one moment. What the board
// does not have is nil or empty.
type Readings struct {
	// Zones are the thermal zones that could be read, in zone order.
	Zones []Zone `json:"zones,omitempty"`
	// Throttle is the Raspberry Pi firmware's get_throttled mask.
	Throttle *Throttle `json:"throttle,omitempty"`
	// UnderVoltageAlarm is the rpi_volt hwmon's in0_lcrit_alarm: the
	// kernel's Raspberry Pi voltage driver polls the firmware every 2 s
	// and sets it when under-voltage was seen since its last poll.
	UnderVoltageAlarm *bool `json:"underVoltageAlarm,omitempty"`
}

// Hottest returns the zone with the highest temperature.
func (r Readings) Hottest() (Zone, bool) {
	if len(r.Zones) == 0 {
		return Zone{}, false
	}
	return slices.MaxFunc(r.Zones, func(a, b Zone) int { return cmp.Compare(a.MilliC, b.MilliC) }), true
}

// UnderVoltage reports whether the supply voltage is too low now, by
// either source.
func (r Readings) UnderVoltage() bool {
	return (r.Throttle != nil && *r.Throttle&UnderVoltageNow != 0) || (r.UnderVoltageAlarm != nil && *r.UnderVoltageAlarm)
}

// The Raspberry Pi firmware's get_throttled file: its documented path
// (on a board whose bus node is named "soc"), and through the firmware
// driver's directory, which links to the device wherever it sits.
const (
	getThrottledPath = "sys/devices/platform/soc/soc:firmware/get_throttled"
	getThrottledGlob = "sys/bus/platform/drivers/raspberrypi-firmware/*/get_throttled"
)

// Health reads the board's sensors from the file system rooted at root:
// every /sys/class/thermal/thermal_zone*/temp (with its type), the
// rpi_volt hwmon's in0_lcrit_alarm and, only on a kernel without that
// hwmon, the Raspberry Pi firmware's get_throttled file. A sensor that
// cannot be read is left out.
//
// Kernels with the rpi_volt hwmon mark get_throttled deprecated: reading
// it logs a "use hwmon sysfs instead" warning with a stack trace and
// taints the kernel, which an agent must not do to a board. So there the
// throttling and soft-temperature-limit flags are not read (the firmware
// mailbox, as vcgencmd uses, would give them) and under-voltage comes from
// the hwmon. On older kernels get_throttled is the only source; it shows
// the value the kernel last fetched from the firmware.
func Health(root string) Readings {
	var r Readings
	dirs, _ := filepath.Glob(filepath.Join(root, "sys/class/thermal/thermal_zone*"))
	for _, d := range dirs {
		name := filepath.Base(d)
		if _, err := strconv.Atoi(strings.TrimPrefix(name, "thermal_zone")); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "temp"))
		if err != nil {
			continue // a disabled sensor fails with EINVAL or ENODATA
		}
		mc, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			continue
		}
		z := Zone{Name: name, MilliC: mc}
		if t, err := os.ReadFile(filepath.Join(d, "type")); err == nil {
			z.Type = strings.TrimSpace(string(t))
		}
		r.Zones = append(r.Zones, z)
	}
	slices.SortFunc(r.Zones, func(a, b Zone) int { return cmp.Compare(zoneIndex(a.Name), zoneIndex(b.Name)) })

	hwmons, _ := filepath.Glob(filepath.Join(root, "sys/class/hwmon/hwmon*"))
	for _, d := range hwmons {
		if n, err := os.ReadFile(filepath.Join(d, "name")); err != nil || strings.TrimSpace(string(n)) != "rpi_volt" {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(d, "in0_lcrit_alarm")); err == nil {
			if v := strings.TrimSpace(string(b)); v == "0" || v == "1" {
				alarm := v == "1"
				r.UnderVoltageAlarm = &alarm
				break
			}
		}
	}
	if r.UnderVoltageAlarm != nil {
		return r // see above: get_throttled would warn and taint
	}
	paths := []string{filepath.Join(root, getThrottledPath)}
	more, _ := filepath.Glob(filepath.Join(root, getThrottledGlob))
	for _, p := range append(paths, more...) {
		if b, err := os.ReadFile(p); err == nil {
			if t, err := ParseThrottled(b); err == nil {
				r.Throttle = &t
				break
			}
		}
	}

	return r
}

func zoneIndex(name string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(name, "thermal_zone"))
	return n
}

// HighTempMilliC is the zone temperature from which HighTemperature is
// true: where the Raspberry Pi 4 and 5 firmware starts throttling the ARM
// cores. The firmware's soft temperature limit flag (60 °C by default on
// the 3B+) also makes it true.
const HighTempMilliC = 80000

// Condition types, for the node's status.
const (
	ConditionUnderVoltage    = "UnderVoltage"
	ConditionThrottled       = "Throttled"
	ConditionHighTemperature = "HighTemperature"
)

// Condition is one health condition of the board, in the shape of a
// node condition: Status true means the problem is there now.
type Condition struct {
	Type    string `json:"type"`
	Status  bool   `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Conditions turns readings into conditions. A condition is left out when
// nothing it depends on was read: UnderVoltage needs get_throttled or the
// rpi_volt alarm, Throttled needs get_throttled, HighTemperature needs a
// thermal zone or get_throttled. HighTemperature is true when a zone is at
// or above HighTempMilliC or the soft temperature limit flag is set now.
func Conditions(r Readings) []Condition {
	var cs []Condition
	var t Throttle
	if r.Throttle != nil {
		t = *r.Throttle
	}
	if r.Throttle != nil || r.UnderVoltageAlarm != nil {
		c := Condition{Type: ConditionUnderVoltage, Reason: "VoltageNormal", Message: "the supply voltage is sufficient"}
		switch {
		case r.UnderVoltage():
			c.Status, c.Reason = true, "UnderVoltageNow"
			c.Message = "the supply voltage is too low now: use the board's recommended power supply and a short, thick cable"
		case t&UnderVoltageOccurred != 0:
			c.Reason = "UnderVoltageOccurred"
			c.Message = "the supply voltage was too low recently but is sufficient now: the power supply or its cable is marginal"
		}
		cs = append(cs, c)
	}
	if r.Throttle != nil {
		c := Condition{Type: ConditionThrottled, Reason: "NotThrottled", Message: "the ARM cores run at full speed"}
		switch {
		case t&ThrottledNow != 0:
			c.Status, c.Reason = true, "ThrottledNow"
			c.Message = "the firmware is throttling the ARM cores now (" + strings.Join(t.Now(), ", ") + ")"
		case t&FrequencyCappedNow != 0:
			c.Status, c.Reason = true, "FrequencyCappedNow"
			c.Message = "the firmware caps the ARM frequency now (" + strings.Join(t.Now(), ", ") + ")"
		case t&(ThrottledOccurred|FrequencyCappedOccurred) != 0:
			c.Reason = "ThrottlingOccurred"
			c.Message = "the ARM cores were throttled or capped recently (" + strings.Join(t.Occurred(), ", ") + ") but run at full speed now"
		}
		cs = append(cs, c)
	}
	if hot, ok := r.Hottest(); ok || r.Throttle != nil {
		c := Condition{Type: ConditionHighTemperature, Reason: "TemperatureNormal", Message: "the soft temperature limit is not reached"}
		if ok {
			c.Message = fmt.Sprintf("the hottest zone, %s, is %.1f °C, below %d °C", zoneLabel(hot), hot.Celsius(), HighTempMilliC/1000)
		}
		switch {
		case ok && hot.MilliC >= HighTempMilliC:
			c.Status, c.Reason = true, "ZoneTooHot"
			c.Message = fmt.Sprintf("%s is %.1f °C, at or above %d °C: the board needs cooling", zoneLabel(hot), hot.Celsius(), HighTempMilliC/1000)
		case t&SoftTempLimitNow != 0:
			c.Status, c.Reason = true, "SoftTemperatureLimit"
			c.Message = "the firmware's soft temperature limit is active: the board needs cooling"
		}
		cs = append(cs, c)
	}
	return cs
}

func zoneLabel(z Zone) string {
	if z.Type == "" {
		return z.Name
	}
	return z.Name + " (" + z.Type + ")"
}

// Label is one metric label.
type Label struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Sample is one metric sample, in the shape of a Prometheus gauge.
type Sample struct {
	Name   string  `json:"name"`
	Labels []Label `json:"labels,omitempty"`
	Value  float64 `json:"value"`
}

// Metric names.
const (
	MetricTemperature       = "outpost_board_temperature_celsius"
	MetricThrottleFlag      = "outpost_board_throttle_flag"
	MetricUnderVoltageAlarm = "outpost_board_under_voltage_alarm"
)

// Metrics turns readings into samples: the temperature of each zone
// (labels zone and type), each get_throttled flag as 0 or 1 (labels flag,
// the names of Throttle.Now, and state, "now" or "occurred"), and the
// rpi_volt alarm as 0 or 1. What was not read has no samples.
func Metrics(r Readings) []Sample {
	var ss []Sample
	for _, z := range r.Zones {
		ss = append(ss, Sample{Name: MetricTemperature, Labels: []Label{{"zone", z.Name}, {"type", z.Type}}, Value: z.Celsius()})
	}
	if r.Throttle != nil {
		for _, state := range []struct {
			name  string
			shift uint
		}{{"now", 0}, {"occurred", 16}} {
			for _, f := range throttleFlags {
				ss = append(ss, Sample{
					Name:   MetricThrottleFlag,
					Labels: []Label{{"flag", f.name}, {"state", state.name}},
					Value:  boolValue(*r.Throttle&(f.bit<<state.shift) != 0),
				})
			}
		}
	}
	if r.UnderVoltageAlarm != nil {
		ss = append(ss, Sample{Name: MetricUnderVoltageAlarm, Value: boolValue(*r.UnderVoltageAlarm)})
	}
	return ss
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
