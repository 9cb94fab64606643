package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/agent/prober"
	"github.com/outpost-edge/outpost/internal/promtext"
)

func writeMetrics(t *testing.T, write func(*promtext.Writer)) string {
	t.Helper()
	var b strings.Builder
	p := promtext.New(&b)
	write(p)
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestAgentMetricsWithoutPods(t *testing.T) {
	f := newFixture(t)
	f.write(t, "web.yaml", pod("web", "busybox:1"))
	f.write(t, "bad.yaml", "kind: Pod\nmetadata: {name: [x]}\n")
	f.agent.SyncManifests()
	// Only the manifest errors: an agent that runs no pods has no pod
	// families.
	want := `# HELP outpost_manifest_errors Problems with the static pod manifests as last read (a file that does not parse, an invalid pod).
# TYPE outpost_manifest_errors gauge
outpost_manifest_errors 1
`
	if got := writeMetrics(t, f.agent.WriteMetrics); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestPodMetricsCounters(t *testing.T) {
	var m podMetrics
	m.probe(prober.Readiness, prober.Failure)
	m.probe(prober.Readiness, prober.Failure)
	m.probe(prober.Startup, prober.Unknown)
	m.probe(prober.Kind(7), prober.Success) // ignored, not a panic
	m.probe(prober.Liveness, prober.Result(-1))
	m.observeSync(1500 * time.Millisecond)
	m.observeSync(500 * time.Millisecond)
	if m.probes[prober.Readiness][prober.Failure].Load() != 2 || m.probes[prober.Startup][prober.Unknown].Load() != 1 {
		t.Errorf("probes %v", &m.probes)
	}
	if m.syncs.Load() != 2 || time.Duration(m.syncNanos.Load()) != 2*time.Second {
		t.Errorf("syncs %d taking %v", m.syncs.Load(), time.Duration(m.syncNanos.Load()))
	}
}
