package tunnel

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// state is where a stream is in its life.
type state uint8

const (
	// opening: the dialer waits for the accept.
	opening state = iota
	// open: frames go both ways.
	open
	// done: the stream ended; no frame goes in or out.
	done
)

// stream is one end of a stream, the Dialer's or the Listener's: a
// net.Conn. Both ends work alike once the stream is open.
type stream struct {
	m    *mux
	node string // the Dialer's peer; "" at the Listener
	id   SessionID
	name string // "tunnel: node pi-1: stream 1a2b3c4d", to begin errors with
	// ctx ends with the stream, cutting its publishes short.
	ctx    context.Context
	cancel context.CancelFunc
	// writeMu keeps data and fin frames in sequence order: each is
	// published by the Write or CloseWrite that numbered it, one at a
	// time.
	writeMu sync.Mutex

	mu         sync.Mutex
	state      state
	local      bool // Close was called
	nonce      uint64
	peerWindow uint64
	last       time.Time // a frame went either way

	// Receiving. Read returns rerr once buf is read: io.EOF after a fin
	// or a clean close, else why the stream ended.
	buf        [][]byte
	buffered   int
	rseq       uint64 // the last data or fin frame taken
	received   uint64
	consumed   uint64
	advertised uint64 // consumed as last sent to the peer
	rerr       error
	rdl        time.Time
	rwake      chan struct{}
	rwaiters   int

	// Sending. Write returns werr once set.
	wseq     uint64 // the last data or fin frame numbered
	sent     uint64
	peerAck  uint64 // the peer's consumed
	wclosed  bool   // CloseWrite was called
	werr     error
	wdl      time.Time
	wwake    chan struct{}
	wwaiters int
}

var (
	_ net.Conn                        = (*stream)(nil)
	_ interface{ CloseWrite() error } = (*stream)(nil)
)

func newStream(m *mux, node string, id SessionID, st state) *stream {
	s := &stream{m: m, node: node, id: id, state: st, rwake: make(chan struct{}), wwake: make(chan struct{})}
	if m.dialer {
		s.name = fmt.Sprintf("tunnel: node %s: stream %s", node, id.short())
	} else {
		s.name = fmt.Sprintf("tunnel: stream %s", id.short())
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.last = m.set.clk.Now()
	return s
}

// Read reads what the peer sent. After a fin or a clean close it returns
// io.EOF once everything received was read; after the stream ended
// otherwise, an error saying why.
func (s *stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	for {
		if s.local {
			s.mu.Unlock()
			return 0, s.closedError("read")
		}
		if s.expired(s.rdl) {
			s.mu.Unlock()
			return 0, s.timeout("read")
		}
		if s.buffered > 0 || len(p) == 0 {
			break
		}
		if s.rerr != nil {
			err := s.rerr
			s.mu.Unlock()
			return 0, err
		}
		s.wait(s.rdl, s.rwake, &s.rwaiters)
	}
	n := 0
	for n < len(p) && len(s.buf) > 0 {
		c := copy(p[n:], s.buf[0])
		n += c
		if c == len(s.buf[0]) {
			s.buf[0] = nil
			s.buf = s.buf[1:]
		} else {
			s.buf[0] = s.buf[0][c:]
		}
	}
	if len(s.buf) == 0 {
		s.buf = nil
	}
	s.buffered -= n
	s.consumed += uint64(n)
	// Credit goes back once half the window was read, unless the peer
	// sends no more anyway.
	var ack []byte
	if s.state == open && s.rerr == nil && s.consumed-s.advertised >= s.ackEvery() {
		ack = Frame{Kind: KindAck, Session: s.id, Nonce: s.nonce, Ack: s.consumed}.Append(make([]byte, 0, maxHeader))
		s.advertised = s.consumed
		s.last = s.m.set.clk.Now()
	}
	s.mu.Unlock()
	if ack != nil {
		// The data is read: a failure to return credit ends the stream
		// and shows at the next Read.
		s.publish(ack, "read", false)
	}
	return n, nil
}

// ackEvery is how many bytes Read consumes before it returns credit.
func (s *stream) ackEvery() uint64 { return uint64(max(1, s.m.set.window/2)) }

// Write sends p in frames of at most FrameSize, waiting while the peer
// has a window's worth unread.
func (s *stream) Write(p []byte) (int, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	n := 0
	for {
		frame, size, err := s.nextData(p[n:])
		if err != nil || frame == nil {
			return n, err
		}
		if err := s.publish(frame, "write", true); err != nil {
			return n, err
		}
		n += size
		if n == len(p) {
			return n, nil
		}
	}
}

// nextData numbers and returns the next data frame of p, once there is
// credit for at least a byte of it; nil if p is empty.
func (s *stream) nextData(p []byte) ([]byte, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if err := s.writable("write"); err != nil {
			return nil, 0, err
		}
		if len(p) == 0 {
			return nil, 0, nil
		}
		if credit := s.peerWindow - (s.sent - s.peerAck); credit > 0 {
			size := int(min(uint64(len(p)), uint64(s.m.set.frameSize), credit))
			s.wseq++
			s.sent += uint64(size)
			f := Frame{Kind: KindData, Session: s.id, Nonce: s.nonce, Seq: s.wseq, Ack: s.consumed, Payload: p[:size]}
			s.advertised = s.consumed
			s.last = s.m.set.clk.Now()
			return f.Append(make([]byte, 0, maxHeader+size)), size, nil
		}
		s.wait(s.wdl, s.wwake, &s.wwaiters)
	}
}

