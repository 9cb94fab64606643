package mqtt

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"
)

const (
	// MaxInboxBytes bounds the messages waiting to be applied; past it
	// a message is dropped (and acknowledged), and the indexes are read
	// again once the inbox has room, which fetches what was dropped.
	MaxInboxBytes = 16 << 20
	// indexSettle is how long the node waits after an index for the
	// messages queued before it, so it does not fetch what is already
	// on its way; settling never takes longer than indexSettleMax.
	indexSettle    = time.Second
	indexSettleMax = 5 * time.Second
	// fetchTimeout bounds how long a fetch subscription of one object
	// waits for its retained message.
	fetchTimeout = 30 * time.Second
	// fetchBatch is how many topics one SUBSCRIBE of a fetch names.
	fetchBatch = 64
)

// Inbox hands messages from paho's goroutine to the one that applies
// them, without ever blocking paho: Put is a Dialer's handler. Past its
// limit in bytes a message is dropped and acknowledged, and Take says so:
// the taker then reads the indexes again.
type Inbox struct {
	mu       sync.Mutex
	msgs     []Message
	bytes    int
	limit    int
	overflow bool
	wake     chan struct{}
}

// NewInbox returns an Inbox that holds at most limit bytes of payloads.
func NewInbox(limit int) *Inbox { return &Inbox{limit: limit, wake: make(chan struct{}, 1)} }

// Wake is signalled when messages were put.
func (in *Inbox) Wake() <-chan struct{} { return in.wake }

// Put queues m and returns at once.
func (in *Inbox) Put(m Message) {
	in.mu.Lock()
	if in.bytes+len(m.Payload) > in.limit {
		in.overflow = true
		in.mu.Unlock()
		if m.Ack != nil {
			m.Ack()
		}
		return
	}
	in.msgs = append(in.msgs, m)
	in.bytes += len(m.Payload)
	in.mu.Unlock()
	select {
	case in.wake <- struct{}{}:
	default:
	}
}

// Take returns the queued messages and whether any was dropped since the
// last Take.
func (in *Inbox) Take() ([]Message, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	msgs, over := in.msgs, in.overflow
	in.msgs, in.bytes, in.overflow = nil, 0, false
	return msgs, over
}

// processor is the state of one session's inbound side, owned by its
// goroutine.
type processor struct {
	s    *Syncer
	conn Conn
	// pending are the indexes received and not yet reconciled; settle
	// fires when they are due, at the latest settleBy.
	pending  map[Scope]Index
	settleBy time.Time
	// fetched are the topics subscribed one by one to fetch their
	// retained object; they are unsubscribed once none is awaited any
	// more, or at fetchBy.
	fetched  []string
	awaiting map[string]uint64 // by topic, the generation the index lists
	fetchBy  time.Time
	// floor is, by scope, the generation of the last index read, when
	// keys are trusted (guard); kept in the store across restarts.
	floor [3]uint64
}

// floorKey is the store's meta key of a scope's floor.
func floorKey(s Scope) string { return "mqtt-index-" + scopeName(s) }

// process applies the connection's messages to the store until ctx ends.
func (s *Syncer) process(ctx context.Context, conn Conn, in *Inbox) error {
	p := &processor{s: s, conn: conn, pending: map[Scope]Index{}, awaiting: map[string]uint64{}}
	if s.keys != nil {
		for _, scope := range []Scope{ScopeNode, ScopeCluster} {
			v, err := s.deps.Store.ResumeVersion(floorKey(scope))
			if err != nil {
				return fmt.Errorf("read the last index's generation: %w", err)
			}
			p.floor[scope], _ = strconv.ParseUint(v, 10, 64)
		}
	}
	settle := s.deps.Clock.NewTimer(time.Hour)
	settle.Stop()
	fetch := s.deps.Clock.NewTimer(time.Hour)
	fetch.Stop()
	defer settle.Stop()
	defer fetch.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-in.Wake():
			msgs, overflow := in.Take()
			for _, m := range msgs {
				if err := p.handle(ctx, m); err != nil {
					return err
				}
			}
			if overflow {
				s.log.Warn("mqtt: messages dropped while the store caught up; reading the indexes again")
				if err := s.request(ctx, func(ctx context.Context) error {
					return conn.Subscribe(ctx, NodeIndexTopic(s.cfg.NodeName), ClusterIndexTopic)
				}); err != nil {
					return err
				}
			}
			if len(p.pending) > 0 {
				settle.Reset(max(0, min(indexSettle, p.settleBy.Sub(s.deps.Clock.Now()))))
			}
		case <-settle.C():
			if err := p.reconcile(ctx); err != nil {
				return err
			}
		case <-fetch.C():
		}
		if err := p.endFetches(ctx); err != nil {
			return err
		}
		if len(p.fetched) > 0 {
			fetch.Reset(max(0, p.fetchBy.Sub(s.deps.Clock.Now())))
		}
	}
}

