package tunnel

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/internal/clock/clocktest"
)

// randomBytes returns n bytes that are the same for the same seed.
func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// readAll reads c to its end within 10 s.
func readAll(t *testing.T, c net.Conn) ([]byte, error) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	return io.ReadAll(c)
}

// readErr reads c until an error other than a timeout, within 10 s.
func readErr(t *testing.T, c net.Conn) error {
	t.Helper()
	_, err := readAll(t, c)
	if err == nil {
		t.Fatalf("read to a clean end, want an error")
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("no error within 10 s")
	}
	return err
}

func wantErr(t *testing.T, what string, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want one containing %q", what, parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("%s: error %q does not contain %q", what, err, p)
		}
	}
}

func TestFlowControlKeepsAtMostAWindowInFlight(t *testing.T) {
	const window, frameSize = 4096, 1000
	p := newPipe(t, pipeConfig{Window: window, FrameSize: frameSize})
	b, n := p.dial()
	data := randomBytes(300<<10, 1)
	wrote := make(chan error, 1)
	go func() {
		_, err := b.Write(data)
		if err == nil {
			err = b.CloseWrite()
		}
		wrote <- err
	}()
	// Nothing reads yet: the writer fills the window and waits.
	eventually(t, "a full window in flight", func() bool { return p.flowOf(b.id, true).sent == window })
	select {
	case err := <-wrote:
		t.Fatalf("Write returned (%v) with the reader reading nothing", err)
	default:
	}
	got, err := readAll(t, n)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, not the %d written", len(got), len(data))
	}
	if err := <-wrote; err != nil {
		t.Fatalf("write: %v", err)
	}
	if st := p.flowOf(b.id, true); st.maxInFlight > window {
		t.Fatalf("%d bytes in flight at once, window %d", st.maxInFlight, window)
	}
	var biggest int
	for _, f := range p.down.published() {
		biggest = max(biggest, len(f.Payload))
	}
	if biggest != frameSize {
		t.Fatalf("biggest data frame %d bytes, want FrameSize %d", biggest, frameSize)
	}
}

func TestAckEveryHalfWindow(t *testing.T) {
	const window = 4096
	p := newPipe(t, pipeConfig{Window: window, FrameSize: 512})
	b, n := p.dial()
	go b.Write(randomBytes(64<<10, 2))
	buf := make([]byte, 64<<10)
	for total := 0; total < 64<<10; {
		k, err := n.Read(buf)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		total += k
	}
	var acks []uint64
	for _, f := range p.up.published() {
		if f.Kind == KindAck {
			acks = append(acks, f.Ack)
		}
	}
	// The node only reads: its acks return credit for at least half a
	// window each, and no more of them than that needs.
	if len(acks) == 0 || len(acks) > (64<<10)/(window/2) {
		t.Fatalf("%d acks for 64 KiB with window %d: %v", len(acks), window, acks)
	}
	for i := 1; i < len(acks); i++ {
		if acks[i]-acks[i-1] < window/2 {
			t.Fatalf("acks %d then %d: less than half a window apart", acks[i-1], acks[i])
		}
	}
}

func TestFramesPastTheWindowEndTheStream(t *testing.T) {
	p := newPipe(t, pipeConfig{Window: 1024})
	b, n := p.dial()
	n.mu.Lock()
	f := Frame{Kind: KindData, Session: n.id, Nonce: n.nonce, Seq: n.rseq + 1, Payload: make([]byte, 1025)}
	n.mu.Unlock()
	p.l.Handle(f.Append(nil))
	wantErr(t, "node's read", readErr(t, n), "peer sent 1 bytes past the window of 1024")
	wantErr(t, "bridge's read", readErr(t, b), "closed by peer: peer sent 1 bytes past the window")
}

func TestMaxStreamsRefusesMore(t *testing.T) {
	p := newPipe(t, pipeConfig{MaxStreams: 2})
	b1, _ := p.dial()
	p.dial()
	_, err := p.d.Dial(context.Background(), node)
	wantErr(t, "third dial", err, "tunnel: node pi-1: stream ", ": refused: too many streams: 2 open (mqtt.maxStreams)")
	if got := p.d.Streams(node); got != 2 {
		t.Fatalf("dialer has %d streams after the refusal, want 2", got)
	}
	b1.Close()
	eventually(t, "the node to see the close", func() bool { return p.l.Streams() == 1 })
	p.dial()
}