// writable returns why nothing can be written now, or nil; s.mu is held.
func (s *stream) writable(op string) error {
	switch {
	case s.local:
		return s.closedError(op)
	case s.werr != nil:
		return s.werr
	case s.wclosed:
		return fmt.Errorf("%s: %s after CloseWrite", s.name, op)
	case s.expired(s.wdl):
		return s.timeout(op)
	}
	return nil
}

// CloseWrite ends this direction: the peer reads io.EOF after the data
// sent, and may still write.
func (s *stream) CloseWrite() error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	if s.wclosed && !s.local {
		s.mu.Unlock()
		return nil
	}
	if err := s.writable("close write"); err != nil {
		s.mu.Unlock()
		return err
	}
	s.wclosed = true
	s.wseq++
	frame := Frame{Kind: KindFin, Session: s.id, Nonce: s.nonce, Seq: s.wseq, Ack: s.consumed}.Append(make([]byte, 0, maxHeader))
	s.advertised = s.consumed
	s.last = s.m.set.clk.Now()
	s.mu.Unlock()
	return s.publish(frame, "close write", true)
}

// publish publishes a frame of the stream, with deadline within the
// write deadline. A frame that is not sent ends the stream, as the peer
// would see a gap or miss credit.
func (s *stream) publish(frame []byte, op string, deadline bool) error {
	ctx := s.ctx
	var dl time.Time
	if deadline {
		s.mu.Lock()
		dl = s.wdl
		s.mu.Unlock()
	}
	if !dl.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = withTimeout(ctx, s.m.set.clk, dl.Sub(s.m.set.clk.Now()))
		defer cancel()
	}
	err := s.m.set.publish(ctx, s.node, frame)
	if err == nil {
		return nil
	}
	s.mu.Lock()
	switch {
	case s.local:
		s.mu.Unlock()
		return s.closedError(op)
	case s.state == done:
		err := s.werr
		s.mu.Unlock()
		return err
	}
	var end, ret error
	var reason string
	if ctx.Err() != nil && s.ctx.Err() == nil {
		reason = "a frame may be lost: the write deadline passed while it was published"
		end = fmt.Errorf("%s: %s: %s", s.name, op, reason)
		ret = s.timeout(op)
	} else {
		reason = "a frame was not sent: " + err.Error()
		end = fmt.Errorf("%s: %s: %w", s.name, op, err)
		ret = end
	}
	finish := s.endLocked(end, end, true, reason)
	s.mu.Unlock()
	finish()
	return ret
}

// Close ends the stream both ways. The peer reads io.EOF after the data
// it received and can write no more. Read and Write return net.ErrClosed
// after it.
func (s *stream) Close() error {
	s.mu.Lock()
	if s.local {
		s.mu.Unlock()
		return s.closedError("close")
	}
	s.local = true
	s.buf, s.buffered = nil, 0
	finish := s.endLocked(nil, nil, true, "")
	s.wakeReaders()
	s.wakeWriters()
	s.mu.Unlock()
	finish()
	return nil
}

// end ends the stream as endLocked does.
func (s *stream) end(rerr, werr error, notify bool, reason string) {
	s.mu.Lock()
	finish := s.endLocked(rerr, werr, notify, reason)
	s.mu.Unlock()
	finish()
}

