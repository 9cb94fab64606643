package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/outpost-edge/outpost/test/e2e/env"
)

// These tests run the broker configuration and ACL outpost ships
// (packaging/mosquitto) in a real mosquitto, with real paho clients
// speaking MQTT 3.1.1 over TLS with client certificates, as the agent and
// the bridge will: what each identity may read and write, what is
// refused, what survives a broker restart, the Last Will, sessions and
// limits.

const (
	bridgeCN = "outpost:bridge"

	desiredWeb   = "outpost/v1/nodes/node-a/desired/pods/default/web"
	desiredIndex = "outpost/v1/nodes/node-a/desired/index"
	clusterWeb   = "outpost/v1/cluster/services/default/web"
	clusterIndex = "outpost/v1/cluster/index"
	statusWeb    = "outpost/v1/nodes/node-a/status/pods/default/web"
	statusNode   = "outpost/v1/nodes/node-a/status/node"
	eventsA      = "outpost/v1/nodes/node-a/events"
	onlineA      = "outpost/v1/nodes/node-a/online"

	// Every wait for something that must happen is bounded by this.
	mqttTimeout = 15 * time.Second
	// quiet is how long a client must then receive nothing more, once a
	// later message (a positive control, sent after the one that must
	// not arrive) proved delivery works and came through.
	quiet = time.Second
)

// mqttPeer is a connected paho client of one certificate identity with
// everything it receives, on any subscription, in inbox.
type mqttPeer struct {
	mqtt.Client
	cn    string
	inbox chan mqtt.Message
	// lost receives the error when the broker closes the connection.
	lost chan error
	// sessionPresent is the CONNACK's session present flag.
	sessionPresent bool
}

// connectPeer connects to b as cn (a new client certificate from b's CA)
// with MQTT 3.1.1, a clean session, QoS 1 and no reconnects; tweak may
// change the options first. The client disconnects in t's cleanup.
func connectPeer(t testing.TB, b *env.MosquittoTLS, cn string, tweak ...func(*mqtt.ClientOptions)) *mqttPeer {
	t.Helper()
	p, err := dialPeer(t, b, cn, tweak...)
	if err != nil {
		t.Fatalf("connect as %s: %v", cn, err)
	}
	return p
}

// dialPeer is connectPeer returning the connect error.
func dialPeer(t testing.TB, b *env.MosquittoTLS, cn string, tweak ...func(*mqtt.ClientOptions)) (*mqttPeer, error) {
	t.Helper()
	p := &mqttPeer{cn: cn, inbox: make(chan mqtt.Message, 4096), lost: make(chan error, 1)}
	opts := mqtt.NewClientOptions().AddBroker(b.URL).SetClientID(cn).
		SetProtocolVersion(4).SetCleanSession(true).
		SetAutoReconnect(false).SetConnectRetry(false).
		SetConnectTimeout(5 * time.Second).SetWriteTimeout(5 * time.Second).
		SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) { p.inbox <- m }).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) { p.lost <- err })
	opts.SetTLSConfig(b.TLSConfig(t, cn))
	for _, f := range tweak {
		f(opts)
	}
	p.Client = mqtt.NewClient(opts)
	tok := p.Connect()
	if !tok.WaitTimeout(mqttTimeout) {
		p.Disconnect(0)
		return nil, fmt.Errorf("no CONNACK within %v", mqttTimeout)
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	p.sessionPresent = tok.(*mqtt.ConnectToken).SessionPresent()
	t.Cleanup(func() { p.Disconnect(100) })
	return p, nil
}

// subscribe subscribes to filters with QoS 1 and returns the SUBACK's
// return code for each (1: granted QoS 1; 0x80: refused).
func (p *mqttPeer) subscribe(t *testing.T, filters ...string) []byte {
	t.Helper()
	m := map[string]byte{}
	for _, f := range filters {
		m[f] = 1
	}
	tok := p.SubscribeMultiple(m, nil)
	if !tok.WaitTimeout(mqttTimeout) || tok.Error() != nil {
		t.Fatalf("%s: subscribe %v: no SUBACK within %v (%v)", p.cn, filters, mqttTimeout, tok.Error())
	}
	res := tok.(*mqtt.SubscribeToken).Result()
	codes := make([]byte, len(filters))
	for i, f := range filters {
		codes[i] = res[f]
	}
	return codes
}

// publish publishes payload with QoS 1 and waits for the broker's PUBACK.
func (p *mqttPeer) publish(t *testing.T, topic string, retained bool, payload string) {
	t.Helper()
	tok := p.Publish(topic, 1, retained, payload)
	if !tok.WaitTimeout(mqttTimeout) || tok.Error() != nil {
		t.Fatalf("%s: publish %s: no PUBACK within %v (%v)", p.cn, topic, mqttTimeout, tok.Error())
	}
}