func TestOpenTimeout(t *testing.T) {
	clk := clocktest.New(time.Unix(1e9, 0))
	var mu sync.Mutex
	var sent []Frame
	d := NewDialer(DialerConfig{
		Publish: func(_ context.Context, n string, b []byte) error {
			f, err := DecodeFrame(b)
			if err != nil {
				t.Errorf("published a frame that does not decode: %v", err)
			}
			mu.Lock()
			sent = append(sent, f)
			mu.Unlock()
			return nil
		},
		Clock:       clk,
		OpenTimeout: 10 * time.Second,
	})
	defer d.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := d.Dial(context.Background(), node)
		errc <- err
	}()
	eventually(t, "the open published", func() bool { mu.Lock(); defer mu.Unlock(); return len(sent) == 1 })
	for {
		clk.Advance(time.Second)
		select {
		case err := <-errc:
			wantErr(t, "dial", err, "tunnel: node pi-1: no answer within 10s; is it connected?")
			if elapsed := clk.Since(time.Unix(1e9, 0)); elapsed < 10*time.Second {
				t.Fatalf("gave up after %v", elapsed)
			}
			if got := d.Streams(node); got != 0 {
				t.Fatalf("%d streams after the timeout, want 0", got)
			}
			// The node accepts late: it is told the stream is gone.
			mu.Lock()
			open := sent[0]
			mu.Unlock()
			d.Handle(node, Frame{Kind: KindAccept, Session: open.Session, Nonce: 77, Ack: 1024}.Append(nil))
			eventually(t, "a close for the late accept", func() bool {
				mu.Lock()
				defer mu.Unlock()
				last := sent[len(sent)-1]
				return last.Kind == KindClose && last.Session == open.Session && last.Nonce == 77
			})
			return
		case <-time.After(time.Millisecond):
		}
	}
}

func TestDialEndsWithContext(t *testing.T) {
	d := NewDialer(DialerConfig{Publish: func(context.Context, string, []byte) error { return nil }})
	defer d.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		eventually(t, "a stream opening", func() bool { return d.Streams(node) == 1 })
		cancel()
	}()
	_, err := d.Dial(ctx, node)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("dial: got %v, want context.Canceled", err)
	}
}

func TestDialFailsWithoutConnection(t *testing.T) {
	d := NewDialer(DialerConfig{Publish: func(context.Context, string, []byte) error {
		return errors.New("the bridge is not connected to the broker")
	}})
	defer d.Close()
	_, err := d.Dial(context.Background(), node)
	wantErr(t, "dial", err, "tunnel: node pi-1: dial: the bridge is not connected to the broker")
}

func TestDuplicatesAreIgnored(t *testing.T) {
	p := newPipe(t, pipeConfig{Duplicate: true, Window: 8192, FrameSize: 1000})
	b, n := p.dial()
	up, down := randomBytes(100<<10, 3), randomBytes(100<<10, 4)
	go func() { b.Write(down); b.CloseWrite() }()
	go func() { n.Write(up); n.CloseWrite() }()
	got, err := readAll(t, n)
	if err != nil || !bytes.Equal(got, down) {
		t.Fatalf("node read %d bytes (%v), want the %d sent", len(got), err, len(down))
	}
	got, err = readAll(t, b)
	if err != nil || !bytes.Equal(got, up) {
		t.Fatalf("bridge read %d bytes (%v), want the %d sent", len(got), err, len(up))
	}
	b.Close()
	if _, err := readAll(t, n); err != nil {
		t.Fatalf("node's read after the bridge's clean close: %v", err)
	}
	p.down.mu.Lock()
	dups := p.down.dups
	p.down.mu.Unlock()
	if dups < 100 {
		t.Fatalf("only %d frames were duplicated", dups)
	}
}

func TestLostFrameEndsTheStream(t *testing.T) {
	var mu sync.Mutex
	data := 0
	p := newPipe(t, pipeConfig{FrameSize: 1000, Drop: func(down bool, f Frame) bool {
		mu.Lock()
		defer mu.Unlock()
		if down && f.Kind == KindData {
			data++
			return data == 3
		}
		return false
	}})
	b, n := p.dial()
	// The node may end the stream before the last frame is written.
	if _, err := b.Write(randomBytes(5000, 5)); err != nil && !strings.Contains(err.Error(), "closed by peer: frames lost") {
		t.Fatalf("write: %v", err)
	}
	got, err := readAll(t, n)
	if len(got) != 2000 {
		t.Fatalf("read %d bytes before the gap, want 2000", len(got))
	}
	wantErr(t, "node's read", err, "tunnel: stream ", ": frames lost: got frame 4 after 2")
	wantErr(t, "bridge's read", readErr(t, b), "tunnel: node pi-1: stream ", ": closed by peer: frames lost")
	if _, err := b.Write([]byte("more")); err == nil {
		t.Fatalf("write after the node closed the stream: no error")
	}
}