// handle applies one message and acknowledges it. Only a failed publish
// (the connection is suspect) is an error.
func (p *processor) handle(ctx context.Context, m Message) error {
	s := p.s
	defer func() {
		if m.Ack != nil {
			m.Ack()
		}
	}()
	t, err := ParseTopic(m.Topic)
	if err != nil {
		s.m.reject(rejectTopic, "other")
		s.log.Warn("mqtt message refused", "topic", m.Topic, "reason", rejectTopic, "err", err)
		return nil
	}
	kind := t.kindLabel()
	s.m.in(kind, len(m.Topic)+len(m.Payload))
	if t.Scope == 0 || (t.Scope == ScopeNode && t.Node != s.cfg.NodeName) {
		s.m.reject(rejectNode, kind)
		s.log.Warn("mqtt message refused", "topic", m.Topic, "reason", rejectNode, "err", "not a desired topic of this node")
		return nil
	}
	if t.Index {
		p.handleIndex(t, m.Payload)
		return nil
	}
	g := guard{keys: s.keys, floor: p.floor[t.Scope], expected: p.awaiting[m.Topic], seal: s.cfg.SealKey}
	delete(p.awaiting, m.Topic)
	res, err := applyDesired(s.deps.Store, s.cfg.NodeName, t, m.Payload, s.cfg.MaxMessageBytes, g)
	if err != nil {
		var r *rejected
		reason := "store"
		if errors.As(err, &r) {
			reason = r.reason
		}
		s.m.reject(reason, kind)
		s.log.Warn("mqtt message refused; the store keeps what it had", "topic", m.Topic, "reason", reason, "err", err)
		return nil
	}
	switch res {
	case applyStored:
		s.log.Debug("mqtt: desired object stored", "topic", m.Topic)
	case applyDeleted:
		s.log.Info("mqtt: desired object deleted", "topic", m.Topic)
	case applyStale:
		s.m.stale.Add(1)
		s.log.Debug("mqtt: older generation than the store's ignored", "topic", m.Topic)
	case applyReplay:
		s.m.stale.Add(1)
		s.log.Info("mqtt: signed message older than the last index read and not listed in it ignored (a replay or a late duplicate)",
			"topic", m.Topic, "index", p.floor[t.Scope])
	case applyUnsigned:
		s.log.Debug("mqtt: empty payload ignored: with mqtt.trustedKeys only a signed tombstone or index deletes", "topic", m.Topic)
	}
	return nil
}

func (p *processor) handleIndex(t Topic, payload []byte) {
	s := p.s
	if len(payload) == 0 {
		return // no index published (yet): nothing to compare
	}
	if len(payload) > s.cfg.MaxMessageBytes {
		s.m.reject(rejectSize, "index")
		s.log.Warn("mqtt index refused", "topic", t.String(), "reason", rejectSize, "bytes", len(payload))
		return
	}
	e, err := UnmarshalEnvelope(payload)
	var x Index
	if err == nil && s.keys != nil {
		if _, err := s.keys.Verify(t.String(), payload, e); err != nil {
			s.m.reject(rejectSig, "index")
			s.log.Warn("mqtt index refused", "topic", t.String(), "reason", rejectSig, "err", err)
			return
		}
	}
	if err == nil {
		x, err = ParseIndex(e, t.Scope)
	}
	if err != nil {
		s.m.reject(rejectEnvelope, "index")
		s.log.Warn("mqtt index refused", "topic", t.String(), "reason", rejectEnvelope, "err", err)
		return
	}
	if s.keys != nil && x.Generation < p.floor[t.Scope] {
		s.m.stale.Add(1)
		s.log.Info("mqtt: signed index older than the last one read ignored (a replay)", "topic", t.String(),
			"generation", x.Generation, "last", p.floor[t.Scope])
		return
	}
	if old, ok := p.pending[t.Scope]; ok && old.Generation > x.Generation {
		return
	}
	if len(p.pending) == 0 {
		p.settleBy = s.deps.Clock.Now().Add(indexSettleMax)
	}
	p.pending[t.Scope] = x
}

