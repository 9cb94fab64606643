package arm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestParseThrottled(t *testing.T) {
	for in, want := range map[string]Throttle{
		"0\n":                 0,
		"50005\n":             UnderVoltageNow | ThrottledNow | UnderVoltageOccurred | ThrottledOccurred,
		"80008":               SoftTempLimitNow | SoftTempLimitOccurred,
		"throttled=0x50000\n": UnderVoltageOccurred | ThrottledOccurred,
		"0xe000F":             0xe000f,
		" 2 ":                 FrequencyCappedNow,
		"ffffffff":            0xffffffff,
	} {
		got, err := ParseThrottled([]byte(in))
		if err != nil || got != want {
			t.Errorf("ParseThrottled(%q) = %#x, %v; want %#x", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "\n", "0x", "throttled=", "zz", "-1", "+5", "1_0", "100000000", "50005 50005"} {
		if got, err := ParseThrottled([]byte(bad)); err == nil {
			t.Errorf("ParseThrottled(%q) = %#x, want an error", bad, got)
		}
	}
}

func TestThrottleNames(t *testing.T) {
	th := Throttle(0x50005)
	if got := strings.Join(th.Now(), ","); got != "under-voltage,throttled" {
		t.Errorf("Now() = %s", got)
	}
	if got := strings.Join(th.Occurred(), ","); got != "under-voltage,throttled" {
		t.Errorf("Occurred() = %s", got)
	}
	if Throttle(0).Now() != nil {
		t.Errorf("no flags gave names")
	}
}

// Zones are read in their number's order, and those that cannot be read
// are left out.
func TestHealthZones(t *testing.T) {
	root := t.TempDir()
	for p, b := range map[string]string{
		"thermal_zone0/temp":   "41000\n",
		"thermal_zone0/type":   "cpu-thermal\n",
		"thermal_zone10/temp":  "39000\n",
		"thermal_zone2/temp":   "-5000\n", // a board outside in winter
		"thermal_zone3/type":   "disabled\n",
		"thermal_zone4/temp":   "n/a\n",
		"cooling_device0/type": "fan\n",
	} {
		os.MkdirAll(filepath.Join(root, "sys/class/thermal", filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(root, "sys/class/thermal", p), []byte(b), 0o644)
	}
	got := Health(root)
	want := Readings{Zones: []Zone{
		{Name: "thermal_zone0", Type: "cpu-thermal", MilliC: 41000},
		{Name: "thermal_zone2", MilliC: -5000},
		{Name: "thermal_zone10", MilliC: 39000},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if hot, _ := got.Hottest(); hot.Name != "thermal_zone0" {
		t.Errorf("hottest %+v", hot)
	}
}

// The firmware driver's directory links to the device wherever it sits.
func TestHealthThrottledThroughDriverLink(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "sys/bus/platform/drivers/raspberrypi-firmware/soc@107c000000:firmware")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "get_throttled"), []byte("8\n"), 0o644)
	r := Health(root)
	if r.Throttle == nil || *r.Throttle != SoftTempLimitNow {
		t.Fatalf("got %+v", r)
	}
}

func TestConditions(t *testing.T) {
	cond := func(typ string, status bool, reason string) Condition {
		return Condition{Type: typ, Status: status, Reason: reason}
	}
	for _, tc := range []struct {
		name string
		r    Readings
		want []Condition // messages are checked apart
	}{
		{"pi4, rpi_volt so no get_throttled", Read(fixture(t, "pi4")).Health, []Condition{
			cond(ConditionUnderVoltage, false, "VoltageNormal"),
			cond(ConditionHighTemperature, false, "TemperatureNormal"),
		}},
		{"under-voltage at boot only", Readings{Throttle: throttle(UnderVoltageOccurred | ThrottledOccurred)}, []Condition{
			cond(ConditionUnderVoltage, false, "UnderVoltageOccurred"),
			cond(ConditionThrottled, false, "ThrottlingOccurred"),
			cond(ConditionHighTemperature, false, "TemperatureNormal"),
		}},
		{"pi3bplus, under-voltage now", Read(fixture(t, "pi3bplus")).Health, []Condition{
			cond(ConditionUnderVoltage, true, "UnderVoltageNow"),
			cond(ConditionThrottled, true, "ThrottledNow"),
			cond(ConditionHighTemperature, false, "TemperatureNormal"),
		}},
		{"pi5, hot, rpi_volt only", Read(fixture(t, "pi5")).Health, []Condition{
			cond(ConditionUnderVoltage, false, "VoltageNormal"),
			cond(ConditionHighTemperature, true, "ZoneTooHot"),
		}},
		{"pi1b, zones only", Read(fixture(t, "pi1b")).Health, []Condition{
			cond(ConditionHighTemperature, false, "TemperatureNormal"),
		}},
		{"rockpi4, zones only", Read(fixture(t, "rockpi4")).Health, []Condition{
			cond(ConditionHighTemperature, false, "TemperatureNormal"),
		}},
		{"soft temperature limit, no zones", Readings{Throttle: throttle(0x80008)}, []Condition{
			cond(ConditionUnderVoltage, false, "VoltageNormal"),
			cond(ConditionThrottled, false, "NotThrottled"),
			cond(ConditionHighTemperature, true, "SoftTemperatureLimit"),
		}},
		{"frequency capped", Readings{Throttle: throttle(0x20002)}, []Condition{
			cond(ConditionUnderVoltage, false, "VoltageNormal"),
			cond(ConditionThrottled, true, "FrequencyCappedNow"),
			cond(ConditionHighTemperature, false, "TemperatureNormal"),
		}},
		{"rpi_volt alarm with a clean get_throttled", Readings{Throttle: throttle(0), UnderVoltageAlarm: alarm(true)}, []Condition{
			cond(ConditionUnderVoltage, true, "UnderVoltageNow"),
			cond(ConditionThrottled, false, "NotThrottled"),
			cond(ConditionHighTemperature, false, "TemperatureNormal"),
		}},
		{"exactly 80 °C", Readings{Zones: []Zone{{Name: "thermal_zone0", MilliC: HighTempMilliC}}}, []Condition{
			cond(ConditionHighTemperature, true, "ZoneTooHot"),
		}},
		{"nothing read", Readings{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Conditions(tc.r)
			for i := range got {
				if got[i].Message == "" {
					t.Errorf("%s has no message", got[i].Type)
				}
				got[i].Message = ""
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
	msgs := map[string]string{}
	for _, c := range Conditions(Read(fixture(t, "pi5")).Health) {
		msgs[c.Type] = c.Message
	}
	if want := "thermal_zone0 (cpu-thermal) is 81.5 °C, at or above 80 °C: the board needs cooling"; msgs[ConditionHighTemperature] != want {
		t.Errorf("message %q, want %q", msgs[ConditionHighTemperature], want)
	}
}

func TestMetrics(t *testing.T) {
	got := Metrics(Read(fixture(t, "pi3bplus")).Health)
	var lines []string
	for _, s := range got {
		var l []string
		for _, lb := range s.Labels {
			l = append(l, lb.Name+"="+lb.Value)
		}
		lines = append(lines, s.Name+"{"+strings.Join(l, ",")+"} "+strconv.FormatFloat(s.Value, 'g', -1, 64))
	}
	want := []string{
		"outpost_board_temperature_celsius{zone=thermal_zone0,type=cpu-thermal} 61.224",
		"outpost_board_throttle_flag{flag=under-voltage,state=now} 1",
		"outpost_board_throttle_flag{flag=arm-frequency-capped,state=now} 0",
		"outpost_board_throttle_flag{flag=throttled,state=now} 1",
		"outpost_board_throttle_flag{flag=soft-temperature-limit,state=now} 0",
		"outpost_board_throttle_flag{flag=under-voltage,state=occurred} 1",
		"outpost_board_throttle_flag{flag=arm-frequency-capped,state=occurred} 0",
		"outpost_board_throttle_flag{flag=throttled,state=occurred} 1",
		"outpost_board_throttle_flag{flag=soft-temperature-limit,state=occurred} 0",
	}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	if m := Metrics(Readings{}); m != nil {
		t.Errorf("no readings gave %v", m)
	}
}

// The agent sends the facts to `outpost status` as JSON; they must come
// back the same.
func TestFactsJSONRoundTrip(t *testing.T) {
	for _, name := range []string{"pi4", "pi3bplus", "pi1b", "pi5", "rockpi4", "hybrid"} {
		f := Read(fixture(t, name))
		b, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		var back Facts
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, b)
		}
		if !reflect.DeepEqual(back, f) {
			t.Errorf("%s: got back %s\nfrom %s", name, dump(back), b)
		}
	}
	var r Readings
	if err := json.Unmarshal([]byte(`{"throttle":"0xzz"}`), &r); err == nil {
		t.Errorf("a bad throttle value decoded to %v", *r.Throttle)
	}
}

// FuzzParseThrottled feeds get_throttled texts through the parser: what
// it accepts prints back to the same mask, and every condition and metric
// can be made from it.
func FuzzParseThrottled(f *testing.F) {
	for _, s := range []string{"0\n", "50005\n", "80008\n", "throttled=0x50000", "e000f", "0xffffffff", "", "zz", "100000000"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		th, err := ParseThrottled(data)
		if err != nil {
			return
		}
		text, _ := th.MarshalText()
		again, err := ParseThrottled(text)
		if err != nil || again != th {
			t.Fatalf("%q parsed to %#x, printed %q, parsed back to %#x, %v", data, th, text, again, err)
		}
		r := Readings{Throttle: &th}
		if n := len(Metrics(r)); n != 8 {
			t.Fatalf("%d samples", n)
		}
		cs := Conditions(r)
		if len(cs) != 3 {
			t.Fatalf("conditions %+v", cs)
		}
		if cs[0].Status != (th&UnderVoltageNow != 0) {
			t.Fatalf("%#x: %+v", th, cs[0])
		}
	})
}