func TestLostLastFrameShowsAtClose(t *testing.T) {
	p := newPipe(t, pipeConfig{Drop: func(down bool, f Frame) bool { return down && f.Kind == KindFin }})
	b, n := p.dial()
	b.Write([]byte("hello"))
	b.CloseWrite()
	b.Close()
	got, err := readAll(t, n)
	if string(got) != "hello" {
		t.Fatalf("read %q, want hello", got)
	}
	wantErr(t, "node's read", err, "frames lost: the peer closed after frame 2, got 1")
}

func TestWrongNonceIsIgnored(t *testing.T) {
	p := newPipe(t, pipeConfig{})
	b, n := p.dial()
	n.mu.Lock()
	forged := Frame{Kind: KindData, Session: n.id, Nonce: n.nonce + 1, Seq: n.rseq + 1, Payload: []byte("forged")}
	n.mu.Unlock()
	p.l.Handle(forged.Append(nil))
	// Handle took it at once: nothing can have arrived.
	n.SetReadDeadline(time.Now().Add(-time.Second))
	if k, err := n.Read(make([]byte, 10)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after a frame with a wrong nonce: %d bytes, %v", k, err)
	}
	n.SetReadDeadline(time.Time{})
	b.Write([]byte("real"))
	buf := make([]byte, 10)
	k, err := n.Read(buf)
	if err != nil || string(buf[:k]) != "real" {
		t.Fatalf("read %q, %v; want the real frame", buf[:k], err)
	}
}

func TestReplayedStreamIsEmpty(t *testing.T) {
	p := newPipe(t, pipeConfig{})
	b, n := p.dial()
	b.Write([]byte("GET /run/default/web/app?cmd=rm HTTP/1.1\r\n\r\n"))
	b.CloseWrite()
	if _, err := readAll(t, n); err != nil {
		t.Fatalf("read: %v", err)
	}
	old := p.down.published()

	// A node agent that restarted (nothing recent) gets the bridge's
	// frames again.
	var mu sync.Mutex
	var answers []Frame
	l := NewListener(Config{Publish: func(_ context.Context, b []byte) error {
		f, _ := DecodeFrame(b)
		mu.Lock()
		answers = append(answers, f)
		mu.Unlock()
		return nil
	}})
	defer l.Close()
	for _, f := range old {
		l.Handle(f.Append(nil))
	}
	c, err := l.Accept()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(-time.Second))
	if k, err := c.Read(make([]byte, 100)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("replayed stream read %d bytes, %v; want nothing", k, err)
	}
	// Its data frames were told apart by their nonce, not taken as
	// duplicates.
	if s := c.(*stream); s.rseq != 0 || s.received != 0 {
		t.Fatalf("replayed stream took frames up to %d, %d bytes", s.rseq, s.received)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(answers) != 1 || answers[0].Kind != KindAccept {
		t.Fatalf("answers to the replay: %+v, want one accept", answers)
	}
}

