package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
)

// node is the node the tests' Dialers dial.
const node = "pi-1"

// pipeConfig shapes a pipe: both ends' settings and the faults of the
// broker between them.
type pipeConfig struct {
	Window, FrameSize, MaxStreams int
	IdleTimeout, OpenTimeout      time.Duration
	Clock                         clock.Clock
	// Latency delays every frame, keeping their order.
	Latency time.Duration
	// Duplicate delivers every frame twice, as QoS 1 may.
	Duplicate bool
	// Drop loses the frames it returns true for; down is the bridge's
	// direction.
	Drop func(down bool, f Frame) bool
}

// pipe is an in-memory broker between a Dialer and a Listener: a
// goroutine per direction delivers the frames published, in order.
type pipe struct {
	t    testing.TB
	cfg  pipeConfig
	d    *Dialer
	l    *Listener
	down *link // bridge to node
	up   *link // node to bridge

	mu   sync.Mutex
	flow map[flowKey]*flowStat
}

// flowKey is a direction of a stream.
type flowKey struct {
	id   SessionID
	down bool
}

// flowStat is what the pipe saw of a direction of a stream: the data
// published, the credit its sender was given, and the most unacknowledged
// data at once.
type flowStat struct {
	sent, acked, maxInFlight uint64
}

// link is one direction of the pipe.
type link struct {
	p       *pipe
	down    bool
	deliver func([]byte)
	ch      chan queued
	done    chan struct{}
	exited  chan struct{}

	mu        sync.Mutex
	broken    error         // Publish fails with it
	hold      chan struct{} // Publish waits for it to close
	frames    []Frame       // published, in order
	delivered int
	dups      int
}

type queued struct {
	frame []byte
	at    time.Time
}

// newPipe connects a new Dialer and Listener; the test's end closes them
// and stops the pipe.
func newPipe(t testing.TB, cfg pipeConfig) *pipe {
	p := &pipe{t: t, cfg: cfg, flow: make(map[flowKey]*flowStat)}
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("TUNNEL_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	p.down = p.newLink(true)
	p.up = p.newLink(false)
	p.d = NewDialer(DialerConfig{
		Publish: func(ctx context.Context, n string, frame []byte) error {
			if n != node {
				return fmt.Errorf("publish to node %s: no such node", n)
			}
			return p.down.publish(ctx, frame)
		},
		Clock: cfg.Clock, Log: log.With("end", "bridge"),
		Window: cfg.Window, FrameSize: cfg.FrameSize,
		IdleTimeout: cfg.IdleTimeout, OpenTimeout: cfg.OpenTimeout,
	})
	p.l = NewListener(Config{
		Publish: p.up.publish,
		Clock:   cfg.Clock, Log: log.With("end", "node"),
		Window: cfg.Window, FrameSize: cfg.FrameSize, MaxStreams: cfg.MaxStreams,
		IdleTimeout: cfg.IdleTimeout,
	})
	p.down.deliver = p.l.Handle
	p.up.deliver = func(b []byte) { p.d.Handle(node, b) }
	go p.down.run()
	go p.up.run()
	t.Cleanup(func() {
		p.l.Close()
		p.d.Close()
		close(p.down.done)
		close(p.up.done)
		<-p.down.exited
		<-p.up.exited
	})
	return p
}

func (p *pipe) newLink(down bool) *link {
	return &link{p: p, down: down, ch: make(chan queued, 1024), done: make(chan struct{}), exited: make(chan struct{})}
}

// publish is an end's Publish: it queues the frame, or fails while the
// link is broken.
func (k *link) publish(ctx context.Context, frame []byte) error {
	f, err := DecodeFrame(frame)
	if err != nil {
		k.p.t.Errorf("published a frame that does not decode: %v", err)
		return err
	}
	k.mu.Lock()
	err, hold := k.broken, k.hold
	k.mu.Unlock()
	if err != nil {
		return err
	}
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	k.mu.Lock()
	k.frames = append(k.frames, f)
	k.mu.Unlock()
	if f.Kind == KindData {
		k.p.sent(k.down, f)
	}
	if k.p.cfg.Drop != nil && k.p.cfg.Drop(k.down, f) {
		return nil
	}
	select {
	case k.ch <- queued{frame: frame, at: time.Now()}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-k.done:
		return errors.New("pipe closed")
	}
}

// run delivers the frames in order, late by the latency.
func (k *link) run() {
	defer close(k.exited)
	for {
		select {
		case q := <-k.ch:
			if d := k.p.cfg.Latency - time.Since(q.at); d > 0 {
				select {
				case <-time.After(d):
				case <-k.done:
					return
				}
			}
			f, _ := DecodeFrame(q.frame)
			k.p.credited(!k.down, f)
			k.mu.Lock()
			deliver := k.deliver
			k.mu.Unlock()
			deliver(q.frame)
			k.mu.Lock()
			k.delivered++
			k.mu.Unlock()
			if k.p.cfg.Duplicate {
				deliver(q.frame)
				k.mu.Lock()
				k.dups++
				k.mu.Unlock()
			}
		case <-k.done:
			return
		}
	}
}

// setDeliver makes the link deliver to a new end.
func (k *link) setDeliver(deliver func([]byte)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.deliver = deliver
}

// holdLink makes Publish wait until the channel returned is closed, or
// its context ends.
func (k *link) holdLink() chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.hold = make(chan struct{})
	return k.hold
}

// breakLink makes Publish fail with err (nil mends it).
func (k *link) breakLink(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.broken = err
}

// published returns the frames published so far.
func (k *link) published() []Frame {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]Frame(nil), k.frames...)
}

// sent counts a data frame's bytes as in flight.
func (p *pipe) sent(down bool, f Frame) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stat(flowKey{f.Session, down})
	st.sent += uint64(len(f.Payload))
	st.maxInFlight = max(st.maxInFlight, st.sent-st.acked)
}

// credited counts the ack of a frame about to be delivered as credit of
// the other direction: its sender will know of it.
func (p *pipe) credited(down bool, f Frame) {
	if f.Kind != KindData && f.Kind != KindFin && f.Kind != KindAck {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stat(flowKey{f.Session, down})
	st.acked = max(st.acked, f.Ack)
}

func (p *pipe) stat(k flowKey) *flowStat {
	st := p.flow[k]
	if st == nil {
		st = &flowStat{}
		p.flow[k] = st
	}
	return st
}

// flowOf returns what the pipe saw of a direction of a stream.
func (p *pipe) flowOf(id SessionID, down bool) flowStat {
	p.mu.Lock()
	defer p.mu.Unlock()
	return *p.stat(flowKey{id, down})
}

// dial dials a stream and accepts it at the node.
func (p *pipe) dial() (bridge, nodeEnd *stream) {
	p.t.Helper()
	type accepted struct {
		s   *stream
		err error
	}
	ac := make(chan accepted, 1)
	go func() {
		c, err := p.l.Accept()
		if err != nil {
			ac <- accepted{err: err}
			return
		}
		ac <- accepted{s: c.(*stream)}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := p.d.Dial(ctx, node)
	if err != nil {
		p.t.Fatalf("dial: %v", err)
	}
	a := <-ac
	if a.err != nil {
		p.t.Fatalf("accept: %v", a.err)
	}
	p.t.Cleanup(func() { c.Close(); a.s.Close() })
	return c.(*stream), a.s
}

// eventually waits up to 10 s for cond.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
