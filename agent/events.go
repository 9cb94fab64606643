package agent

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/internal/clock"
)

// Event is a pod event kept in memory (never written to disk), for
// `outpost status POD` and, later, the API server.
type Event struct {
	Time    time.Time `json:"time"`
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
}

// eventLog keeps the last few events per pod.
type eventLog struct {
	clock clock.Clock
	max   int
	mu    sync.Mutex
	byPod map[string][]Event
	// hook, when set, is called with every event recorded.
	hook func(pod *corev1.Pod, e Event)
}

// OnEvent makes the agent call f with every pod event it records (Pulled,
// Started, Killing, BackOff, Unhealthy...), so a sink can send them on:
// cmd wires it to the API server sync. f is called on the goroutine that
// records the event, without any lock of the agent held, so it must be
// quick and must not block; pod must not be modified. Without pods to run
// (no runtime), there are no events and OnEvent does nothing.
func (a *Agent) OnEvent(f func(pod *corev1.Pod, e Event)) {
	if a.pods == nil {
		return
	}
	a.pods.events.mu.Lock()
	defer a.pods.events.mu.Unlock()
	a.pods.events.hook = f
}

func newEventLog(clk clock.Clock, max int) *eventLog {
	return &eventLog{clock: clk, max: max, byPod: map[string][]Event{}}
}

func (l *eventLog) record(pod *corev1.Pod, typ, reason, msg string) {
	if pod == nil || pod.UID == "" {
		return
	}
	ev := Event{Time: l.clock.Now(), Type: typ, Reason: reason, Message: msg}
	l.mu.Lock()
	evs := append(l.byPod[string(pod.UID)], ev)
	if len(evs) > l.max {
		evs = evs[len(evs)-l.max:]
	}
	l.byPod[string(pod.UID)] = evs
	hook := l.hook
	l.mu.Unlock()
	if hook != nil {
		hook(pod, ev)
	}
}

func (l *eventLog) list(uid string) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.byPod[uid]...)
}

func (l *eventLog) forget(uid string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.byPod, uid)
}
