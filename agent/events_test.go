package agent

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/internal/clock/clocktest"
)

func TestEventHookSeesEveryRecordedEvent(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	a := &Agent{pods: &podManager{events: newEventLog(clk, 2)}}
	type seen struct {
		pod string
		ev  Event
	}
	var got []seen
	a.OnEvent(func(pod *corev1.Pod, e Event) {
		// The hook runs without the log's lock: reading it must not
		// deadlock.
		_ = a.pods.events.list(string(pod.UID))
		got = append(got, seen{pod.Namespace + "/" + pod.Name, e})
	})
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u1"}}
	for _, reason := range []string{"Pulled", "Started", "Killing"} {
		a.pods.events.record(p, "Normal", reason, reason+" container app")
	}
	a.pods.events.record(&corev1.Pod{}, "Normal", "Started", "no uid: not recorded")
	if len(got) != 3 || got[0].pod != "default/web" || got[2].ev.Reason != "Killing" || !got[2].ev.Time.Equal(clk.Now()) {
		t.Fatalf("hook saw %+v", got)
	}
	// The hook sees all; the log keeps its last few.
	if n := len(a.pods.events.list("u1")); n != 2 {
		t.Errorf("log kept %d events, want 2", n)
	}
	(&Agent{}).OnEvent(func(*corev1.Pod, Event) {}) // no pods to run: nothing to hook
}
