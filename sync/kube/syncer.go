package kube

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outpost-edge/outpost/internal/backoff"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/report"
	"github.com/outpost-edge/outpost/store"
)

// Config says which Node to sync and how fast.
type Config struct {
	// NodeName is the Node's name, and the spec.nodeName of its pods.
	NodeName string
	// Labels are added to the Node's labels (beside the well-known
	// kubernetes.io/{arch,os,hostname} and what NodeFacts says).
	Labels map[string]string
	// Taints are the Node's taints when it registers.
	Taints []corev1.Taint
	// WriteQPS and WriteBurst pace the writes a reconnect replays
	// (default 20 per second, burst 40).
	WriteQPS   float64
	WriteBurst int
	// EventQPS and EventBurst pace the events, in a bucket of their own
	// so that they never hold up a pod's status (default 10 per second,
	// burst 20).
	EventQPS   float64
	EventBurst int
	// StatusAfterPodsListed holds the status part (LoopStatus) until
	// the store's pods were listed once (their resume version is set),
	// when they are listed by someone else (the bridge's PodsFeed): a
	// status of a pod the store does not hold yet would be dropped.
	StatusAfterPodsListed bool
	// LeaseFirst renews a Lease that exists before the Node is read at
	// each connect: a bridge replica taking over a thousand nodes has
	// each say it is alive after two requests rather than three.
	LeaseFirst bool
	// Lease is the node's Lease as someone else read it a moment ago (a
	// bridge replica taking over nodes lists all their Leases at once):
	// with LeaseFirst, the first connect renews it with no read before,
	// and reads it only if it changed since. The Syncer takes it: the
	// caller keeps no use of it.
	Lease *coordv1.Lease
	// LeaseRenewed says Lease was renewed a moment ago (RenewLease),
	// so the first connect does not renew it again.
	LeaseRenewed bool
	// Offload has each loop do its work (requests, store reads) on a
	// goroutine of its own that ends with it, for a Syncer that is one of
	// thousands in a process (the bridge's, per node): a loop's own
	// goroutine, idle most of the time, then keeps the small stack of a
	// wait, not the largest its requests ever grew it to.
	Offload bool
	// LeaseDuration is the Lease's leaseDurationSeconds (default 40 s);
	// it is renewed every RenewInterval (default 10 s).
	LeaseDuration time.Duration
	RenewInterval time.Duration
	// NodeStatusPeriod is how often an unchanged NodeStatus is sent
	// anyway (default 5 min, KEP-589).
	NodeStatusPeriod time.Duration
	// Loops selects what Run runs; zero runs everything, as the agent
	// does. The MQTT bridge runs the node's parts for each MQTT node
	// and the Services part once for all.
	Loops Loops
}

// Loops selects the parts of a Syncer.
type Loops uint8

// The parts of a Syncer.
const (
	// LoopNode registers the Node and renews its Lease.
	LoopNode Loops = 1 << iota
	// LoopPods watches the node's pods, and the config maps and secrets
	// they use, into the store.
	LoopPods
	// LoopServices watches the Services and EndpointSlices of all
	// namespaces into the store.
	LoopServices
	// LoopStatus drains the journal into pod status patches, final
	// deletes, mirror pods and events.
	LoopStatus
	// LoopRefs watches the config maps and secrets the store's pods
	// use, when the pods come from elsewhere (a PodsFeed); LoopPods
	// includes it.
	LoopRefs
	// LoopAll is every part.
	LoopAll = LoopNode | LoopPods | LoopServices | LoopStatus
)

// defaultLeaseDuration is a node Lease's duration unless
// Config.LeaseDuration says otherwise, as kubelet's.
const defaultLeaseDuration = 40 * time.Second

func (c *Config) setDefaults() {
	if c.WriteQPS <= 0 {
		c.WriteQPS = 20
	}
	if c.WriteBurst <= 0 {
		c.WriteBurst = 2 * int(c.WriteQPS)
	}
	if c.EventQPS <= 0 {
		c.EventQPS = 10
	}
	if c.EventBurst <= 0 {
		c.EventBurst = 2 * int(c.EventQPS)
	}
	if c.LeaseDuration <= 0 {
		c.LeaseDuration = defaultLeaseDuration
	}
	if c.RenewInterval <= 0 {
		c.RenewInterval = 10 * time.Second
	}
	if c.NodeStatusPeriod <= 0 {
		c.NodeStatusPeriod = 5 * time.Minute
	}
	if c.Loops == 0 {
		c.Loops = LoopAll
	}
}