// next returns the next message p receives.
func (p *mqttPeer) next(t *testing.T) mqtt.Message {
	t.Helper()
	select {
	case m := <-p.inbox:
		return m
	case err := <-p.lost:
		t.Fatalf("%s: connection lost while waiting for a message: %v", p.cn, err)
	case <-time.After(mqttTimeout):
		t.Fatalf("%s: no message within %v", p.cn, mqttTimeout)
	}
	return nil
}

// expect fails t unless the next message p receives is payload on topic.
func (p *mqttPeer) expect(t *testing.T, topic, payload string) mqtt.Message {
	t.Helper()
	m := p.next(t)
	if m.Topic() != topic || string(m.Payload()) != payload {
		t.Fatalf("%s received %s %q, want %s %q", p.cn, m.Topic(), m.Payload(), topic, payload)
	}
	return m
}

// expectSet fails t unless the next len(want) messages are want's
// (topic: payload), in any order, all with the retain flag as given.
func (p *mqttPeer) expectSet(t *testing.T, want map[string]string, retained bool) {
	t.Helper()
	got := map[string]string{}
	for range want {
		m := p.next(t)
		if m.Retained() != retained {
			t.Errorf("%s received %s %q with retain flag %v, want %v", p.cn, m.Topic(), m.Payload(), m.Retained(), retained)
		}
		got[m.Topic()] = string(m.Payload())
	}
	for topic, payload := range want {
		if got[topic] != payload {
			t.Fatalf("%s received %v, want %v", p.cn, got, want)
		}
	}
}

// expectNothingMore fails t if p receives anything within quiet.
func (p *mqttPeer) expectNothingMore(t *testing.T) {
	t.Helper()
	select {
	case m := <-p.inbox:
		t.Fatalf("%s received %s %q, want nothing more", p.cn, m.Topic(), m.Payload())
	case <-time.After(quiet):
	}
}

// cutter opens a client's connections itself (TLS over a TCP connection
// it keeps), so that a test can cut the TCP connection under the client,
// as when a board loses power or its link: no DISCONNECT, no TLS
// close_notify, a TCP reset.
type cutter struct {
	mu    sync.Mutex
	conns []*cutConn
}

// cutConn is a TCP connection that a test can cut. Its reader then gets
// errCut: paho takes the error of a read from a connection closed under
// it ("use of closed network connection") for its own close and would
// notice only at its next write.
type cutConn struct {
	*net.TCPConn
	cut atomic.Bool
}

var errCut = errors.New("connection cut by the test")

func (c *cutConn) Read(b []byte) (int, error) {
	n, err := c.TCPConn.Read(b)
	if err != nil && c.cut.Load() {
		err = errCut
	}
	return n, err
}

// open is a paho OpenConnectionFunc.
func (c *cutter) open(uri *url.URL, o mqtt.ClientOptions) (net.Conn, error) {
	raw, err := net.DialTimeout("tcp", uri.Host, 5*time.Second)
	if err != nil {
		return nil, err
	}
	cc := &cutConn{TCPConn: raw.(*net.TCPConn)}
	c.mu.Lock()
	c.conns = append(c.conns, cc)
	c.mu.Unlock()
	conn := tls.Client(cc, o.TLSConfig)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := conn.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	return conn, nil
}

// use makes the client open its connections through c.
func (c *cutter) use(o *mqtt.ClientOptions) { o.SetCustomOpenConnectionFn(c.open) }

// cut resets the client's TCP connection and waits until the client
// noticed.
func (c *cutter) cut(t *testing.T, p *mqttPeer) {
	t.Helper()
	c.mu.Lock()
	conn := c.conns[len(c.conns)-1]
	c.mu.Unlock()
	conn.cut.Store(true)
	conn.SetLinger(0) // close with a reset, not a FIN
	conn.Close()
	select {
	case err := <-p.lost:
		if !errors.Is(err, errCut) {
			t.Logf("%s: connection lost: %v", p.cn, err)
		}
	case <-time.After(mqttTimeout):
		t.Fatalf("%s: the client did not notice its connection was cut within %v", p.cn, mqttTimeout)
	}
}

func persistentSession(o *mqtt.ClientOptions) { o.SetCleanSession(false) }

func clientID(id string) func(*mqtt.ClientOptions) {
	return func(o *mqtt.ClientOptions) { o.SetClientID(id) }
}

func will(topic, payload string) func(*mqtt.ClientOptions) {
	return func(o *mqtt.ClientOptions) { o.SetWill(topic, payload, 1, true) }
}

