package tunnel

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
)

// maxAnswers is how many answers to frames of no stream (refusals, "no
// such stream") an end publishes at once; past it they are dropped, as a
// flood of such frames must not make goroutines without end. The frames
// of a stream (its accept, its close) are as many as the streams.
const maxAnswers = 64

// recentStreams is how many ended streams an end remembers, to drop
// their late frames (duplicates, replays) quietly.
const recentStreams = 256

// key names a stream at an end: the Dialer's streams are per node, the
// Listener's node is "".
type key struct {
	node string
	id   SessionID
}

// mux is what the Dialer and the Listener share: their streams, the
// frames they receive, and the goroutines they start (the janitor that
// ends idle streams, and publishes of frames nobody waits for).
type mux struct {
	set    settings
	dialer bool
	// onOpen takes an open frame (the Listener's).
	onOpen func(Frame)

	mu      sync.Mutex
	streams map[string]map[SessionID]*stream
	n       int
	recent  map[key]bool
	ring    []key // recent's keys, oldest at next
	next    int
	closed  bool // Dialer: Dial fails; Listener: opens are refused
	stopped bool // no goroutine starts any more
	janitor bool // the janitor runs
	emptied chan struct{}
	quit    chan struct{} // closed when the Dialer closes
	answers chan struct{} // a token per answer being published
	wg      sync.WaitGroup
}

func newMux(set settings, dialer bool) *mux {
	return &mux{
		set:     set,
		dialer:  dialer,
		streams: make(map[string]map[SessionID]*stream),
		recent:  make(map[key]bool),
		emptied: make(chan struct{}, 1),
		quit:    make(chan struct{}),
		answers: make(chan struct{}, maxAnswers),
	}
}

// add registers s; m.mu is held.
func (m *mux) addLocked(s *stream) {
	byID := m.streams[s.node]
	if byID == nil {
		byID = make(map[SessionID]*stream)
		m.streams[s.node] = byID
	}
	byID[s.id] = s
	m.n++
	if !m.janitor && !m.stopped {
		m.janitor = true
		m.wg.Add(1)
		go m.runJanitor()
	}
}

// remove forgets s, remembering its ID for a while.
func (m *mux) remove(s *stream) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.streams[s.node][s.id] != s {
		return
	}
	delete(m.streams[s.node], s.id)
	if len(m.streams[s.node]) == 0 {
		delete(m.streams, s.node)
	}
	m.n--
	m.rememberLocked(key{s.node, s.id})
	if m.n == 0 {
		select {
		case m.emptied <- struct{}{}:
		default:
		}
	}
}

// rememberLocked adds k to the recently ended streams; m.mu is held.
func (m *mux) rememberLocked(k key) {
	if m.recent[k] {
		return
	}
	if len(m.ring) < recentStreams {
		m.ring = append(m.ring, k)
	} else {
		delete(m.recent, m.ring[m.next])
		m.ring[m.next] = k
		m.next = (m.next + 1) % recentStreams
	}
	m.recent[k] = true
}

// streamsOf returns node's streams, or every stream with all.
func (m *mux) streamsOf(node string, all bool) []*stream {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ss []*stream
	for n, byID := range m.streams {
		if all || n == node {
			for _, s := range byID {
				ss = append(ss, s)
			}
		}
	}
	return ss
}

// count returns how many streams node has, or all have.
func (m *mux) count(node string, all bool) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if all {
		return m.n
	}
	return len(m.streams[node])
}

// handle takes a frame the peer sent.
func (m *mux) handle(node string, b []byte) {
	f, err := DecodeFrame(b)
	if err != nil {
		m.set.log.Debug("tunnel: frame dropped", "node", node, "err", err)
		return
	}
	m.mu.Lock()
	s := m.streams[node][f.Session]
	m.mu.Unlock()
	if s != nil {
		s.receive(f)
		return
	}
	m.unknown(node, f)
}