// NodeFacts is what the agent knows of the node: extra labels (the
// board's) and the status to publish, without the parts this package
// fills in itself.
type NodeFacts struct {
	Labels map[string]string
	// Annotations are set on the Node, never removed (an MQTT node's
	// seal key).
	Annotations map[string]string
	Status      corev1.NodeStatus
}

// Deps are what a Syncer talks to.
type Deps struct {
	Client *Client
	Store  *store.Store
	// NodeFacts returns the node's current facts; it is called for every
	// NodeStatus computed, so it should be cheap.
	NodeFacts func() NodeFacts
	Clock     clock.Clock
	Log       *slog.Logger
}

// Syncer connects the store to the API server. Its methods are safe for
// concurrent use.
type Syncer struct {
	cfg  Config
	deps Deps
	log  *slog.Logger

	writes *limiter
	// events paces the events apart from writes: the status sink takes
	// its tokens without waiting, so an event never delays a status.
	events *limiter

	mu   sync.Mutex
	link report.Link
	// nodeSynced says the Node and Lease were written since the link
	// last came up; changed is closed and replaced whenever link or
	// nodeSynced changes, so waiters can select on it.
	nodeSynced bool
	changed    chan struct{}
	// uid is the registered Node's UID (node.go: nodeUID).
	uid types.UID
	// forgotten counts the times the Node had to be created while the
	// node had been known to the API server (node.go: noteForgotten):
	// what the watches and the status sink know of the server is stale.
	forgotten uint64
	// resumed says the store held a pods resume version when the
	// Syncer was made: an earlier run synced the node with an API server.
	resumed bool
	// absent says the node is away (SetPresent): its Lease is not
	// renewed and nothing is written for it.
	absent bool

	// sink is what the status sink (status.go) shares: mirror pod
	// problems and buffered events.
	sink sinkState
}

// New returns a Syncer; it starts nothing until Run.
func New(cfg Config, deps Deps) (*Syncer, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("sync/kube: no node name")
	}
	if deps.Client == nil || deps.Store == nil || deps.Clock == nil {
		return nil, errors.New("sync/kube: client, store and clock are required")
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.NodeFacts == nil {
		deps.NodeFacts = func() NodeFacts { return NodeFacts{} }
	}
	cfg.setDefaults()
	s := &Syncer{cfg: cfg, deps: deps, log: deps.Log, changed: make(chan struct{})}
	s.writes = newLimiter(deps.Clock, cfg.WriteQPS, cfg.WriteBurst)
	s.events = newLimiter(deps.Clock, cfg.EventQPS, cfg.EventBurst)
	s.link = report.Link{Server: deps.Client.Config.Host, Since: deps.Clock.Now()}
	// Read before any loop runs: the pods watch of this run sets it.
	if rv, err := deps.Store.ResumeVersion(podsResource); err == nil && rv != "" {
		s.resumed = true
	}
	return s, nil
}

// Run syncs until ctx ends and returns after every goroutine it started
// has exited. An unreachable API server is not an error: Run keeps
// retrying, and the pods keep running from the store.
func (s *Syncer) Run(ctx context.Context) error {
	var parts []func(context.Context)
	for _, l := range []struct {
		part Loops
		run  func(context.Context)
	}{
		{LoopNode, s.runNode}, {LoopPods, s.runPods}, {LoopServices, s.runServices},
		{LoopServices, s.runEndpointSlices}, {LoopStatus, s.runStatus}, {LoopRefs, s.runRefs},
	} {
		if s.cfg.Loops&l.part != 0 {
			parts = append(parts, l.run)
		}
	}
	if len(parts) == 0 {
		return nil
	}
	// The first part runs in Run's own goroutine: the bridge runs two
	// Syncers for every node it serves, and a goroutine that only waits
	// costs its stack for each.
	var wg sync.WaitGroup
	for _, run := range parts[1:] {
		wg.Go(func() { run(ctx) })
	}
	parts[0](ctx)
	wg.Wait()
	return nil
}