// setting returns the shipped broker config's value of name as a number.
func setting(t *testing.T, b *env.MosquittoTLS, name string) int {
	t.Helper()
	n, err := strconv.Atoi(b.Setting(name))
	if err != nil {
		t.Fatalf("%s: %s %q: %v", env.ShippedMosquittoConf, name, b.Setting(name), err)
	}
	return n
}

// TestMosquittoBridgeToNode: the bridge publishes a node's desired state
// and the cluster's Services, retained; the node, subscribing later,
// receives them (and later changes live); the bridge receives what the
// node writes.
func TestMosquittoBridgeToNode(t *testing.T) {
	b := env.StartMosquittoTLS(t, env.MosquittoOptions{})
	bridge := connectPeer(t, b, bridgeCN)
	bridge.publish(t, desiredWeb, true, "pod web")
	bridge.publish(t, desiredIndex, true, "index 1")
	bridge.publish(t, clusterWeb, true, "service web")

	nodeA := connectPeer(t, b, "node-a")
	if codes := nodeA.subscribe(t, "outpost/v1/nodes/node-a/desired/#", "outpost/v1/cluster/#"); codes[0] != 1 || codes[1] != 1 {
		t.Fatalf("node-a's SUBACK codes %x, want 01 01", codes)
	}
	nodeA.expectSet(t, map[string]string{desiredWeb: "pod web", desiredIndex: "index 1", clusterWeb: "service web"}, true)
	bridge.publish(t, clusterIndex, true, "cluster index 1")
	if m := nodeA.expect(t, clusterIndex, "cluster index 1"); m.Retained() {
		t.Errorf("a live message came with the retain flag set")
	}

	bridge.subscribe(t, "outpost/v1/nodes/+/status/#", "outpost/v1/nodes/+/events", "outpost/v1/nodes/+/online")
	nodeA.publish(t, statusNode, false, "node ready")
	bridge.expect(t, statusNode, "node ready")
	nodeA.publish(t, statusWeb, false, "pod running")
	bridge.expect(t, statusWeb, "pod running")
	nodeA.publish(t, eventsA, false, "pulled image")
	bridge.expect(t, eventsA, "pulled image")
	nodeA.publish(t, onlineA, true, "true")
	bridge.expect(t, onlineA, "true")
	nodeA.expectNothingMore(t)
}

// TestMosquittoNodeReadsOnlyItsOwn: a node receives no other node's
// desired state, nor the bridge's own topics, retained or live, even
// through a wildcard, while its
// own and the cluster's, published after, come through (the positive
// control).
func TestMosquittoNodeReadsOnlyItsOwn(t *testing.T) {
	b := env.StartMosquittoTLS(t, env.MosquittoOptions{})
	bridge := connectPeer(t, b, bridgeCN)
	bridge.publish(t, desiredWeb, true, "for node-a only")
	// The bridge's own copies of the pods' tokens: no node reads them,
	// its own neither.
	bridge.publish(t, "outpost/v1/bridge/tokens/node-b/default/web.outpost-tokens", true, "the bridge's copy")

	nodeB := connectPeer(t, b, "node-b")
	codes := nodeB.subscribe(t, "outpost/v1/nodes/node-a/desired/#", "outpost/v1/nodes/+/desired/#", "outpost/v1/cluster/#", "outpost/v1/bridge/#",
		"outpost/v1/nodes/+/rpc/#")
	// mosquitto 2.0's ACL file does not check subscriptions: it grants
	// them and checks each message at delivery. A refusal (0x80) would
	// do as well.
	if codes[0] != 1 && codes[0] != 0x80 {
		t.Fatalf("node-b's SUBACK code for node-a's desired state %#x, want 0x01 or 0x80", codes[0])
	}
	t.Logf("SUBACK codes of node-b for node-a's, any node's desired state, the cluster: %x", codes)
	if codes[1] != 1 || codes[2] != 1 {
		t.Fatalf("node-b's SUBACK codes %x, want its own and the cluster's granted", codes)
	}
	// Messages to one subscriber come in the order they were published:
	// had node-a's come through, they would be before node-b's.
	bridge.publish(t, desiredIndex, true, "node-a's index")
	bridge.publish(t, "outpost/v1/nodes/node-b/desired/index", true, "node-b's index")
	bridge.publish(t, clusterWeb, true, "service web")
	// The kubelet API's frames: a node reads only those to itself, not
	// another's, nor any node's answers.
	bridge.publish(t, "outpost/v1/nodes/node-a/rpc/down", false, "a frame to node-a")
	nodeA := connectPeer(t, b, "node-a")
	nodeA.publish(t, "outpost/v1/nodes/node-a/rpc/up", false, "node-a's answer")
	bridge.publish(t, "outpost/v1/nodes/node-b/rpc/down", false, "a frame to node-b")
	nodeB.expect(t, "outpost/v1/nodes/node-b/desired/index", "node-b's index")
	nodeB.expect(t, clusterWeb, "service web")
	nodeB.expect(t, "outpost/v1/nodes/node-b/rpc/down", "a frame to node-b")
	nodeB.expectNothingMore(t)
}

