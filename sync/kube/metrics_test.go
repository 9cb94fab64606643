package kube

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/internal/promtext"
)

func TestWriteMetrics(t *testing.T) {
	s, st, clk := pwUnitSyncer(t)
	write := func() string {
		t.Helper()
		var b strings.Builder
		p := promtext.New(&b)
		s.WriteMetrics(p)
		if err := p.Flush(); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	want := func(up, age, backlog, events, mirrorless string) string {
		return `# HELP outpost_api_link_up Whether the last Lease renewal reached the API server (1) or not (0).
# TYPE outpost_api_link_up gauge
outpost_api_link_up ` + up + `
# HELP outpost_api_last_contact_age_seconds Seconds since the Lease was last renewed, the last successful contact with the API server (since the sync started if there was none).
# TYPE outpost_api_last_contact_age_seconds gauge
outpost_api_last_contact_age_seconds ` + age + `
# HELP outpost_status_journal_backlog Pod statuses in the store's journal waiting to be sent to the API server.
# TYPE outpost_status_journal_backlog gauge
outpost_status_journal_backlog ` + backlog + `
# HELP outpost_api_events_queued Pod events waiting in memory to be sent to the API server (at most 64; the oldest are dropped).
# TYPE outpost_api_events_queued gauge
outpost_api_events_queued ` + events + `
# HELP outpost_api_mirror_pod_errors Static pods that have no mirror pod in the API server (see outpost status).
# TYPE outpost_api_mirror_pod_errors gauge
outpost_api_mirror_pod_errors ` + mirrorless + `
`
	}
	check := func(what, want string) {
		t.Helper()
		if got := write(); got != want {
			t.Errorf("%s: got\n%s\nwant\n%s", what, got, want)
		}
	}
	check("at start", want("0", "0", "0", "0", "0"))

	// Never reached: the age counts from the start.
	clk.Advance(30 * time.Second)
	st.Append("pod/default/a", []byte("a"))
	st.Append("pod/default/b", []byte("b"))
	check("unreachable", want("0", "30", "2", "0", "0"))

	s.setConnected(true)
	clk.Advance(1500 * time.Millisecond)
	pod := pwPod("a", "uid-a", "n1")
	s.Event(pod, corev1.EventTypeNormal, "Started", "Started container c", clk.Now())
	s.Event(pod, corev1.EventTypeNormal, "Started", "Started container c", clk.Now()) // counts up the first
	s.Event(pod, corev1.EventTypeWarning, "BackOff", "Back-off", clk.Now())
	s.sink.mu.Lock()
	s.sink.mirrorless = map[string]string{"default/a": "a secret volume"}
	s.sink.mu.Unlock()
	check("connected", want("1", "1.5", "2", "2", "1"))

	// The link drops: the age counts from the last renewal.
	s.setConnected(false)
	clk.Advance(10 * time.Second)
	check("dropped", want("0", "11.5", "2", "2", "1"))
}