// reconcile compares the pending indexes with the store: objects the
// index lists with a newer generation are fetched, objects it no longer
// lists (and that are older than it) are deleted.
func (p *processor) reconcile(ctx context.Context) error {
	s := p.s
	for _, scope := range []Scope{ScopeNode, ScopeCluster} {
		x, ok := p.pending[scope]
		if !ok {
			continue
		}
		delete(p.pending, scope)
		stored, err := storedGenerations(s.deps.Store, scope)
		if err != nil {
			s.log.Warn("mqtt: read the store for the index; skipping what cannot be read", "err", err)
		}
		var fetch []string
		for _, key := range slices.Sorted(maps.Keys(x.Entries)) {
			if g, ok := stored[key]; ok && g >= x.Entries[key] {
				continue
			}
			t, err := keyTopic(key)
			if err != nil {
				continue
			}
			t.Node = s.cfg.NodeName
			fetch = append(fetch, t.String())
			p.awaiting[t.String()] = x.Entries[key]
		}
		var deleted int
		for key, g := range stored {
			if _, listed := x.Entries[key]; listed || g > x.Generation {
				continue
			}
			t, err := keyTopic(key)
			if err != nil {
				continue
			}
			ok, err := opsFor(s.deps.Store, t.Kind).deleteMQTT(t.Namespace, t.Name)
			if err != nil {
				s.log.Warn("mqtt: delete an object the index no longer lists", "object", key, "err", err)
				continue
			}
			if ok {
				deleted++
			}
		}
		s.m.indexes.Add(1)
		if s.keys != nil && x.Generation > p.floor[scope] {
			p.floor[scope] = x.Generation
			if err := s.deps.Store.SetResumeVersion(floorKey(scope), strconv.FormatUint(x.Generation, 10)); err != nil {
				s.log.Warn("mqtt: keep the last index's generation", "err", err)
			}
		}
		if len(fetch) > 0 || deleted > 0 {
			s.log.Info("mqtt: index read", "scope", scopeName(scope), "objects", len(x.Entries), "fetch", len(fetch), "deleted", deleted)
		}
		for len(fetch) > 0 {
			n := min(len(fetch), fetchBatch)
			batch := fetch[:n]
			fetch = fetch[n:]
			if err := s.request(ctx, func(ctx context.Context) error { return p.conn.Subscribe(ctx, batch...) }); err != nil {
				return err
			}
			s.m.fetches.Add(uint64(len(batch)))
			p.fetched = append(p.fetched, batch...)
			p.fetchBy = s.deps.Clock.Now().Add(fetchTimeout)
		}
	}
	return nil
}

// endFetches unsubscribes the fetch subscriptions once every object
// came, or once fetchBy passed.
func (p *processor) endFetches(ctx context.Context) error {
	if len(p.fetched) == 0 || (len(p.awaiting) > 0 && p.s.deps.Clock.Now().Before(p.fetchBy)) {
		return nil
	}
	if len(p.awaiting) > 0 {
		p.s.log.Warn("mqtt: objects the index lists did not come; the bridge publishes them again", "missing", len(p.awaiting))
	}
	topics := p.fetched
	p.fetched = nil
	clear(p.awaiting)
	for len(topics) > 0 {
		n := min(len(topics), fetchBatch)
		batch := topics[:n]
		topics = topics[n:]
		if err := p.s.request(ctx, func(ctx context.Context) error { return p.conn.Unsubscribe(ctx, batch...) }); err != nil {
			return err
		}
	}
	return nil
}

func scopeName(s Scope) string {
	if s == ScopeCluster {
		return "cluster"
	}
	return "node"
}