// TestMosquittoNodeWritesOnlyItsOwn: a node's publishes to another
// node's status, events or online topic, or to any desired or cluster
// topic, are acknowledged and dropped (a 3.1.1 client is not told); its
// own status, published after them, reaches the bridge (the positive
// control), and the retained messages stay the bridge's.
func TestMosquittoNodeWritesOnlyItsOwn(t *testing.T) {
	b := env.StartMosquittoTLS(t, env.MosquittoOptions{})
	bridge := connectPeer(t, b, bridgeCN)
	retained := map[string]string{
		desiredWeb: "pod web", "outpost/v1/nodes/node-b/desired/index": "node-b's index",
		clusterWeb: "service web", clusterIndex: "cluster index",
	}
	for topic, payload := range retained {
		bridge.publish(t, topic, true, payload)
	}
	bridge.subscribe(t, "outpost/v1/nodes/+/status/#", "outpost/v1/nodes/+/events", "outpost/v1/nodes/+/online",
		"outpost/v1/nodes/+/desired/#", "outpost/v1/cluster/#")
	bridge.expectSet(t, retained, true)

	nodeA := connectPeer(t, b, "node-a")
	nodeB := connectPeer(t, b, "node-b")
	nodeB.publish(t, statusWeb, true, "forged by node-b")
	nodeB.publish(t, statusNode, false, "forged by node-b")
	nodeB.publish(t, eventsA, false, "forged by node-b")
	nodeB.publish(t, onlineA, true, "forged by node-b")
	nodeB.publish(t, "outpost/v1/nodes/node-b/desired/index", true, "forged by node-b")
	nodeA.publish(t, desiredWeb, true, "forged by node-a")
	nodeA.publish(t, desiredIndex, true, "forged by node-a")
	nodeA.publish(t, clusterWeb, true, "forged by node-a")
	nodeA.publish(t, clusterIndex, true, "forged by node-a")
	nodeA.publish(t, "outpost/v1/bridge/tokens/node-a/default/web.outpost-tokens", true, "forged by node-a")
	// Frames: only the bridge writes a node's rpc/down, only the node
	// its rpc/up.
	bridge.subscribe(t, "outpost/v1/nodes/+/rpc/#")
	nodeA.publish(t, "outpost/v1/nodes/node-a/rpc/down", false, "forged by node-a")
	nodeB.publish(t, "outpost/v1/nodes/node-a/rpc/up", false, "forged by node-b")
	// Each publish above had its PUBACK, so the broker had dealt with it
	// before this one.
	nodeA.publish(t, statusWeb, false, "from node-a")
	nodeA.publish(t, "outpost/v1/nodes/node-a/rpc/up", false, "node-a's answer")
	bridge.expect(t, statusWeb, "from node-a")
	bridge.expect(t, "outpost/v1/nodes/node-a/rpc/up", "node-a's answer")
	bridge.expectNothingMore(t)

	bridge.subscribe(t, "outpost/v1/nodes/+/desired/#", "outpost/v1/cluster/#", "outpost/v1/bridge/#")
	bridge.expectSet(t, retained, true)
	bridge.expectNothingMore(t)
}

// TestMosquittoRefusesWithoutClientCertificate: only TLS with a client
// certificate of the broker's CA gets in.
func TestMosquittoRefusesWithoutClientCertificate(t *testing.T) {
	b := env.StartMosquittoTLS(t, env.MosquittoOptions{})
	otherCA, err := env.NewCA("not-outpost")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := otherCA.Issue(pkix.Name{CommonName: "node-a"}, nil, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		tweak func(*mqtt.ClientOptions)
	}{
		{"no client certificate", func(o *mqtt.ClientOptions) { o.SetTLSConfig(b.TLSConfig(t, "")) }},
		{"certificate of another CA", func(o *mqtt.ClientOptions) {
			cfg := b.TLSConfig(t, "")
			cfg.Certificates = []tls.Certificate{foreign}
			o.SetTLSConfig(cfg)
		}},
		{"plain MQTT, no TLS", func(o *mqtt.ClientOptions) {
			o.Servers = nil
			o.AddBroker("tcp://" + b.Addr)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := dialPeer(t, b, "node-a", tc.tweak)
			if err == nil {
				p.Disconnect(0)
				t.Fatal("connected, want refused")
			}
			t.Logf("refused: %v", err)
		})
	}
	// The broker still serves a client with a certificate.
	connectPeer(t, b, "node-a")
}