func TestResetEndsStreams(t *testing.T) {
	p := newPipe(t, pipeConfig{})
	b, n := p.dial()
	b.Write([]byte("kept"))
	eventually(t, "the data at the node", func() bool { n.mu.Lock(); defer n.mu.Unlock(); return n.buffered == 4 })
	offline := errors.New("the node went offline (its mqtt connection ended)")
	lost := errors.New("the connection to the broker was lost")
	readc := make(chan error, 1)
	go func() { _, err := b.Read(make([]byte, 1)); readc <- err }()
	p.d.Reset(node, offline)
	p.l.Reset(lost)
	err := <-readc
	if !errors.Is(err, offline) {
		t.Fatalf("bridge's read: got %v, want it to wrap %v", err, offline)
	}
	wantErr(t, "bridge's read", err, "tunnel: node pi-1: stream ", "went offline")
	// The node reads what arrived, then why the stream ended.
	got, err := readAll(t, n)
	if string(got) != "kept" || !errors.Is(err, lost) {
		t.Fatalf("node read %q, %v; want kept, then %v", got, err, lost)
	}
	if _, err := b.Write([]byte("x")); !errors.Is(err, offline) {
		t.Fatalf("bridge's write: got %v, want it to wrap %v", err, offline)
	}
	if p.d.Streams(node) != 0 || p.l.Streams() != 0 {
		t.Fatalf("streams after the resets: bridge %d, node %d", p.d.Streams(node), p.l.Streams())
	}
	// Both ends take new streams.
	b2, n2 := p.dial()
	b2.Write([]byte("again"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(n2, buf); err != nil || string(buf) != "again" {
		t.Fatalf("new stream read %q, %v", buf, err)
	}
}

func TestResetEndsDial(t *testing.T) {
	d := NewDialer(DialerConfig{Publish: func(context.Context, string, []byte) error { return nil }})
	defer d.Close()
	offline := errors.New("node offline")
	go func() {
		eventually(t, "a stream opening", func() bool { return d.Streams(node) == 1 })
		d.Reset(node, offline)
	}()
	if _, err := d.Dial(context.Background(), node); !errors.Is(err, offline) {
		t.Fatalf("dial: got %v, want it to wrap %v", err, offline)
	}
}

func TestReadDeadline(t *testing.T) {
	p := newPipe(t, pipeConfig{})
	b, n := p.dial()
	n.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	k, err := n.Read(make([]byte, 10))
	var ne net.Error
	if k != 0 || !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %d, %v; want a timeout", k, err)
	}
	if _, ok := err.(net.Error); !ok {
		t.Fatalf("timeout %T is not a net.Error itself (net/http asserts it)", err)
	}
	wantErr(t, "read", err, "tunnel: stream ", ": read: i/o timeout")
	n.SetReadDeadline(time.Time{})
	b.Write([]byte("late"))
	buf := make([]byte, 10)
	if k, err := n.Read(buf); err != nil || string(buf[:k]) != "late" {
		t.Fatalf("read with the deadline cleared: %q, %v", buf[:k], err)
	}
}

func TestReadDeadlineMovedWhileReading(t *testing.T) {
	p := newPipe(t, pipeConfig{})
	_, n := p.dial()
	readc := make(chan error, 1)
	go func() { _, err := n.Read(make([]byte, 1)); readc <- err }()
	eventually(t, "the read waiting", func() bool { n.mu.Lock(); defer n.mu.Unlock(); return n.rwaiters == 1 })
	// As net/http's server aborts its background read.
	n.SetReadDeadline(time.Unix(1, 0))
	select {
	case err := <-readc:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read: got %v, want a timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("read still waits 10 s after its deadline moved to the past")
	}
}

func TestWriteDeadline(t *testing.T) {
	const window = 2048
	p := newPipe(t, pipeConfig{Window: window, FrameSize: 512})
	b, n := p.dial()
	b.SetWriteDeadline(time.Now().Add(20 * time.Millisecond))
	data := randomBytes(3*window, 6)
	k, err := b.Write(data)
	if k != window || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write to a node not reading: %d bytes, %v; want %d and a timeout", k, err, window)
	}
	// The stream goes on once the deadline is cleared.
	b.SetWriteDeadline(time.Time{})
	go func() { b.Write(data[k:]); b.CloseWrite() }()
	got, err := readAll(t, n)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, %v; want the %d written", len(got), err, len(data))
	}
}

func TestWriteDeadlineMovedWhileWriting(t *testing.T) {
	p := newPipe(t, pipeConfig{Window: 1024})
	b, _ := p.dial()
	writec := make(chan error, 1)
	go func() { _, err := b.Write(make([]byte, 4096)); writec <- err }()
	eventually(t, "the write waiting", func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.wwaiters == 1 })
	b.SetDeadline(time.Unix(1, 0))
	select {
	case err := <-writec:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("write: got %v, want a timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("write still waits 10 s after its deadline moved to the past")
	}
}

