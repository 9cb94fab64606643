package mqtt

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/outpost-edge/outpost/internal/clock"
)

// Conn is one connection to the broker; the Syncer makes a new one for
// every connect. Its methods are safe for concurrent use.
type Conn interface {
	// Publish sends a QoS 1 message and waits for its PUBACK. A nil
	// error means the broker acknowledged it on this connection, which
	// was still up then.
	Publish(ctx context.Context, topic string, retained bool, payload []byte) error
	// Subscribe subscribes to the filters at QoS 1 and waits for the
	// SUBACK; a filter the broker refused is an error.
	Subscribe(ctx context.Context, filters ...string) error
	// Unsubscribe removes subscriptions and waits for the UNSUBACK.
	Unsubscribe(ctx context.Context, filters ...string) error
	// SessionPresent reports whether the broker still held the session.
	SessionPresent() bool
	// Done is closed when the connection is lost or closed.
	Done() <-chan struct{}
	// LastRead is when a byte last came from the broker.
	LastRead() time.Time
	// Close ends the connection; graceful sends a DISCONNECT first (the
	// Last Will is not published), otherwise the socket is closed.
	Close(graceful bool)
}

// Message is a message from the broker. Ack acknowledges it (a QoS 1
// PUBACK); until then the broker keeps it for this session.
type Message struct {
	Topic    string
	Payload  []byte
	Retained bool
	Ack      func()
}

// Will is the Last Will the broker publishes when the connection dies.
type Will struct {
	Topic    string
	Payload  []byte
	Retained bool
}

// Dialer connects to the broker. handle receives every message of the
// connection, on paho's goroutine: it must return at once.
type Dialer func(ctx context.Context, will Will, handle func(Message)) (Conn, error)

// PahoConfig says how to reach the broker.
type PahoConfig struct {
	// Brokers are tried in order: ssl://host:8883, tls://…, mqtts://…,
	// or tcp://host:1883 (mqtt://…) without TLS.
	Brokers []string
	// TLS is used for the TLS schemes.
	TLS *tls.Config
	// ClientID defaults to the node's name (the Syncer sets it).
	ClientID string
	// Username and Password, if the broker asks for them.
	Username, Password string
	// KeepAlive is MQTT's keepalive; the ping timeout is a third of it
	// (at least 5 s).
	KeepAlive time.Duration
	// ConnectTimeout bounds a connect, TLS handshake included, and each
	// write. By default a write has 30 s and a connect 30 s or KeepAlive
	// when that is shorter: a connect that started while the link was
	// down is given up in time for the next one to find the link back
	// within three keepalives, whatever the TCP retransmission schedule
	// of its SYN.
	ConnectTimeout time.Duration
	// Counter, if set, counts the bytes of every connection.
	Counter *ByteCounter
}

// ByteCounter counts bytes on the wire (MQTT and TLS, not TCP/IP).
type ByteCounter struct {
	In, Out atomic.Uint64
}

// PahoDialer returns a Dialer over paho.mqtt.golang: MQTT 3.1.1, a
// persistent session (clean session off), no automatic reconnect (the
// Syncer makes a new client each time), automatic acks off.
func PahoDialer(cfg PahoConfig) Dialer {
	// A write (a large message on a slow link) keeps the longer bound.
	writeTimeout := cfg.ConnectTimeout
	if cfg.ConnectTimeout <= 0 {
		writeTimeout = 30 * time.Second
		cfg.ConnectTimeout = writeTimeout
		if cfg.KeepAlive > 0 {
			cfg.ConnectTimeout = min(cfg.ConnectTimeout, cfg.KeepAlive)
		}
	}
	return func(ctx context.Context, will Will, handle func(Message)) (Conn, error) {
		c := &pahoConn{done: make(chan struct{})}
		c.lastRead.Store(wall.Now().UnixNano())
		opts := paho.NewClientOptions().
			SetClientID(cfg.ClientID).
			SetProtocolVersion(4).
			SetCleanSession(false).
			SetAutoReconnect(false).
			SetConnectRetry(false).
			SetResumeSubs(false).
			SetAutoAckDisabled(true).
			SetOrderMatters(true).
			SetKeepAlive(cfg.KeepAlive).
			SetPingTimeout(max(5*time.Second, cfg.KeepAlive/3)).
			SetConnectTimeout(cfg.ConnectTimeout).
			SetWriteTimeout(writeTimeout).
			SetStore(paho.NewMemoryStore()).
			SetCustomOpenConnectionFn(c.open(cfg)).
			SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) {
				handle(Message{Topic: m.Topic(), Payload: m.Payload(), Retained: m.Retained(), Ack: m.Ack})
			}).
			SetConnectionLostHandler(func(paho.Client, error) { c.lost() })
		for _, b := range cfg.Brokers {
			opts.AddBroker(b)
		}
		if cfg.Username != "" {
			opts.SetUsername(cfg.Username).SetPassword(cfg.Password)
		}
		if will.Topic != "" {
			opts.SetBinaryWill(will.Topic, will.Payload, 1, will.Retained)
		}
		c.client = paho.NewClient(opts)
		tok := c.client.Connect()
		if err := wait(ctx, tok, cfg.ConnectTimeout+5*time.Second); err != nil {
			c.client.Disconnect(0)
			c.lost()
			return nil, fmt.Errorf("connect to %v: %w", cfg.Brokers, err)
		}
		c.session = tok.(*paho.ConnectToken).SessionPresent()
		return c, nil
	}
}

