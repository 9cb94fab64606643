package mqtt

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"
)

// newHarnessKeepAlive is newHarness with a Syncer of another keepalive.
func newHarnessKeepAlive(t *testing.T, keepAlive time.Duration) *harness {
	t.Helper()
	h := newHarness(t)
	s, err := New(Config{NodeName: testNode, KeepAlive: keepAlive}, Deps{
		Dial: h.b.dialer(testNode), Store: h.st, Clock: h.clk,
		NodeFacts: func() NodeFacts { h.mu.Lock(); defer h.mu.Unlock(); return h.facts() },
	})
	if err != nil {
		t.Fatal(err)
	}
	h.s = s
	return h
}

// A broker away for long had the reconnect backoff grow to its maximum:
// for a node with a short keepalive that maximum is two keepalives, so
// the node is back within three of the broker's return (it was two
// minutes whatever the keepalive, and an e2e test of a cut link saw the
// node come back late).
func TestReconnectAfterALongOutageIsWithinThreeKeepalives(t *testing.T) {
	const keepAlive = 5 * time.Second
	h := newHarnessKeepAlive(t, keepAlive)
	h.start()
	h.wait.Until(h.t, "connected", func() bool { return h.s.Link().Connected })
	h.b.mu.Lock()
	h.b.refuse = true
	h.b.mu.Unlock()
	h.b.kill(testNode)
	h.wait.Until(h.t, "link down", func() bool { return !h.s.Link().Connected })
	// Ten minutes without a broker, in steps the reconnect loop follows.
	for range 600 {
		time.Sleep(time.Millisecond)
		h.clk.Advance(time.Second)
	}
	h.b.mu.Lock()
	h.b.refuse = false
	h.b.mu.Unlock()
	back := h.clk.Now()
	h.wait.Until(h.t, "connected again", func() bool { return h.s.Link().Connected })
	if d := h.clk.Since(back); d > 3*keepAlive {
		t.Errorf("connected %v after the broker came back, want within three keepalives (%v)", d, 3*keepAlive)
	}
}

// A connect to a broker that takes the TCP connection and never answers
// (a link that died during the handshake) is given up after the
// keepalive when that is shorter than the default connect timeout, so
// the next attempt comes in time.
func TestPahoConnectGivesUpWithinTheKeepalive(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	})
	defer func() {
		ln.Close()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	}()
	const keepAlive = 300 * time.Millisecond
	dial := PahoDialer(PahoConfig{
		Brokers: []string{"ssl://" + ln.Addr().String()}, TLS: &tls.Config{ServerName: "broker"},
		ClientID: testNode, KeepAlive: keepAlive,
	})
	start := time.Now()
	conn, err := dial(context.Background(), Will{}, func(Message) {})
	took := time.Since(start)
	if err == nil {
		conn.Close(false)
		t.Fatal("connected to a broker that never answered")
	}
	if took > 10*keepAlive {
		t.Errorf("the connect gave up after %v, want about the keepalive (%v): %v", took, keepAlive, err)
	}
}

// A broker that lost the node's session may have lost its retained
// status too: the node publishes it again although it did not change,
// so a bridge started later can register the Node (it waited for the
// node's next change, which may never come). A reconnect to a broker
// that kept the session publishes nothing again.
func TestNodeStatusPublishedAgainToABrokerThatLostTheSession(t *testing.T) {
	h := newHarness(t)
	h.start()
	topic := NodeStatusTopic(testNode)
	h.wait.Until(h.t, "the first node status", func() bool { return len(h.b.published(topic)) == 1 })

	dials := h.s.Counts().Connects
	h.b.kill(testNode)
	h.wait.Until(h.t, "reconnected with the session", func() bool { return h.s.Counts().Connects > dials && h.s.Link().Connected })
	h.wait.Until(h.t, "journal empty", func() bool { n, _ := h.st.Backlog(); return n == 0 })
	if n := len(h.b.published(topic)); n != 1 {
		t.Fatalf("%d node statuses after a reconnect to a broker that kept the session, want 1", n)
	}

	dials = h.s.Counts().Connects
	h.b.mu.Lock()
	h.b.refuse = true
	h.b.mu.Unlock()
	h.b.kill(testNode)
	h.b.mu.Lock()
	clear(h.b.retained)
	delete(h.b.sessions, testNode)
	h.b.refuse = false
	h.b.mu.Unlock()
	h.wait.Until(h.t, "the node status retained again", func() bool { return h.b.retainedAt(topic) != nil })
	if h.s.Counts().Connects <= dials {
		t.Errorf("no new connection")
	}
}
