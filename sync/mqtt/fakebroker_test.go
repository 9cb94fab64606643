package mqtt

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// fakeBroker is an in-process MQTT broker for this package's unit tests:
// retained messages, one persistent session per client, wildcard
// subscriptions, Last Wills, and a queue for an offline session that can
// be made to drop, as mosquitto's does past max_queued_messages.
type fakeBroker struct {
	mu       sync.Mutex
	retained map[string][]byte
	sessions map[string]*fakeSession
	// dropQueued drops messages for offline sessions instead of queuing.
	dropQueued bool
	// refuse makes every dial fail.
	refuse bool
	// log is every publish that reached the broker, in order.
	log []fakePub
	// dials counts connects.
	dials int
}

type fakePub struct {
	client, topic string
	payload       []byte
	retained      bool
}

type fakeSession struct {
	subs  map[string]bool
	queue []Message
	conn  *fakeConn
}

func newFakeBroker() *fakeBroker {
	return &fakeBroker{retained: map[string][]byte{}, sessions: map[string]*fakeSession{}}
}

// dialer returns a Dialer for client id.
func (b *fakeBroker) dialer(id string) Dialer {
	return func(ctx context.Context, will Will, handle func(Message)) (Conn, error) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.refuse {
			return nil, errors.New("connection refused")
		}
		b.dials++
		s, present := b.sessions[id]
		if !present {
			s = &fakeSession{subs: map[string]bool{}}
			b.sessions[id] = s
		}
		if s.conn != nil {
			s.conn.closeLocked(false)
		}
		c := &fakeConn{b: b, id: id, will: will, handle: handle, done: make(chan struct{}), present: present}
		c.lastRead.Store(wall.Now().UnixNano())
		s.conn = c
		queued := s.queue
		s.queue = nil
		for _, m := range queued {
			handle(m)
		}
		return c, nil
	}
}

// publish is a publish from client id (or the test, as the bridge).
func (b *fakeBroker) publish(id, topic string, retained bool, payload []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.publishLocked(id, topic, retained, payload)
}

func (b *fakeBroker) publishLocked(id, topic string, retained bool, payload []byte) {
	b.log = append(b.log, fakePub{id, topic, append([]byte(nil), payload...), retained})
	if retained {
		if len(payload) == 0 {
			delete(b.retained, topic)
		} else {
			b.retained[topic] = append([]byte(nil), payload...)
		}
	}
	for _, s := range b.sessions {
		for f := range s.subs {
			if !topicMatch(f, topic) {
				continue
			}
			m := Message{Topic: topic, Payload: append([]byte(nil), payload...)}
			if s.conn != nil {
				s.conn.handle(m)
			} else if !b.dropQueued {
				s.queue = append(s.queue, m)
			}
			break
		}
	}
}

// loseRetained forgets every retained message, as a broker restarted
// without its persistence file.
func (b *fakeBroker) loseRetained() {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.retained)
}

// kill cuts client id's connection as a dead link would: the Last Will
// is published.
func (b *fakeBroker) kill(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.sessions[id]; s != nil && s.conn != nil {
		s.conn.closeLocked(true)
	}
}

// published returns the publishes to topics with prefix.
func (b *fakeBroker) published(prefix string) []fakePub {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []fakePub
	for _, p := range b.log {
		if strings.HasPrefix(p.topic, prefix) {
			out = append(out, p)
		}
	}
	return out
}

func (b *fakeBroker) retainedAt(topic string) []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.retained[topic]
}

type fakeConn struct {
	b        *fakeBroker
	id       string
	will     Will
	handle   func(Message)
	present  bool
	done     chan struct{}
	closed   bool
	lastRead atomicTime
}

func (c *fakeConn) Publish(ctx context.Context, topic string, retained bool, payload []byte) error {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	if c.closed {
		return errors.New("connection closed")
	}
	c.b.publishLocked(c.id, topic, retained, payload)
	return nil
}

func (c *fakeConn) Subscribe(ctx context.Context, filters ...string) error {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	if c.closed {
		return errors.New("connection closed")
	}
	s := c.b.sessions[c.id]
	for _, f := range filters {
		s.subs[f] = true
		for topic, payload := range c.b.retained {
			if topicMatch(f, topic) {
				c.handle(Message{Topic: topic, Payload: append([]byte(nil), payload...), Retained: true})
			}
		}
	}
	return nil
}

func (c *fakeConn) Unsubscribe(ctx context.Context, filters ...string) error {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	s := c.b.sessions[c.id]
	for _, f := range filters {
		delete(s.subs, f)
	}
	return nil
}

func (c *fakeConn) SessionPresent() bool  { return c.present }
func (c *fakeConn) Done() <-chan struct{} { return c.done }
func (c *fakeConn) LastRead() time.Time   { return time.Unix(0, c.lastRead.Load()) }

func (c *fakeConn) Close(graceful bool) {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	c.closeLocked(!graceful)
}

func (c *fakeConn) closeLocked(will bool) {
	if c.closed {
		return
	}
	c.closed = true
	close(c.done)
	if s := c.b.sessions[c.id]; s != nil && s.conn == c {
		s.conn = nil
	}
	if will && c.will.Topic != "" {
		c.b.publishLocked(c.id, c.will.Topic, c.will.Retained, c.will.Payload)
	}
}

// topicMatch reports whether topic matches the MQTT filter.
func topicMatch(filter, topic string) bool {
	f, t := strings.Split(filter, "/"), strings.Split(topic, "/")
	for i, p := range f {
		if p == "#" {
			return true
		}
		if i >= len(t) || (p != "+" && p != t[i]) {
			return false
		}
	}
	return len(f) == len(t)
}

type atomicTime struct{ v atomic.Int64 }

func (a *atomicTime) Store(n int64) { a.v.Store(n) }
func (a *atomicTime) Load() int64   { return a.v.Load() }