// TestMosquittoRetainedSurviveRestart: retained messages survive a broker
// stop and start, and are gone when its database is lost.
func TestMosquittoRetainedSurviveRestart(t *testing.T) {
	b := env.StartMosquittoTLS(t, env.MosquittoOptions{})
	bridge := connectPeer(t, b, bridgeCN)
	bridge.publish(t, desiredWeb, true, "pod web")
	bridge.publish(t, clusterWeb, true, "service web")
	bridge.Disconnect(250)

	b.Stop(t)
	if _, err := os.Stat(b.DBFile); err != nil {
		t.Fatalf("no persistence database after a stop: %v", err)
	}
	b.Start(t)
	nodeA := connectPeer(t, b, "node-a")
	nodeA.subscribe(t, "outpost/v1/nodes/node-a/desired/#", "outpost/v1/cluster/#")
	nodeA.expectSet(t, map[string]string{desiredWeb: "pod web", clusterWeb: "service web"}, true)
	nodeA.Disconnect(250)

	b.Stop(t)
	b.RemovePersistence(t)
	b.Start(t)
	nodeA = connectPeer(t, b, "node-a")
	nodeA.subscribe(t, "outpost/v1/nodes/node-a/desired/#", "outpost/v1/cluster/#")
	bridge = connectPeer(t, b, bridgeCN)
	bridge.publish(t, clusterIndex, true, "after the loss")
	nodeA.expect(t, clusterIndex, "after the loss")
	nodeA.expectNothingMore(t)
}

// TestMosquittoLastWill: node-a's Last Will (online: false, retained) is
// delivered when its connection is cut, and kept retained; a node's will
// on another node's topic is never delivered.
func TestMosquittoLastWill(t *testing.T) {
	b := env.StartMosquittoTLS(t, env.MosquittoOptions{})
	bridge := connectPeer(t, b, bridgeCN)
	bridge.subscribe(t, "outpost/v1/nodes/+/online")

	// node-b's will names node-a's topic: the broker takes the connection
	// (it checks a will only when it would send it) and drops the will.
	var cutB cutter
	nodeB := connectPeer(t, b, "node-b", cutB.use, will(onlineA, "false, forged by node-b"))
	cutB.cut(t, nodeB)
	// A new connection of node-b's resolves the old one for certain: its
	// will was sent, or not, before this CONNACK.
	connectPeer(t, b, "node-b")

	var cutA cutter
	nodeA := connectPeer(t, b, "node-a", cutA.use, will(onlineA, "false"))
	nodeA.publish(t, onlineA, true, "true")
	bridge.expect(t, onlineA, "true")
	cutA.cut(t, nodeA)
	bridge.expect(t, onlineA, "false")
	bridge.expectNothingMore(t)

	// The will was retained: subscribing again, even to the same filter
	// of a live subscription, delivers it again.
	bridge.subscribe(t, "outpost/v1/nodes/+/online")
	if m := bridge.expect(t, onlineA, "false"); !m.Retained() {
		t.Errorf("the will came back without the retain flag")
	}
}

// TestMosquittoSameCertificateTakesOver: the client id is the
// certificate's CN, whatever the client says; a second connection with
// the same certificate closes the first. The first one's will is sent
// then if either connection has a clean session, and dropped if both
// are persistent.
func TestMosquittoSameCertificateTakesOver(t *testing.T) {
	b := env.StartMosquittoTLS(t, env.MosquittoOptions{})
	bridge := connectPeer(t, b, bridgeCN)
	bridge.subscribe(t, "outpost/v1/nodes/+/online")

	t.Run("clean sessions", func(t *testing.T) {
		first := connectPeer(t, b, "node-a", clientID("first"), will(onlineA, "false, first"))
		first.publish(t, onlineA, true, "true, first")
		bridge.expect(t, onlineA, "true, first")
		second := connectPeer(t, b, "node-a", clientID("second"))
		select {
		case <-first.lost:
		case <-time.After(mqttTimeout):
			t.Fatalf("the first connection was not closed within %v", mqttTimeout)
		}
		bridge.expect(t, onlineA, "false, first")
		second.publish(t, onlineA, true, "true, second")
		bridge.expect(t, onlineA, "true, second")
		second.Disconnect(250)
	})

	t.Run("persistent sessions", func(t *testing.T) {
		first := connectPeer(t, b, "node-a", clientID("first"), persistentSession, will(onlineA, "false, first"))
		first.publish(t, onlineA, true, "true, first")
		bridge.expect(t, onlineA, "true, first")
		second := connectPeer(t, b, "node-a", clientID("second"), persistentSession)
		select {
		case <-first.lost:
		case <-time.After(mqttTimeout):
			t.Fatalf("the first connection was not closed within %v", mqttTimeout)
		}
		if !second.sessionPresent {
			t.Errorf("the second connection found no session, want the first's")
		}
		// Had the first will been sent, it would have come before this.
		second.publish(t, onlineA, true, "true, second")
		bridge.expect(t, onlineA, "true, second")
		bridge.expectNothingMore(t)
	})
}