func TestCloseWriteLetsThePeerAnswer(t *testing.T) {
	p := newPipe(t, pipeConfig{})
	b, n := p.dial()
	b.Write([]byte("hello"))
	if err := b.CloseWrite(); err != nil {
		t.Fatalf("close write: %v", err)
	}
	if _, err := b.Write([]byte("x")); err == nil || !strings.Contains(err.Error(), "write after CloseWrite") {
		t.Fatalf("write after CloseWrite: %v", err)
	}
	got, err := readAll(t, n)
	if err != nil || string(got) != "hello" {
		t.Fatalf("node read %q, %v; want hello, then EOF", got, err)
	}
	if _, err := n.Write([]byte("world")); err != nil {
		t.Fatalf("node's write after the bridge's fin: %v", err)
	}
	n.Close()
	got, err = readAll(t, b)
	if err != nil || string(got) != "world" {
		t.Fatalf("bridge read %q, %v; want world, then EOF", got, err)
	}
}

func TestCloseGivesThePeerEOF(t *testing.T) {
	p := newPipe(t, pipeConfig{})
	b, n := p.dial()
	n.Write([]byte("bye"))
	n.Close()
	if _, err := n.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after Close: got %v, want net.ErrClosed", err)
	}
	if _, err := n.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close: got %v, want net.ErrClosed", err)
	}
	if err := n.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: got %v, want net.ErrClosed", err)
	}
	got, err := readAll(t, b)
	if err != nil || string(got) != "bye" {
		t.Fatalf("bridge read %q, %v; want bye, then EOF", got, err)
	}
	_, err = b.Write([]byte("x"))
	wantErr(t, "bridge's write after the node's close", err, "tunnel: node pi-1: stream ", ": closed by peer")
	eventually(t, "no streams", func() bool { return p.d.Streams(node) == 0 && p.l.Streams() == 0 })
}

func TestPublishErrorEndsTheStream(t *testing.T) {
	p := newPipe(t, pipeConfig{})
	b, _ := p.dial()
	p.down.breakLink(errors.New("the bridge is not connected to the broker"))
	_, err := b.Write([]byte("x"))
	wantErr(t, "write", err, "tunnel: node pi-1: stream ", ": write: the bridge is not connected to the broker")
	_, err = b.Read(make([]byte, 1))
	wantErr(t, "read after", err, "not connected")
	p.down.breakLink(nil)
}

func TestIdleStreamsEnd(t *testing.T) {
	clk := clocktest.New(time.Unix(1e9, 0))
	p := newPipe(t, pipeConfig{Clock: clk, IdleTimeout: time.Minute})
	b, n := p.dial()
	if p.d.m.count("", true) != 1 {
		t.Fatal("no stream")
	}
	errs := make(chan error, 2)
	go func() { _, err := b.Read(make([]byte, 1)); errs <- err }()
	go func() { _, err := n.Read(make([]byte, 1)); errs <- err }()
	for got := 0; got < 2; {
		select {
		case err := <-errs:
			got++
			wantErr(t, "read", err, "idle for 1m0s")
			if !strings.Contains(err.Error(), "closed by peer") && clk.Since(time.Unix(1e9, 0)) < time.Minute {
				t.Fatalf("ended at %v of idleness, before the timeout: %v", clk.Since(time.Unix(1e9, 0)), err)
			}
		case <-time.After(time.Millisecond):
			clk.Advance(time.Second)
		}
	}
	// The janitors go with the last stream.
	eventually(t, "the janitors to stop", func() bool {
		p.d.m.mu.Lock()
		defer p.d.m.mu.Unlock()
		p.l.m.mu.Lock()
		defer p.l.m.mu.Unlock()
		return !p.d.m.janitor && !p.l.m.janitor
	})
}

func TestTrafficKeepsAStreamAlive(t *testing.T) {
	clk := clocktest.New(time.Unix(1e9, 0))
	p := newPipe(t, pipeConfig{Clock: clk, IdleTimeout: time.Minute})
	b, n := p.dial()
	clk.Advance(50 * time.Second)
	b.Write([]byte("x"))
	if _, err := io.ReadFull(n, make([]byte, 1)); err != nil {
		t.Fatalf("read: %v", err)
	}
	now := clk.Now().Add(50 * time.Second)
	b.endIfIdle(now)
	n.endIfIdle(now)
	if !b.alive() || !n.alive() {
		t.Fatalf("stream ended 50 s after its last frame, idle timeout 1m")
	}
	now = now.Add(10 * time.Second)
	n.endIfIdle(now)
	wantErr(t, "bridge's read", readErr(t, b), "closed by peer: idle for 1m0s")
}