type pahoConn struct {
	client   paho.Client
	session  bool
	lastRead atomic.Int64 // Unix nanoseconds
	done     chan struct{}
	once     sync.Once

	mu  sync.Mutex
	raw net.Conn // the socket, to close it hard
}

// open is paho's way to the broker: TCP, TLS for the TLS schemes, and
// the byte counting and last-read time the watchdog reads.
func (c *pahoConn) open(cfg PahoConfig) paho.OpenConnectionFunc {
	return func(u *url.URL, _ paho.ClientOptions) (net.Conn, error) {
		d := net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: -1}
		raw, err := d.Dial("tcp", u.Host)
		if err != nil {
			return nil, err
		}
		var nc net.Conn = &countingConn{Conn: raw, c: c, counter: cfg.Counter}
		switch u.Scheme {
		case "ssl", "tls", "mqtts", "tcps":
			tc := &tls.Config{}
			if cfg.TLS != nil {
				tc = cfg.TLS.Clone()
			}
			if tc.ServerName == "" {
				tc.ServerName = u.Hostname()
			}
			t := tls.Client(nc, tc)
			raw.SetDeadline(wall.Now().Add(cfg.ConnectTimeout))
			if err := t.Handshake(); err != nil {
				raw.Close()
				return nil, fmt.Errorf("tls handshake with %s: %w", u.Host, err)
			}
			raw.SetDeadline(time.Time{})
			nc = t
		case "tcp", "mqtt":
		default:
			raw.Close()
			return nil, fmt.Errorf("broker %s: scheme %q is not ssl, tls, mqtts or tcp", u.Redacted(), u.Scheme)
		}
		c.mu.Lock()
		c.raw = raw
		c.mu.Unlock()
		return nc, nil
	}
}

func (c *pahoConn) lost() { c.once.Do(func() { close(c.done) }) }

func (c *pahoConn) Publish(ctx context.Context, topic string, retained bool, payload []byte) error {
	if err := wait(ctx, c.client.Publish(topic, 1, retained, payload), 0); err != nil {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	// paho may complete a token without error across a lost
	// connection: only a PUBACK on a connection still up counts.
	select {
	case <-c.done:
		return fmt.Errorf("publish %s: connection lost", topic)
	default:
	}
	return nil
}

func (c *pahoConn) Subscribe(ctx context.Context, filters ...string) error {
	m := make(map[string]byte, len(filters))
	for _, f := range filters {
		m[f] = 1
	}
	tok := c.client.SubscribeMultiple(m, nil)
	if err := wait(ctx, tok, 0); err != nil {
		return fmt.Errorf("subscribe %v: %w", filters, err)
	}
	for f, q := range tok.(*paho.SubscribeToken).Result() {
		if q == 0x80 {
			return fmt.Errorf("subscribe %s: refused by the broker", f)
		}
	}
	return nil
}

func (c *pahoConn) Unsubscribe(ctx context.Context, filters ...string) error {
	if err := wait(ctx, c.client.Unsubscribe(filters...), 0); err != nil {
		return fmt.Errorf("unsubscribe %v: %w", filters, err)
	}
	return nil
}

func (c *pahoConn) SessionPresent() bool { return c.session }

func (c *pahoConn) Done() <-chan struct{} { return c.done }

func (c *pahoConn) LastRead() time.Time { return time.Unix(0, c.lastRead.Load()) }

func (c *pahoConn) Close(graceful bool) {
	if graceful {
		c.client.Disconnect(250)
	} else {
		c.mu.Lock()
		if c.raw != nil {
			c.raw.Close()
		}
		c.mu.Unlock()
		// Disconnect after the socket is gone sends nothing and stops
		// paho's goroutines.
		c.client.Disconnect(0)
	}
	c.lost()
}

// wall is the clock of sockets and paho's tokens, which only the real
// clock can drive.
var wall clock.Clock = clock.Real{}

// errTimeout is a wait that ran out: the connection is suspect.
var errTimeout = errors.New("no answer from the broker in time")

// wait waits for tok until ctx ends or, when d > 0, for d.
func wait(ctx context.Context, tok paho.Token, d time.Duration) error {
	var timeout <-chan time.Time
	if d > 0 {
		t := wall.NewTimer(d)
		defer t.Stop()
		timeout = t.C()
	}
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return ctx.Err()
	case <-timeout:
		return errTimeout
	}
}

// countingConn counts bytes and records when the broker last sent any.
type countingConn struct {
	net.Conn
	c       *pahoConn
	counter *ByteCounter
}

func (n *countingConn) Read(b []byte) (int, error) {
	k, err := n.Conn.Read(b)
	if k > 0 {
		n.c.lastRead.Store(wall.Now().UnixNano())
		if n.counter != nil {
			n.counter.In.Add(uint64(k))
		}
	}
	return k, err
}

func (n *countingConn) Write(b []byte) (int, error) {
	k, err := n.Conn.Write(b)
	if k > 0 && n.counter != nil {
		n.counter.Out.Add(uint64(k))
	}
	return k, err
}