// TestMosquittoResumedTLSKeepsIdentity: a reconnect that resumes its
// TLS session (the agent keeps a session cache, so that a reconnect sends
// neither certificate again) is still its certificate's identity: it is
// let in as that node, reads only that node's desired state and writes
// only that node's status.
func TestMosquittoResumedTLSKeepsIdentity(t *testing.T) {
	b := env.StartMosquittoTLS(t, env.MosquittoOptions{})
	bridge := connectPeer(t, b, bridgeCN)
	bridge.publish(t, desiredWeb, true, "for node-a only")
	bridge.subscribe(t, "outpost/v1/nodes/+/status/#")

	cfg := b.TLSConfig(t, "node-b")
	cfg.ClientSessionCache = tls.NewLRUClientSessionCache(1)
	var resumed atomic.Bool
	cached := func(o *mqtt.ClientOptions) {
		o.SetCustomOpenConnectionFn(func(u *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", u.Host, cfg)
			if err != nil {
				return nil, err
			}
			resumed.Store(c.ConnectionState().DidResume)
			return c, nil
		})
	}
	first := connectPeer(t, b, "node-b", cached)
	if resumed.Load() {
		t.Fatalf("the first connection resumed a TLS session it cannot have")
	}
	// The broker's session tickets come after the handshake: a round
	// trip makes sure the client has read them.
	first.publish(t, "outpost/v1/nodes/node-b/status/node", false, "first")
	bridge.expect(t, "outpost/v1/nodes/node-b/status/node", "first")
	first.Disconnect(250)

	second := connectPeer(t, b, "node-b", cached)
	if !resumed.Load() {
		t.Fatalf("the second connection did a full TLS handshake, want it to resume the first's session (the broker's session tickets)")
	}
	codes := second.subscribe(t, "outpost/v1/nodes/node-a/desired/#", "outpost/v1/nodes/node-b/desired/#")
	if codes[1] != 1 {
		t.Fatalf("the resumed connection's SUBACK codes %x, want its own desired state granted", codes)
	}
	bridge.publish(t, "outpost/v1/nodes/node-b/desired/index", true, "node-b's index")
	second.expect(t, "outpost/v1/nodes/node-b/desired/index", "node-b's index")
	second.expectNothingMore(t)

	second.publish(t, statusWeb, true, "forged by a resumed node-b")
	second.publish(t, "outpost/v1/nodes/node-b/status/node", false, "second")
	bridge.expect(t, "outpost/v1/nodes/node-b/status/node", "second")
	bridge.expectNothingMore(t)
}

// TestMosquittoPersistentSession: a node's persistent session keeps its
// subscriptions and queues what is published while it is away, across a
// broker restart; subscribing again re-sends the retained messages (the
// agent sees an object twice); after the database is lost there is no
// session.
func TestMosquittoPersistentSession(t *testing.T) {
	b := env.StartMosquittoTLS(t, env.MosquittoOptions{})
	bridge := connectPeer(t, b, bridgeCN)
	bridge.publish(t, desiredWeb, true, "v1")

	var cut cutter
	nodeA := connectPeer(t, b, "node-a", persistentSession, cut.use)
	if nodeA.sessionPresent {
		t.Fatalf("a first connection found a session")
	}
	nodeA.subscribe(t, "outpost/v1/nodes/node-a/desired/#")
	nodeA.expect(t, desiredWeb, "v1")
	cut.cut(t, nodeA)
	bridge.publish(t, desiredWeb, true, "v2")
	bridge.Disconnect(250)
	b.Stop(t)
	b.Start(t)

	// No subscribe: the session has it, and v2 waited in its queue.
	nodeA = connectPeer(t, b, "node-a", persistentSession)
	if !nodeA.sessionPresent {
		t.Fatalf("node-a's session did not survive the restart")
	}
	m := nodeA.next(t)
	if string(m.Payload()) == "v1" && m.Duplicate() {
		// v1's PUBACK had not reached the broker before the cut: QoS 1
		// is at least once, and the session sends it again first.
		t.Logf("v1 came again (DUP) before v2")
		m = nodeA.next(t)
	}
	if m.Topic() != desiredWeb || string(m.Payload()) != "v2" || m.Retained() {
		t.Fatalf("node-a received %s %q (retain flag %v), want %s \"v2\" queued, without the retain flag", m.Topic(), m.Payload(), m.Retained(), desiredWeb)
	}
	bridge = connectPeer(t, b, bridgeCN)
	bridge.publish(t, desiredIndex, true, "index 2")
	nodeA.expect(t, desiredIndex, "index 2")
	nodeA.subscribe(t, "outpost/v1/nodes/node-a/desired/#")
	nodeA.expectSet(t, map[string]string{desiredWeb: "v2", desiredIndex: "index 2"}, true)
	nodeA.expectNothingMore(t)
	nodeA.Disconnect(250)
	bridge.Disconnect(250)

	b.Stop(t)
	b.RemovePersistence(t)
	b.Start(t)
	nodeA = connectPeer(t, b, "node-a", persistentSession)
	if nodeA.sessionPresent {
		t.Fatalf("node-a's session outlived the broker's database")
	}
}

