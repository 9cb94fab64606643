package tunnel

import (
	"fmt"
	"net"
)

// Listener is the node's end of the streams: a net.Listener, whose
// conns also have CloseWrite, as a *net.TCPConn.
type Listener struct {
	m *mux
	// pending are the streams accepted and not yet taken by Accept
	// (guarded by m.mu).
	pending []*stream
	ready   chan struct{} // pending grew
	quit    chan struct{} // closed by Close
}

var _ net.Listener = (*Listener)(nil)

// NewListener returns a Listener. It starts no goroutine.
func NewListener(cfg Config) *Listener {
	l := &Listener{
		m:     newMux(cfg.settings(), false),
		ready: make(chan struct{}, 1),
		quit:  make(chan struct{}),
	}
	l.m.onOpen = l.open
	return l
}

// Accept waits for the next stream. After Close it returns an error
// wrapping net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	m := l.m
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return nil, fmt.Errorf("tunnel: accept: %w", net.ErrClosed)
		}
		if len(l.pending) > 0 {
			s := l.pending[0]
			l.pending[0] = nil
			l.pending = l.pending[1:]
			more := len(l.pending) > 0
			m.mu.Unlock()
			if more {
				l.signal()
			}
			if s.alive() {
				return s, nil
			}
			continue
		}
		m.mu.Unlock()
		select {
		case <-l.ready:
		case <-l.quit:
		}
	}
}

func (l *Listener) signal() {
	select {
	case l.ready <- struct{}{}:
	default:
	}
}

// Close stops accepting streams: Accept fails and opens are refused.
// Streams accepted already go on until they end.
func (l *Listener) Close() error {
	m := l.m
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return fmt.Errorf("tunnel: close listener: %w", net.ErrClosed)
	}
	m.closed = true
	close(l.quit)
	pending := l.pending
	l.pending = nil
	m.mu.Unlock()
	for _, s := range pending {
		e := fmt.Errorf("%s: listener closed: %w", s.name, net.ErrClosed)
		s.end(e, e, true, "listener closed")
	}
	return nil
}

// Addr returns the address "tunnel", of network "mqtt".
func (l *Listener) Addr() net.Addr { return listenerAddr }

// Handle takes a frame the bridge sent. It does not block.
func (l *Listener) Handle(frame []byte) { l.m.handle("", frame) }

// Reset ends every stream, as the link to the broker is gone: their
// Reads (after the data received) and Writes return an error wrapping
// err. The Listener takes new streams once the link is back.
func (l *Listener) Reset(err error) {
	for _, s := range l.m.streamsOf("", true) {
		e := fmt.Errorf("%s: %w", s.name, err)
		s.end(e, e, false, "")
	}
}

// Streams returns how many streams are open, accepted or not yet.
func (l *Listener) Streams() int { return l.m.count("", true) }

// open takes an open frame: the stream is accepted, and queued for
// Accept once the accept is published, or refused.
func (l *Listener) open(f Frame) {
	m := l.m
	k := key{"", f.Session}
	m.mu.Lock()
	if m.recent[k] {
		m.mu.Unlock()
		m.set.log.Debug("tunnel: frame dropped", "stream", f.Session.short(), "kind", f.Kind, "reason", "stream ended")
		return
	}
	var reason string
	switch {
	case m.closed:
		reason = "listener closed"
	case f.Ack == 0:
		reason = "open without a window"
	case m.n >= m.set.maxStreams:
		reason = fmt.Sprintf("too many streams: %d open (mqtt.maxStreams)", m.n)
	}
	if reason != "" {
		m.rememberLocked(k)
		m.mu.Unlock()
		m.set.log.Debug("tunnel: stream refused", "stream", f.Session.short(), "reason", reason)
		m.goPublish("", Frame{Kind: KindClose, Session: f.Session, Payload: []byte(reason)}.Append(nil), true, nil)
		return
	}
	s := newStream(m, "", f.Session, open)
	s.nonce, s.peerWindow = newNonce(), f.Ack
	m.addLocked(s)
	m.mu.Unlock()
	accept := Frame{Kind: KindAccept, Session: s.id, Nonce: s.nonce, Ack: uint64(m.set.window)}.Append(make([]byte, 0, maxHeader))
	m.goPublish("", accept, false, func(err error) {
		if err != nil {
			e := fmt.Errorf("%s: accept: %w", s.name, err)
			s.end(e, e, false, "")
			return
		}
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			e := fmt.Errorf("%s: listener closed: %w", s.name, net.ErrClosed)
			s.end(e, e, true, "listener closed")
			return
		}
		l.pending = append(l.pending, s)
		m.mu.Unlock()
		l.signal()
		m.set.log.Debug("tunnel: stream open", "stream", s.id.short())
	})
}
