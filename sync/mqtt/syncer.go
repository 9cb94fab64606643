package mqtt

import (
	"context"
	"crypto/ed25519"
	"errors"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/internal/backoff"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/report"
	"github.com/outpost-edge/outpost/store"
)

// Config says which node to sync and how.
type Config struct {
	// NodeName names the node's topics.
	NodeName string
	// Broker is shown as the link's peer (the first broker URL).
	Broker string
	// KeepAlive is MQTT's keepalive (default 60 s); a connection the
	// broker sent nothing on for three of them is dropped and made anew,
	// and the reconnect backoff never grows past two of them (nor past
	// maxBackoff), so a link that comes back is used again within three;
	// a broker that refuses connections is tried every second or so for
	// the first minutes of an outage (Redial).
	KeepAlive time.Duration
	// MaxMessageBytes refuses larger messages (default 1 MiB).
	MaxMessageBytes int
	// NodeStatusCheck is how often the node's facts are read to see
	// whether its status changed (default 10 s). Only a change is
	// published: the bridge refreshes the heartbeats itself.
	NodeStatusCheck time.Duration
	// RequestTimeout bounds every publish, subscribe and unsubscribe
	// (default 30 s); one that runs out drops the connection.
	RequestTimeout time.Duration
	// TrustedKeys are the bridge's public keys (mqtt.trustedKeys): when
	// set, every desired message must be signed by one of them (guard).
	TrustedKeys []ed25519.PublicKey
	// SealKey opens the Secrets the bridge seals to this node; its
	// public half goes out on status/node (AnnotationSealKey). Nil: the
	// node refuses sealed Secrets and asks for none.
	SealKey *SealKey
}

func (c *Config) setDefaults() {
	if c.KeepAlive <= 0 {
		c.KeepAlive = 60 * time.Second
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 1 << 20
	}
	if c.NodeStatusCheck <= 0 {
		c.NodeStatusCheck = 10 * time.Second
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 30 * time.Second
	}
}

// NodeFacts is what the agent knows of the node: the board's labels and
// the status to publish.
type NodeFacts struct {
	Labels map[string]string
	Status corev1.NodeStatus
}

// Deps are what a Syncer talks to.
type Deps struct {
	Dial      Dialer
	Store     *store.Store
	NodeFacts func() NodeFacts
	Clock     clock.Clock
	Log       *slog.Logger
	// Wire, if set, is the byte counter the Dialer counts into, for
	// metrics.
	Wire *ByteCounter
	// Tunnel, if set, serves the kubelet API streams the bridge opens
	// (rpc.go); its frames go out with PublishFrame.
	Tunnel Tunnel
}

// Syncer connects the store to the broker. Its methods are safe for
// concurrent use.
type Syncer struct {
	cfg  Config
	deps Deps
	log  *slog.Logger
	m    metrics
	keys *Keyring // nil: signatures are not checked

	mu   sync.Mutex
	link report.Link
	// conn is the connection of the session running, nil between them:
	// PublishFrame's.
	conn Conn

	events eventQueue
	// sent are the pods whose status this agent published, by
	// namespace/name; only the session's drain uses it, one session at
	// a time.
	sent map[string]bool
}

// New returns a Syncer; it starts nothing until Run.
func New(cfg Config, deps Deps) (*Syncer, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("sync/mqtt: no node name")
	}
	if deps.Dial == nil || deps.Store == nil || deps.Clock == nil {
		return nil, errors.New("sync/mqtt: dialer, store and clock are required")
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.NodeFacts == nil {
		deps.NodeFacts = func() NodeFacts { return NodeFacts{} }
	}
	cfg.setDefaults()
	s := &Syncer{cfg: cfg, deps: deps, log: deps.Log, sent: map[string]bool{}, keys: NewKeyring(cfg.TrustedKeys...)}
	s.m.init()
	s.link = report.Link{Transport: "mqtt", Server: cfg.Broker, Since: deps.Clock.Now()}
	s.events.wake = make(chan struct{}, 1)
	return s, nil
}

// Run syncs until ctx ends and returns after every goroutine it started
// has exited. A broker that cannot be reached is not an error: Run keeps
// trying, and the pods keep running from the store. On the way out it
// publishes the node offline and disconnects cleanly.
func (s *Syncer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { s.runNodeStatus(ctx) })
	wg.Go(func() { s.runLink(ctx) })
	wg.Wait()
	return nil
}

// Link returns the state of the connection.
func (s *Syncer) Link() report.Link {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.link
}

func (s *Syncer) setConnected(ok, session bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.link.Connected == ok {
		return
	}
	s.link.Connected, s.link.Since = ok, s.deps.Clock.Now()
	if ok {
		s.log.Info("mqtt broker connected", "broker", s.link.Server, "session", session)
	} else {
		s.log.Warn("mqtt broker lost; pods keep running from the store", "broker", s.link.Server, "err", s.link.LastError)
	}
}

func (s *Syncer) noteErr(err error) {
	if err == nil || errors.Is(err, context.Canceled) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.link.LastError, s.link.LastErrorAt = err.Error(), s.deps.Clock.Now()
}

func (s *Syncer) notePublished() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.link.LastPublish = s.deps.Clock.Now()
}