// unknown takes a frame of no current stream: an open for the Listener;
// a late frame of an ended stream, dropped; else one whose stream this
// end has forgotten, which is told that the stream is gone.
func (m *mux) unknown(node string, f Frame) {
	drop := func(reason string) {
		m.set.log.Debug("tunnel: frame dropped", "node", node, "stream", f.Session.short(), "kind", f.Kind, "reason", reason)
	}
	switch {
	case f.Kind == KindOpen && m.onOpen != nil:
		m.onOpen(f)
		return
	case f.Kind == KindOpen || f.Kind == KindClose:
		drop("no such stream")
		return
	case f.Kind == KindAccept && !m.dialer:
		drop("accept sent to the listener")
		return
	}
	m.mu.Lock()
	recent := m.recent[key{node, f.Session}]
	m.mu.Unlock()
	// A stream the dialer gave up on may still be accepted: tell the
	// node, which would keep it open otherwise.
	if recent && f.Kind != KindAccept {
		drop("stream ended")
		return
	}
	drop("no such stream; closing it")
	m.goPublish(node, Frame{Kind: KindClose, Session: f.Session, Nonce: f.Nonce, Payload: []byte("no such stream")}.Append(nil), true, nil)
}

// goPublish publishes frame to node on a goroutine of its own, within
// controlTimeout, then calls then (if not nil) with the result. An
// answer is dropped when maxAnswers are being published.
func (m *mux) goPublish(node string, frame []byte, answer bool, then func(error)) {
	m.mu.Lock()
	var err error
	switch {
	case m.stopped:
		err = errStopped
	case answer:
		select {
		case m.answers <- struct{}{}:
		default:
			err = errTooManyAnswers
		}
	}
	if err == nil {
		m.wg.Add(1)
	}
	m.mu.Unlock()
	if err != nil {
		m.set.log.Debug("tunnel: frame not sent", "node", node, "err", err)
		if then != nil {
			then(err)
		}
		return
	}
	go func() {
		defer m.wg.Done()
		if answer {
			defer func() { <-m.answers }()
		}
		ctx, cancel := withTimeout(context.Background(), m.set.clk, controlTimeout)
		err := m.set.publish(ctx, node, frame)
		cancel()
		if err != nil {
			m.set.log.Debug("tunnel: frame not sent", "node", node, "err", err)
		}
		if then != nil {
			then(err)
		}
	}()
}

var (
	errStopped        = errors.New("tunnel: closed")
	errTooManyAnswers = errors.New("tunnel: too many answers being published")
)

// runJanitor ends idle streams, until there are none or the Dialer
// closes.
func (m *mux) runJanitor() {
	defer m.wg.Done()
	every := m.set.idleTimeout / 8
	if every <= 0 {
		every = m.set.idleTimeout
	}
	tick := m.set.clk.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-tick.C():
		case <-m.emptied:
		case <-m.quit:
			m.mu.Lock()
			m.janitor = false
			m.mu.Unlock()
			return
		}
		m.mu.Lock()
		if m.n == 0 || m.stopped {
			m.janitor = false
			m.mu.Unlock()
			return
		}
		m.mu.Unlock()
		now := m.set.clk.Now()
		for _, s := range m.streamsOf("", true) {
			s.endIfIdle(now)
		}
	}
}

// stop starts no more goroutines and waits for those under way.
func (m *mux) stop() {
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	m.wg.Wait()
}

// withTimeout is context.WithTimeout on clk.
func withTimeout(ctx context.Context, clk clock.Clock, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	if d <= 0 {
		cancel()
		return ctx, cancel
	}
	t := clk.NewTimer(d)
	go func() {
		select {
		case <-t.C():
			cancel()
		case <-ctx.Done():
			t.Stop()
		}
	}()
	return ctx, cancel
}

// newSessionID returns a random session ID.
func newSessionID() SessionID {
	var id SessionID
	rand.Read(id[:])
	return id
}

// newNonce returns a random nonce other than 0.
func newNonce() uint64 {
	var b [8]byte
	for {
		rand.Read(b[:])
		if n := binary.BigEndian.Uint64(b[:]); n != 0 {
			return n
		}
	}
}
