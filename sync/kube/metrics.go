package kube

import "github.com/outpost-edge/outpost/internal/promtext"

// WriteMetrics writes the API sync's families: whether the API server is
// reachable and how long ago it last answered, the statuses waiting in
// the store's journal to be sent, the events waiting to be sent, and the
// static pods that have no mirror pod.
func (s *Syncer) WriteMetrics(p *promtext.Writer) {
	l := s.Link()
	up := 0.0
	if l.Connected {
		up = 1
	}
	p.Family("outpost_api_link_up", "Whether the last Lease renewal reached the API server (1) or not (0).", promtext.Gauge)
	p.Sample("outpost_api_link_up", up)
	// Before any contact, the age counts from the start of the sync.
	contact := l.LastLease
	if contact.IsZero() {
		contact = l.Since
	}
	p.Family("outpost_api_last_contact_age_seconds", "Seconds since the Lease was last renewed, the last successful contact with the API server (since the sync started if there was none).", promtext.Gauge)
	p.Sample("outpost_api_last_contact_age_seconds", max(s.deps.Clock.Since(contact).Seconds(), 0))
	if n, err := s.deps.Store.Backlog(); err == nil {
		p.Family("outpost_status_journal_backlog", "Pod statuses in the store's journal waiting to be sent to the API server.", promtext.Gauge)
		p.Sample("outpost_status_journal_backlog", float64(n))
	}
	s.sink.mu.Lock()
	events, mirrorless := len(s.sink.events), len(s.sink.mirrorless)
	s.sink.mu.Unlock()
	p.Family("outpost_api_events_queued", "Pod events waiting in memory to be sent to the API server (at most 64; the oldest are dropped).", promtext.Gauge)
	p.Sample("outpost_api_events_queued", float64(events))
	p.Family("outpost_api_mirror_pod_errors", "Static pods that have no mirror pod in the API server (see outpost status).", promtext.Gauge)
	p.Sample("outpost_api_mirror_pod_errors", float64(mirrorless))
}