func TestDialerClose(t *testing.T) {
	p := newPipe(t, pipeConfig{})
	b, n := p.dial()
	p.d.Close()
	if _, err := b.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after the dialer closed: got %v, want net.ErrClosed", err)
	}
	wantErr(t, "node's read", readErr(t, n), "closed by peer: dialer closed")
	if _, err := p.d.Dial(context.Background(), node); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("dial after Close: got %v, want net.ErrClosed", err)
	}
}

func TestListenerClose(t *testing.T) {
	p := newPipe(t, pipeConfig{})
	b, n := p.dial()
	acceptc := make(chan error, 1)
	go func() { _, err := p.l.Accept(); acceptc <- err }()
	p.l.Close()
	if err := <-acceptc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("accept after Close: got %v, want net.ErrClosed", err)
	}
	_, err := p.d.Dial(context.Background(), node)
	wantErr(t, "dial", err, "refused: listener closed")
	// A stream open before goes on, as with a TCP listener.
	b.Write([]byte("still"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(n, buf); err != nil || string(buf) != "still" {
		t.Fatalf("read %q, %v", buf, err)
	}
}

func TestStreamsWithLatency(t *testing.T) {
	p := newPipe(t, pipeConfig{Latency: 2 * time.Millisecond, Window: 16 << 10, FrameSize: 4 << 10})
	var wg sync.WaitGroup
	for i := range 4 {
		b, n := p.dial()
		wg.Add(1)
		go func() {
			defer wg.Done()
			data := randomBytes(200<<10, uint64(10+i))
			go func() { n.Write(data); n.CloseWrite() }()
			got, err := readAll(t, b)
			if err != nil || !bytes.Equal(got, data) {
				t.Errorf("stream %d: read %d bytes, %v", i, len(got), err)
			}
		}()
	}
	wg.Wait()
}

func TestAddr(t *testing.T) {
	p := newPipe(t, pipeConfig{})
	b, n := p.dial()
	for _, tc := range []struct {
		a    net.Addr
		want string
	}{
		{p.l.Addr(), "tunnel"},
		{b.LocalAddr(), "bridge"},
		{b.RemoteAddr(), "pi-1/" + b.id.short()},
		{n.LocalAddr(), "tunnel"},
		{n.RemoteAddr(), "bridge/" + b.id.short()},
	} {
		if tc.a.Network() != "mqtt" || tc.a.String() != tc.want {
			t.Errorf("addr %s %s, want mqtt %s", tc.a.Network(), tc.a, tc.want)
		}
	}
}

func TestRestartedNodeEndsTheBridgesStreams(t *testing.T) {
	p := newPipe(t, pipeConfig{})
	b, _ := p.dial()
	// The node's agent restarts, its link up all along: the new Listener
	// knows nothing of the stream.
	l2 := NewListener(Config{Publish: p.up.publish})
	defer l2.Close()
	p.down.setDeliver(l2.Handle)
	b.Write([]byte("GET /metrics HTTP/1.1\r\n\r\n"))
	wantErr(t, "bridge's read", readErr(t, b), "closed by peer: no such stream")
}

func TestFloodOfUnknownFramesIsBounded(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	l := NewListener(Config{Publish: func(ctx context.Context, _ []byte) error {
		calls.Add(1)
		<-release
		return nil
	}})
	defer l.Close()
	for i := range 1000 {
		id := newSessionID()
		l.Handle(Frame{Kind: KindData, Session: id, Nonce: uint64(i + 1), Seq: 1, Payload: []byte("x")}.Append(nil))
	}
	eventually(t, "the answers to go out", func() bool { return calls.Load() == maxAnswers })
	close(release)
	l.m.stop()
	if n := calls.Load(); n != maxAnswers {
		t.Fatalf("%d answers published for 1000 frames of no stream, want at most %d at once", n, maxAnswers)
	}
}

func TestWriteDeadlineDuringPublishEndsTheStream(t *testing.T) {
	p := newPipe(t, pipeConfig{})
	b, n := p.dial()
	hold := p.down.holdLink()
	b.SetWriteDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := b.Write([]byte("x"))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write with Publish waiting past the deadline: got %v, want a timeout", err)
	}
	close(hold)
	// The frame may or may not have gone: the stream cannot go on.
	_, err = b.Write([]byte("y"))
	wantErr(t, "next write", err, "a frame may be lost: the write deadline passed while it was published")
	wantErr(t, "node's read", readErr(t, n), "closed by peer: a frame may be lost")
}
