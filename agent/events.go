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
}

func newEventLog(clk clock.Clock, max int) *eventLog {
	return &eventLog{clock: clk, max: max, byPod: map[string][]Event{}}
}

func (l *eventLog) record(pod *corev1.Pod, typ, reason, msg string) {
	if pod == nil || pod.UID == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	evs := append(l.byPod[string(pod.UID)], Event{Time: l.clock.Now(), Type: typ, Reason: reason, Message: msg})
	if len(evs) > l.max {
		evs = evs[len(evs)-l.max:]
	}
	l.byPod[string(pod.UID)] = evs
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