// TestMosquittoQueueLimit: a persistent session away from the broker
// keeps at most max_queued_messages (plus the messages that were in
// flight) of what is published for it; the newest are dropped. This is
// what the bridge's session loses of the nodes' status while it is away.
func TestMosquittoQueueLimit(t *testing.T) {
	b := env.StartMosquittoTLS(t, env.MosquittoOptions{})
	queued := setting(t, b, "max_queued_messages")
	inflight := 20 // mosquitto's default max_inflight_messages
	if b.Setting("max_inflight_messages") != "" {
		inflight = setting(t, b, "max_inflight_messages")
	}
	sent := queued + inflight + 100

	var cut cutter
	bridge := connectPeer(t, b, bridgeCN, persistentSession, cut.use)
	bridge.subscribe(t, "outpost/v1/nodes/+/status/#")
	cut.cut(t, bridge)
	nodeA := connectPeer(t, b, "node-a")
	for i := range sent {
		tok := nodeA.Publish(fmt.Sprintf("outpost/v1/nodes/node-a/status/pods/default/p%d", i), 1, false, strconv.Itoa(i))
		if !tok.WaitTimeout(mqttTimeout) || tok.Error() != nil {
			t.Fatalf("publish %d: %v", i, tok.Error())
		}
	}

	bridge = connectPeer(t, b, bridgeCN, persistentSession)
	if !bridge.sessionPresent {
		t.Fatal("the bridge's session is gone")
	}
	// The queue is drained in order; once `queued` messages came, what is
	// left fits the queue, and a last message goes in after it.
	got := 0
	for ; got < queued; got++ {
		if m := bridge.next(t); string(m.Payload()) != strconv.Itoa(got) {
			t.Fatalf("message %d is %s %q, want the messages in the order published", got, m.Topic(), m.Payload())
		}
	}
	nodeA.publish(t, statusNode, false, "last")
	for {
		m := bridge.next(t)
		if m.Topic() == statusNode {
			break
		}
		if string(m.Payload()) != strconv.Itoa(got) {
			t.Fatalf("message %d is %s %q, want the messages in the order published", got, m.Topic(), m.Payload())
		}
		got++
	}
	t.Logf("published %d while the bridge was away; it received %d (max_queued_messages %d, max_inflight_messages %d)", sent, got, queued, inflight)
	if got < queued || got > queued+inflight {
		t.Fatalf("received %d of %d, want between %d and %d", got, sent, queued, queued+inflight)
	}
}

// TestMosquittoMessageSizeLimits: a payload of message_size_limit bytes is
// delivered; one byte more is acknowledged and dropped; a packet over
// max_packet_size closes the connection.
func TestMosquittoMessageSizeLimits(t *testing.T) {
	b := env.StartMosquittoTLS(t, env.MosquittoOptions{})
	limit := setting(t, b, "message_size_limit")
	packet := setting(t, b, "max_packet_size")
	if packet <= limit+65535+8 {
		t.Errorf("max_packet_size %d leaves no room for a %d-byte payload with the longest topic", packet, limit)
	}
	bridge := connectPeer(t, b, bridgeCN)
	bridge.subscribe(t, "outpost/v1/nodes/node-a/status/#")
	nodeA := connectPeer(t, b, "node-a")

	nodeA.publish(t, statusWeb, false, strings.Repeat("a", limit))
	if m := bridge.next(t); m.Topic() != statusWeb || len(m.Payload()) != limit {
		t.Fatalf("received %s with %d bytes, want %s with %d", m.Topic(), len(m.Payload()), statusWeb, limit)
	}
	nodeA.publish(t, statusWeb, false, strings.Repeat("b", limit+1))
	nodeA.publish(t, statusNode, false, "small")
	bridge.expect(t, statusNode, "small")

	nodeA.Publish(statusWeb, 1, false, strings.Repeat("c", packet))
	select {
	case err := <-nodeA.lost:
		t.Logf("a %d-byte payload closed the connection: %v", packet, err)
	case <-time.After(mqttTimeout):
		t.Fatalf("a packet over max_packet_size (%d) did not close the connection within %v", packet, mqttTimeout)
	}
	bridge.expectNothingMore(t)
}

