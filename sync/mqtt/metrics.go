package mqtt

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/outpost-edge/outpost/internal/promtext"
)

// metrics counts what the link carries and refuses.
type metrics struct {
	mu       sync.Mutex
	msgsIn   map[string]uint64 // by topic kind
	bytesIn  map[string]uint64
	msgsOut  map[string]uint64
	bytesOut map[string]uint64
	rejects  map[[2]string]uint64 // reason, topic kind

	connects, watchdog, stale, indexes, fetches atomic.Uint64
}

func (m *metrics) init() {
	m.msgsIn, m.bytesIn = map[string]uint64{}, map[string]uint64{}
	m.msgsOut, m.bytesOut = map[string]uint64{}, map[string]uint64{}
	m.rejects = map[[2]string]uint64{}
}

func (m *metrics) in(kind string, n int) {
	m.mu.Lock()
	m.msgsIn[kind]++
	m.bytesIn[kind] += uint64(n)
	m.mu.Unlock()
}

func (m *metrics) out(kind string, n int) {
	m.mu.Lock()
	m.msgsOut[kind]++
	m.bytesOut[kind] += uint64(n)
	m.mu.Unlock()
}

func (m *metrics) reject(reason, kind string) {
	m.mu.Lock()
	m.rejects[[2]string{reason, kind}]++
	m.mu.Unlock()
}

// Counts are some of the link's counters, for tests and benchmarks.
type Counts struct {
	Connects, Watchdog, Stale, Indexes, Fetches uint64
	// Rejects are by reason.
	Rejects map[string]uint64
}

// Counts returns the link's counters.
func (s *Syncer) Counts() Counts {
	c := Counts{
		Connects: s.m.connects.Load(), Watchdog: s.m.watchdog.Load(), Stale: s.m.stale.Load(),
		Indexes: s.m.indexes.Load(), Fetches: s.m.fetches.Load(), Rejects: map[string]uint64{},
	}
	s.m.mu.Lock()
	for k, n := range s.m.rejects {
		c.Rejects[k[0]] += n
	}
	s.m.mu.Unlock()
	return c
}

// WriteMetrics writes the MQTT link's families.
func (s *Syncer) WriteMetrics(p *promtext.Writer) {
	l := s.Link()
	up := 0.0
	if l.Connected {
		up = 1
	}
	p.Family("outpost_mqtt_link_up", "Whether the node is connected to the MQTT broker (1) or not (0).", promtext.Gauge)
	p.Sample("outpost_mqtt_link_up", up)
	p.Family("outpost_mqtt_connects_total", "Connections made to the broker.", promtext.Counter)
	p.Sample("outpost_mqtt_connects_total", float64(s.m.connects.Load()))
	p.Family("outpost_mqtt_watchdog_resets_total", "Connections dropped because the broker sent nothing for three keepalives.", promtext.Counter)
	p.Sample("outpost_mqtt_watchdog_resets_total", float64(s.m.watchdog.Load()))
	p.Family("outpost_mqtt_stale_total", "Desired messages ignored for a generation older than the stored object's.", promtext.Counter)
	p.Sample("outpost_mqtt_stale_total", float64(s.m.stale.Load()))
	p.Family("outpost_mqtt_fetches_total", "Objects fetched one by one because an index listed a newer generation than the store's.", promtext.Counter)
	p.Sample("outpost_mqtt_fetches_total", float64(s.m.fetches.Load()))
	if n, err := s.deps.Store.Backlog(); err == nil {
		p.Family("outpost_status_journal_backlog", "Statuses in the store's journal waiting to be sent to the broker.", promtext.Gauge)
		p.Sample("outpost_status_journal_backlog", float64(n))
	}
	if w := s.deps.Wire; w != nil {
		p.Family("outpost_mqtt_wire_bytes_total", "Bytes to and from the broker on the wire: MQTT and TLS, without TCP/IP headers.", promtext.Counter)
		p.Sample("outpost_mqtt_wire_bytes_total", float64(w.In.Load()), "direction", "in")
		p.Sample("outpost_mqtt_wire_bytes_total", float64(w.Out.Load()), "direction", "out")
	}
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	byKind := func(name, dir string, m map[string]uint64) {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			p.Sample(name, float64(m[k]), "direction", dir, "kind", k)
		}
	}
	p.Family("outpost_mqtt_messages_total", "MQTT messages received (in) and acknowledged by the broker (out), by topic kind.", promtext.Counter)
	byKind("outpost_mqtt_messages_total", "in", s.m.msgsIn)
	byKind("outpost_mqtt_messages_total", "out", s.m.msgsOut)
	p.Family("outpost_mqtt_message_bytes_total", "Bytes of topic and payload of MQTT messages, by direction and topic kind.", promtext.Counter)
	byKind("outpost_mqtt_message_bytes_total", "in", s.m.bytesIn)
	byKind("outpost_mqtt_message_bytes_total", "out", s.m.bytesOut)
	p.Family("outpost_mqtt_rejected_total", "MQTT messages refused, by reason and topic kind; the store kept what it had.", promtext.Counter)
	keys := make([][2]string, 0, len(s.m.rejects))
	for k := range s.m.rejects {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b [2]string) int { return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1])) })
	for _, k := range keys {
		p.Sample("outpost_mqtt_rejected_total", float64(s.m.rejects[k]), "reason", k[0], "kind", k[1])
	}
}
