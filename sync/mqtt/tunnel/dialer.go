package tunnel

import (
	"context"
	"fmt"
	"net"
)

// Dialer is the bridge's end of the streams, to any number of nodes.
type Dialer struct {
	m *mux
}

// NewDialer returns a Dialer. It starts no goroutine.
func NewDialer(cfg DialerConfig) *Dialer {
	return &Dialer{m: newMux(cfg.settings(), true)}
}

// Dial opens a stream to node and returns it once node accepts it. It
// fails when node refuses it (too many streams), does not answer within
// OpenTimeout, ctx ends, or node's link is Reset. The conn also has
// CloseWrite, as a *net.TCPConn.
func (d *Dialer) Dial(ctx context.Context, node string) (net.Conn, error) {
	m := d.m
	s := newStream(m, node, newSessionID(), opening)
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, fmt.Errorf("tunnel: node %s: dial: %w", node, net.ErrClosed)
	}
	m.addLocked(s)
	m.mu.Unlock()

	octx, cancel := withTimeout(ctx, m.set.clk, m.set.openTimeout)
	defer cancel()
	gaveUp := func(err error) error {
		if ctx.Err() != nil {
			err = fmt.Errorf("tunnel: node %s: dial: %w", node, ctx.Err())
		} else if octx.Err() != nil {
			err = fmt.Errorf("tunnel: node %s: no answer within %v; is it connected?", node, m.set.openTimeout)
		}
		s.end(err, err, false, "")
		return err
	}
	openFrame := Frame{Kind: KindOpen, Session: s.id, Ack: uint64(m.set.window)}.Append(make([]byte, 0, maxHeader))
	if err := m.set.publish(octx, node, openFrame); err != nil {
		return nil, gaveUp(fmt.Errorf("tunnel: node %s: dial: %w", node, err))
	}
	s.mu.Lock()
	for s.state == opening && octx.Err() == nil {
		wake := s.rwake
		s.rwaiters++
		s.mu.Unlock()
		select {
		case <-wake:
		case <-octx.Done():
		}
		s.mu.Lock()
		s.rwaiters--
	}
	switch s.state {
	case open:
		s.mu.Unlock()
		m.set.log.Debug("tunnel: stream open", "node", node, "stream", s.id.short())
		return s, nil
	case done:
		err := s.rerr
		s.mu.Unlock()
		return nil, err
	}
	s.mu.Unlock()
	return nil, gaveUp(nil)
}

// Handle takes a frame node sent. It does not block.
func (d *Dialer) Handle(node string, frame []byte) { d.m.handle(node, frame) }

// Reset ends node's streams, as its link is gone (node went offline, or
// the bridge lost the broker): their Reads (after the data received) and
// Writes return an error wrapping err, and Dials under way fail with it.
func (d *Dialer) Reset(node string, err error) {
	for _, s := range d.m.streamsOf(node, false) {
		e := fmt.Errorf("%s: %w", s.name, err)
		s.end(e, e, false, "")
	}
}

// Streams returns how many streams node has, open or opening.
func (d *Dialer) Streams(node string) int { return d.m.count(node, false) }

// Close ends every stream, telling the nodes, and waits at most a few
// seconds for that; Dial fails after it.
func (d *Dialer) Close() {
	m := d.m
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	close(m.quit)
	m.mu.Unlock()
	for _, s := range m.streamsOf("", true) {
		e := fmt.Errorf("%s: dialer closed: %w", s.name, net.ErrClosed)
		s.end(e, e, true, "dialer closed")
	}
	m.stop()
}
