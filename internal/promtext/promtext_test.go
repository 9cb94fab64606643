package promtext

import (
	"math"
	"strings"
	"testing"
)

func TestWriter(t *testing.T) {
	var b strings.Builder
	p := New(&b)
	p.Family("outpost_pods", "Pods by phase.\nSecond line", Gauge)
	p.Sample("outpost_pods", 3, "phase", "Running")
	p.Sample("outpost_pods", 0.5, "phase", `we"ird\`+"\n")
	p.Family("up", "Up.", Untyped)
	p.Sample("up", 1)
	p.SampleAt("up", math.Inf(1), 1700000000000, "a", "b", "dangling")
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	want := `# HELP outpost_pods Pods by phase.\nSecond line
# TYPE outpost_pods gauge
outpost_pods{phase="Running"} 3
outpost_pods{phase="we\"ird\\\n"} 0.5
# HELP up Up.
# TYPE up untyped
up 1
up{a="b"} +Inf 1700000000000
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