// TestMosquittoScriptCertificates: the CA, broker and client certificates
// scripts/mqtt-certs.sh makes work with the shipped broker config: the
// bridge's and a node's, and one the test signs with the script's CA key.
func TestMosquittoScriptCertificates(t *testing.T) {
	env.RequireRoot(t)
	env.Tool(t, "openssl")
	dir := t.TempDir()
	script, err := filepath.Abs("../../scripts/mqtt-certs.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"server", "127.0.0.1", "localhost"}, {"client", "node-a"}, {"client", bridgeCN}} {
		cmd := exec.Command("bash", append([]string{script, "-d", dir}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("mqtt-certs.sh %v: %v\n%s", args, err, out)
		}
	}
	b := env.StartMosquittoTLS(t, env.MosquittoOptions{PKIDir: dir})
	scriptCert := func(name string) func(*mqtt.ClientOptions) {
		cert, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		cfg := b.TLSConfig(t, "")
		cfg.Certificates = []tls.Certificate{cert}
		return func(o *mqtt.ClientOptions) { o.SetTLSConfig(cfg) }
	}
	bridge := connectPeer(t, b, bridgeCN, scriptCert("outpost_bridge"))
	bridge.publish(t, desiredWeb, true, "pod web")
	nodeA := connectPeer(t, b, "node-a", scriptCert("node-a"))
	nodeA.subscribe(t, "outpost/v1/nodes/node-a/desired/#")
	nodeA.expect(t, desiredWeb, "pod web")
	// Only node-a's CN reads node-a's topics: the script's certificate
	// carried it.
	nodeB := connectPeer(t, b, "node-b")
	nodeB.subscribe(t, "outpost/v1/nodes/+/desired/#")
	bridge.publish(t, "outpost/v1/nodes/node-b/desired/index", true, "node-b's index")
	nodeB.expect(t, "outpost/v1/nodes/node-b/desired/index", "node-b's index")
	nodeB.expectNothingMore(t)
}

// TestMosquittoOnAHostLink: a broker listening on the host side of a
// veth reaches a client in another network namespace, which checks the
// broker's certificate against that address and presents a certificate
// from Issue (mosquitto_sub, libmosquitto's TLS, not Go's).
func TestMosquittoOnAHostLink(t *testing.T) {
	env.RequireRoot(t)
	sub := env.Tool(t, "mosquitto_sub")
	n := &node{t: t, netns: fmt.Sprintf("outpost-e2e-mqtt-%d", time.Now().UnixNano()%1e9)}
	run(t, "ip", "netns", "add", n.netns)
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", n.netns).Run() })
	nodeIP := n.hostLink()
	b := env.StartMosquittoTLS(t, env.MosquittoOptions{Host: hostSide(nodeIP)})
	if b.Host != hostSide(nodeIP) || !strings.HasPrefix(b.URL, "ssl://"+hostSide(nodeIP)+":") {
		t.Fatalf("broker at %s (%s), want it on %s", b.Addr, b.URL, hostSide(nodeIP))
	}
	bridge := connectPeer(t, b, bridgeCN)
	bridge.publish(t, desiredWeb, true, "pod web")

	cert, key := b.Issue(t, "node-a")
	_, port, _ := net.SplitHostPort(b.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), mqttTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", n.netns, sub, "-V", "mqttv311",
		"-h", b.Host, "-p", port, "--cafile", b.CAFile, "--cert", cert, "--key", key,
		"-t", "outpost/v1/nodes/node-a/desired/#", "-C", "1", "-W", "10", "-v").CombinedOutput()
	if err != nil {
		t.Fatalf("mosquitto_sub in %s: %v\n%s", n.netns, err, out)
	}
	if got, want := strings.TrimSpace(string(out)), desiredWeb+" pod web"; got != want {
		t.Fatalf("mosquitto_sub printed %q, want %q", got, want)
	}
}