// offload runs f, on a goroutine of its own when Config.Offload is set,
// and returns when f has.
func (s *Syncer) offload(f func()) {
	if !s.cfg.Offload {
		f()
		return
	}
	Offload(f)
}

// Offload runs f on a goroutine of its own and returns when f has: a
// goroutine that waits most of the time, one of thousands, then keeps
// the small stack of a wait, not the largest f grew it to.
func Offload(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

// SetPresent says whether the node is there. A node that is away has its
// Lease left to expire, so the node lifecycle controller marks it
// NotReady in the normal way, and nothing is written for it until it is
// back; then the Node's status and Lease go first, as after a reconnect.
// The agent is always present; the MQTT bridge follows the node's online
// topic.
func (s *Syncer) SetPresent(present bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.absent == !present {
		return
	}
	s.absent = !present
	if s.absent {
		s.nodeSynced = false
	}
	s.broadcast()
}

// waitPresent blocks until the node is present.
func (s *Syncer) waitPresent(ctx context.Context) error {
	for {
		s.mu.Lock()
		ok, ch := !s.absent, s.changed
		s.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// presence returns whether the node is present and a channel closed at
// the next change of the link or presence.
func (s *Syncer) presence() (bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.absent, s.changed
}

// Link returns the state of the connection.
func (s *Syncer) Link() report.Link {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.link
}

// broadcast wakes everything waiting on a link change; s.mu is held.
func (s *Syncer) broadcast() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// setConnected records the outcome of a Lease renewal.
func (s *Syncer) setConnected(ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.deps.Clock.Now()
	if ok {
		s.link.LastLease = now
	}
	if s.link.Connected == ok {
		return
	}
	s.link.Connected, s.link.Since = ok, now
	if !ok {
		s.nodeSynced = false
	}
	switch {
	case ok:
		s.log.Info("api server reachable", "server", s.link.Server)
	case !s.absent:
		// A node that went away (SetPresent) says so itself.
		s.log.Warn("api server unreachable; pods keep running from the store", "server", s.link.Server, "err", s.link.LastError)
	}
	s.broadcast()
}

// setNodeSynced records that the Node's status and Lease were written
// since the link came up, which lets the replay of pod statuses begin.
func (s *Syncer) setNodeSynced() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.nodeSynced {
		s.nodeSynced = true
		s.broadcast()
	}
}

// waitNodeSynced blocks until the link is up and the Node was written
// since, so pod statuses never reach the API server before the node's.
func (s *Syncer) waitNodeSynced(ctx context.Context) error {
	for {
		s.mu.Lock()
		ok, ch := s.link.Connected && s.nodeSynced && !s.absent, s.changed
		s.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// noteErr records a failed request for `outpost status`.
func (s *Syncer) noteErr(err error) {
	if err == nil || errors.Is(err, context.Canceled) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.link.LastError, s.link.LastErrorAt = err.Error(), s.deps.Clock.Now()
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

// newReconnectBackoff is the 1 s to 2 min.
func newReconnectBackoff() backoff.Backoff {
	return backoff.Backoff{Min: time.Second, Max: 2 * time.Minute}
}

// limiter is a token bucket on the injected clock.
type limiter struct {
	clock  clock.Clock
	mu     sync.Mutex
	rate   float64 // tokens per second
	burst  float64
	tokens float64
	last   time.Time
}

func newLimiter(c clock.Clock, qps float64, burst int) *limiter {
	return &limiter{clock: c, rate: qps, burst: float64(burst), tokens: float64(burst), last: c.Now()}
}

// take takes one token if the bucket has one, or else says how long
// until it will.
func (l *limiter) take() (ok bool, after time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	l.tokens = min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.rate)
	l.last = now
	if l.tokens >= 1 {
		l.tokens--
		return true, 0
	}
	return false, max(time.Millisecond, time.Duration((1-l.tokens)/l.rate*float64(time.Second)))
}

// wait takes one token, waiting for it if the bucket is empty.
func (l *limiter) wait(ctx context.Context) error {
	for {
		ok, need := l.take()
		if ok {
			return nil
		}
		t := l.clock.NewTimer(need)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C():
		}
	}
}