// endLocked ends the stream, with s.mu held: Read returns rerr once the
// data received is read, and Write returns werr, unless either direction
// ended before. With notify, an open stream's peer is told, with reason
// (empty for a clean close). The caller calls finish once s.mu is
// released.
func (s *stream) endLocked(rerr, werr error, notify bool, reason string) (finish func()) {
	if s.state == done {
		return func() {}
	}
	wasOpen := s.state == open
	s.state = done
	if s.rerr == nil {
		s.rerr = rerr
	}
	if s.werr == nil {
		s.werr = werr
	}
	s.cancel()
	s.wakeReaders()
	s.wakeWriters()
	var frame []byte
	if notify && wasOpen {
		frame = Frame{Kind: KindClose, Session: s.id, Nonce: s.nonce, Seq: s.wseq, Payload: []byte(reason)}.Append(nil)
	}
	if rerr != nil && rerr != io.EOF {
		s.m.set.log.Debug("tunnel: stream ended", "node", s.node, "stream", s.id.short(), "err", rerr)
	}
	return func() {
		s.m.remove(s)
		if frame != nil {
			s.m.goPublish(s.node, frame, false, nil)
		}
	}
}

// endIfIdle ends the stream if no frame went either way since
// IdleTimeout before now.
func (s *stream) endIfIdle(now time.Time) {
	s.mu.Lock()
	idle := s.m.set.idleTimeout
	if s.state != open || now.Sub(s.last) < idle {
		s.mu.Unlock()
		return
	}
	reason := fmt.Sprintf("idle for %v", idle)
	err := fmt.Errorf("%s: %s", s.name, reason)
	finish := s.endLocked(err, err, true, reason)
	s.mu.Unlock()
	finish()
}

// receive takes a frame of this stream from the peer. It never blocks.
func (s *stream) receive(f Frame) {
	s.mu.Lock()
	finish := s.receiveLocked(f)
	s.mu.Unlock()
	if finish != nil {
		finish()
	}
}

func (s *stream) receiveLocked(f Frame) (finish func()) {
	drop := func(reason string) {
		s.m.set.log.Debug("tunnel: frame dropped", "node", s.node, "stream", s.id.short(), "kind", f.Kind, "seq", f.Seq, "reason", reason)
	}
	fail := func(reason string) func() {
		err := fmt.Errorf("%s: %s", s.name, reason)
		return s.endLocked(err, err, true, reason)
	}
	switch s.state {
	case done:
		drop("stream ended")
		return nil
	case opening:
		switch f.Kind {
		case KindAccept:
			if f.Nonce == 0 || f.Ack == 0 {
				s.nonce = f.Nonce
				err := fmt.Errorf("%s: node accepted with nonce %d, window %d", s.name, f.Nonce, f.Ack)
				s.state = open // so that the node hears of it
				return s.endLocked(err, err, true, "accept without a nonce or window")
			}
			s.state, s.nonce, s.peerWindow = open, f.Nonce, f.Ack
			s.last = s.m.set.clk.Now()
			s.wakeReaders()
		case KindClose:
			err := fmt.Errorf("%s: refused: %s", s.name, f.Payload)
			return s.endLocked(err, err, false, "")
		default:
			drop("stream not accepted yet")
		}
		return nil
	}
	if f.Nonce != s.nonce {
		drop("wrong nonce")
		return nil
	}
	switch f.Kind {
	case KindData, KindFin:
		if f.Seq <= s.rseq {
			drop("duplicate")
			return nil
		}
		if f.Seq != s.rseq+1 {
			return fail(fmt.Sprintf("frames lost: got frame %d after %d", f.Seq, s.rseq))
		}
		if s.rerr != nil {
			return fail(fmt.Sprintf("%s frame %d after the fin", f.Kind, f.Seq))
		}
		if reason := s.credit(f.Ack); reason != "" {
			return fail(reason)
		}
		s.rseq = f.Seq
		if f.Kind == KindFin {
			s.rerr = io.EOF
		} else if len(f.Payload) > 0 {
			if over := s.received + uint64(len(f.Payload)) - s.advertised; over > uint64(s.m.set.window) {
				return fail(fmt.Sprintf("peer sent %d bytes past the window of %d", over-uint64(s.m.set.window), s.m.set.window))
			}
			s.received += uint64(len(f.Payload))
			s.buf = append(s.buf, append([]byte(nil), f.Payload...))
			s.buffered += len(f.Payload)
		}
		s.wakeReaders()
	case KindAck:
		if reason := s.credit(f.Ack); reason != "" {
			return fail(reason)
		}
	case KindClose:
		// A clean close is clean only if no frame before it was lost.
		var err error
		switch {
		case len(f.Payload) > 0:
			err = fmt.Errorf("%s: closed by peer: %s", s.name, f.Payload)
		case f.Seq > s.rseq:
			err = fmt.Errorf("%s: frames lost: the peer closed after frame %d, got %d", s.name, f.Seq, s.rseq)
		default:
			return s.endLocked(io.EOF, fmt.Errorf("%s: closed by peer", s.name), false, "")
		}
		return s.endLocked(err, err, false, "")
	default:
		drop("stream open already")
		return nil
	}
	s.last = s.m.set.clk.Now()
	return nil
}