// runLink connects, runs a session until the connection ends, and
// connects again after a Redial delay, until ctx ends.
func (s *Syncer) runLink(ctx context.Context) {
	rd := Redial{
		Backoff: backoff.Backoff{Min: time.Second, Max: max(time.Second, min(maxBackoff, 2*s.cfg.KeepAlive))},
		Clock:   s.deps.Clock,
	}
	will := Will{Topic: OnlineTopic(s.cfg.NodeName), Payload: []byte(OnlineFalse), Retained: true}
	for ctx.Err() == nil {
		in := NewInbox(MaxInboxBytes)
		rpcDown := RPCDownTopic(s.cfg.NodeName)
		conn, err := s.deps.Dial(ctx, will, func(m Message) {
			if m.Topic == rpcDown {
				s.rpc(m)
				return
			}
			in.Put(m)
		})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.noteErr(err)
			s.setConnected(false, false)
			wait := rd.Next(err)
			s.log.Debug("mqtt connect failed; retrying", "in", wait, "err", err)
			if s.sleep(ctx, wait) != nil {
				return
			}
			continue
		}
		// The first connection of a run publishes the node's status
		// anyway (runNodeStatus).
		resend := s.m.connects.Add(1) > 1
		start := s.deps.Clock.Now()
		err = s.session(ctx, conn, in, resend)
		if ctx.Err() != nil {
			s.goOffline(conn)
			s.setConnected(false, false)
			return
		}
		conn.Close(false)
		s.noteErr(err)
		s.setConnected(false, false)
		if s.deps.Clock.Since(start) > 3*s.cfg.KeepAlive {
			rd.Reset()
		}
		if s.sleep(ctx, rd.Next(err)) != nil {
			return
		}
	}
}

// goOffline says the node is offline (a clean shutdown publishes no Last
// Will) and disconnects.
func (s *Syncer) goOffline(conn Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := conn.Publish(ctx, OnlineTopic(s.cfg.NodeName), true, []byte(OnlineFalse)); err != nil {
		s.log.Warn("mqtt: could not say the node is going offline; the broker's Last Will will", "err", err)
	}
	conn.Close(true)
}

// session runs one connection: subscribe, say online, then drain the
// journal and apply what comes in until the connection ends or ctx does.
// resendStatus says a broker with no session of the node gets its status
// again. It returns why the connection ended.
func (s *Syncer) session(ctx context.Context, conn Conn, in *Inbox, resendStatus bool) error {
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	node := s.cfg.NodeName
	if !conn.SessionPresent() {
		// A new session: the broker sends every retained object of the
		// subscriptions, the indexes among them.
		err := s.request(sctx, func(ctx context.Context) error {
			return conn.Subscribe(ctx, Prefix+"nodes/"+node+"/desired/#", Prefix+"cluster/"+KindServices+"/#", Prefix+"cluster/"+KindEndpointSlices+"/#")
		})
		if err != nil {
			return err
		}
		// A broker with no session of the node may have lost what it
		// retained too (its persistence file): the node's status goes
		// again, as a bridge started later registers the Node from it
		// and would otherwise wait for its next change.
		if resendStatus {
			s.journalNodeStatus()
		}
	}
	// Subscribing again to a filter the session has makes the broker send
	// its retained message again (MQTT 3.1.1, 3.8.4): the indexes, which
	// say what the queue may have dropped while the node was away.
	if err := s.request(sctx, func(ctx context.Context) error {
		return conn.Subscribe(ctx, NodeIndexTopic(node), ClusterIndexTopic)
	}); err != nil {
		return err
	}
	if s.deps.Tunnel != nil {
		// Frames are of streams this connection carries, and each
		// subscribe is asked anew: a node that stops serving the
		// kubelet API is sent none.
		if err := s.request(sctx, func(ctx context.Context) error { return conn.Subscribe(ctx, RPCDownTopic(node)) }); err != nil {
			return err
		}
		s.mu.Lock()
		s.conn = conn
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.conn = nil
			s.mu.Unlock()
			s.deps.Tunnel.Reset(errors.New("the node's link to the broker was lost"))
		}()
	}
	if err := s.publish(sctx, conn, OnlineTopic(node), true, []byte(OnlineTrue), "online"); err != nil {
		return err
	}
	s.setConnected(true, conn.SessionPresent())
	var wg sync.WaitGroup
	fail := func(err error) {
		if err != nil && sctx.Err() == nil {
			cancel(err)
		}
	}
	wg.Go(func() { fail(s.drain(sctx, conn)) })
	wg.Go(func() { fail(s.process(sctx, conn, in)) })
	wg.Go(func() { fail(s.watchdog(sctx, conn)) })
	select {
	case <-sctx.Done():
	case <-conn.Done():
		cancel(errors.New("connection lost"))
	}
	wg.Wait()
	if err := context.Cause(sctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// request runs one request of the connection within RequestTimeout.
func (s *Syncer) request(ctx context.Context, fn func(context.Context) error) error {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	return fn(rctx)
}

// publish sends a message and counts it.
func (s *Syncer) publish(ctx context.Context, conn Conn, topic string, retained bool, payload []byte, kind string) error {
	err := s.request(ctx, func(ctx context.Context) error { return conn.Publish(ctx, topic, retained, payload) })
	if err != nil {
		return err
	}
	s.m.out(kind, len(topic)+len(payload))
	return nil
}

// watchdog drops a connection the broker has sent nothing on for three
// keepalives: paho pings an idle connection every keepalive, so a live
// one always hears something, and a client stuck after a missed
// PINGRESP (paho#552) is replaced rather than trusted.
func (s *Syncer) watchdog(ctx context.Context, conn Conn) error {
	tick := s.deps.Clock.NewTicker(s.cfg.KeepAlive / 2)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
		}
		if quiet := wall.Since(conn.LastRead()); quiet > 3*s.cfg.KeepAlive {
			s.m.watchdog.Add(1)
			return errors.New("mqtt watchdog: nothing from the broker for " + quiet.Round(time.Second).String())
		}
	}
}

// sleep waits d on the injected clock, or until ctx ends.
func (s *Syncer) sleep(ctx context.Context, d time.Duration) error {
	t := s.deps.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}

// maxBackoff bounds the wait between two connects for a long keepalive.
const maxBackoff = 2 * time.Minute
