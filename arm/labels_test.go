package arm

import (
	"reflect"
	"strings"
	"testing"
)

func TestLabels(t *testing.T) {
	for _, tc := range []struct {
		fixture string
		want    map[string]string
	}{
		{"pi4", map[string]string{LabelBoard: "raspberry-pi-4-model-b", LabelBoardRevision: "c03114"}},
		{"pi3bplus", map[string]string{LabelBoard: "raspberry-pi-3-model-b-plus", LabelBoardRevision: "a020d3"}},
		{"pi1b", map[string]string{LabelBoard: "raspberry-pi-model-b", LabelBoardRevision: "000e"}},
		{"pi5", map[string]string{LabelBoard: "raspberry-pi-5-model-b", LabelBoardRevision: "c04170"}},
		{"rockpi4", map[string]string{LabelBoard: "radxa-rock-pi-4b"}},
		{"hybrid", nil},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			got := Read(fixture(t, tc.fixture)).Labels()
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestBoardLabel(t *testing.T) {
	long := strings.Repeat("Board ", 20) + "Rev 1.0"
	for _, tc := range []struct{ model, want string }{
		{"Raspberry Pi Compute Module 4 Rev 1.0", "raspberry-pi-compute-module-4"},
		{"Raspberry Pi Zero 2 W Rev 1.0", "raspberry-pi-zero-2-w"},
		{"Raspberry Pi 4 Model B", "raspberry-pi-4-model-b"},
		{"  Pine64 RockPro64 v2.1 ", "pine64-rockpro64-v2-1"},
		{"FriendlyElec NanoPi R4S (4GB LPDDR4)", "friendlyelec-nanopi-r4s-4gb-lpddr4"},
		{"Xunlong Orange Pi 5 Plus", "xunlong-orange-pi-5-plus"},
		{"NVIDIA Jetson Nano Developer Kit", "nvidia-jetson-nano-developer-kit"},
		{"Board Rev with spaces after", "board-rev-with-spaces-after"},
		{"Rev 2", "rev-2"},
		{"Ünïcødé — board", "n-c-d-board"},
		{"---", ""},
		{"", ""},
		{long, strings.TrimRight(strings.Repeat("board-", 11), "-")[:63]},
	} {
		got := BoardLabel(tc.model)
		if got != tc.want {
			t.Errorf("BoardLabel(%q) = %q, want %q", tc.model, got, tc.want)
		}
		if got != "" && !validLabelValue(got) {
			t.Errorf("BoardLabel(%q) = %q, not a label value", tc.model, got)
		}
	}
}

func TestValidLabelValue(t *testing.T) {
	for s, want := range map[string]bool{
		"c03114": true, "a": true, "A.b_c-d": true, strings.Repeat("a", 63): true,
		"": false, "-a": false, "a-": false, "a b": false, "a/b": false, strings.Repeat("a", 64): false,
	} {
		if got := validLabelValue(s); got != want {
			t.Errorf("validLabelValue(%q) = %v, want %v", s, got, want)
		}
	}
}