// credit takes the peer's ack; it returns what is wrong with it, or "".
func (s *stream) credit(ack uint64) string {
	if ack > s.sent {
		return fmt.Sprintf("peer acknowledged %d bytes of %d sent", ack, s.sent)
	}
	if ack > s.peerAck {
		s.peerAck = ack
		s.wakeWriters()
	}
	return ""
}

// wait waits, with s.mu held and released meanwhile, until wake is
// closed or the deadline dl passes.
func (s *stream) wait(dl time.Time, wake chan struct{}, waiters *int) {
	var fired <-chan time.Time
	if !dl.IsZero() {
		t := s.m.set.clk.NewTimer(dl.Sub(s.m.set.clk.Now()))
		defer t.Stop()
		fired = t.C()
	}
	*waiters++
	s.mu.Unlock()
	select {
	case <-wake:
	case <-fired:
	}
	s.mu.Lock()
	*waiters--
}

// wakeReaders wakes the Reads (and Dial) waiting; s.mu is held.
func (s *stream) wakeReaders() {
	if s.rwaiters > 0 {
		close(s.rwake)
		s.rwake = make(chan struct{})
	}
}

// wakeWriters wakes the Writes waiting; s.mu is held.
func (s *stream) wakeWriters() {
	if s.wwaiters > 0 {
		close(s.wwake)
		s.wwake = make(chan struct{})
	}
}

// expired reports whether the deadline dl passed.
func (s *stream) expired(dl time.Time) bool {
	return !dl.IsZero() && !s.m.set.clk.Now().Before(dl)
}

// SetDeadline sets the read and write deadlines.
func (s *stream) SetDeadline(t time.Time) error {
	return s.setDeadline(t, true, true)
}

// SetReadDeadline sets the deadline of Read, also of one waiting now.
func (s *stream) SetReadDeadline(t time.Time) error {
	return s.setDeadline(t, true, false)
}

// SetWriteDeadline sets the deadline of Write, also of one waiting now
// for credit. A frame being published when it passes ends the stream.
func (s *stream) SetWriteDeadline(t time.Time) error {
	return s.setDeadline(t, false, true)
}

func (s *stream) setDeadline(t time.Time, read, write bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.local {
		return s.closedError("set deadline")
	}
	if read {
		s.rdl = t
		s.wakeReaders()
	}
	if write {
		s.wdl = t
		s.wakeWriters()
	}
	return nil
}

// LocalAddr returns "bridge" at the Dialer, "tunnel" at the Listener.
func (s *stream) LocalAddr() net.Addr {
	if s.m.dialer {
		return Addr("bridge")
	}
	return listenerAddr
}

// RemoteAddr returns the node and the stream at the Dialer, such as
// "pi-1/1a2b3c4d"; "bridge/1a2b3c4d" at the Listener.
func (s *stream) RemoteAddr() net.Addr {
	if s.m.dialer {
		return Addr(s.node + "/" + s.id.short())
	}
	return Addr("bridge/" + s.id.short())
}

// alive reports whether the stream has not ended.
func (s *stream) alive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state != done
}

func (s *stream) closedError(op string) error {
	return fmt.Errorf("%s: %s: %w", s.name, op, net.ErrClosed)
}

func (s *stream) timeout(op string) error {
	return &timeoutError{fmt.Sprintf("%s: %s: i/o timeout", s.name, op)}
}

// timeoutError is a deadline's error: a net.Error that times out, and is
// os.ErrDeadlineExceeded.
type timeoutError struct{ msg string }

func (e *timeoutError) Error() string   { return e.msg }
func (e *timeoutError) Timeout() bool   { return true }
func (e *timeoutError) Temporary() bool { return true }
func (e *timeoutError) Unwrap() error   { return os.ErrDeadlineExceeded }

var _ net.Error = (*timeoutError)(nil)

// Addr is the address of a stream's end.
type Addr string

// Network returns "mqtt".
func (Addr) Network() string { return "mqtt" }

// String returns the address.
func (a Addr) String() string { return string(a) }

// listenerAddr is the Listener's address.
const listenerAddr = Addr("tunnel")
