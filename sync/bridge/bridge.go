package bridge

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/internal/backoff"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/sync/kube"
	"github.com/outpost-edge/outpost/sync/mqtt"
	"github.com/outpost-edge/outpost/sync/mqtt/tunnel"
)

// LabelTransport marks the Nodes the bridge keeps: outpost.io/transport=mqtt.
const LabelTransport = "outpost.io/transport"

// Config says how the bridge works.
type Config struct {
	// Dir is the scratch directory: a store per node, emptied at start.
	Dir string
	// KeepAlive is MQTT's keepalive (default 60 s); the reconnect
	// backoff never grows past two of them (nor past a minute).
	KeepAlive time.Duration
	// MaxMessageBytes refuses larger messages (default 1 MiB).
	MaxMessageBytes int
	// Labels are added to every MQTT node's Node, beside
	// outpost.io/transport=mqtt.
	Labels map[string]string
	// WriteQPS and WriteBurst pace each node's writes, as the agent's.
	WriteQPS   float64
	WriteBurst int
	// IndexWait is how long after subscribing the retained indexes may
	// take to arrive before the bridge takes the broker to hold none
	// (default 2 s).
	IndexWait time.Duration
	// RequestTimeout bounds each publish and subscribe (default 30 s).
	RequestTimeout time.Duration
	// Signer, if set, signs every desired envelope (mqtt.trustedKeys on
	// the nodes holds its public key), and deletes are signed
	// tombstones.
	Signer *mqtt.Signer
	// Shards, if above 0, splits the nodes among replicas of the bridge
	// by Leases in Namespace (shard.go); Identity names this replica.
	// At 0 this bridge serves every node, alone.
	Shards    int
	Namespace string
	Identity  string
	// Kubelet, with an Address, has the bridge serve its nodes' kubelet
	// API (kubelet.go).
	Kubelet KubeletAPI
}

func (c *Config) setDefaults() {
	if c.KeepAlive <= 0 {
		c.KeepAlive = 60 * time.Second
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 1 << 20
	}
	if c.IndexWait <= 0 {
		c.IndexWait = 2 * time.Second
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 30 * time.Second
	}
}

// Deps are what the bridge talks to.
type Deps struct {
	Client *kube.Client
	Dial   mqtt.Dialer
	Clock  clock.Clock
	Log    *slog.Logger
}

// Bridge connects MQTT nodes to the API server. Its methods are safe for
// concurrent use.
type Bridge struct {
	cfg  Config
	deps Deps
	log  *slog.Logger

	mu    sync.Mutex
	nodes map[string]*node
	// conn is the broker connection, nil while there is none; ready says
	// the retained indexes of this connection were read (or IndexWait
	// passed), so publishers know what the broker holds.
	conn    mqtt.Conn
	ready   bool
	changed chan struct{}
	// retained are the indexes the broker holds, by index topic.
	retained map[string]heldIndex
	// fetches are the retained messages a fetchRetained waits for, by
	// topic.
	fetches map[string]chan<- mqtt.Message
	// gen is the last generation issued (nextGen).
	gen uint64
	// run is the context node goroutines run in; wg waits for them.
	run context.Context
	wg  sync.WaitGroup

	cluster *publisher
	stats   Stats
	// own checks what the bridge signed itself (Config.Signer), nil
	// without a signer.
	own *mqtt.Keyring
	// vault is the bridge's own seal key (its copies of the pods'
	// tokens), derived from the signing key; nil without a signer.
	vault *mqtt.SealKey
	// hashKey keys the index hashes of sealed Secrets: derived from the
	// signing key, else random (a restarted bridge then sends every
	// sealed Secret again).
	hashKey []byte
	// held are the shards this replica serves (Config.Shards > 0);
	// heard are the nodes it heard of on the broker, served or not, with
	// their last online flag and Node status, which a node taken over
	// starts from.
	held  map[int]bool
	heard map[string]*heard
	// leases are the Leases of the nodes of the shards just taken, as
	// one list read them (listNodeLeases), each kept until its node
	// starts from it or the shard's nodes all started.
	leases map[string]*listedLease
	// clusterStop stops the cluster publisher (shard 0's holder runs
	// it); only the sharder's goroutine uses it.
	clusterStop func()
	// feed watches the pods of every node served, with one watch.
	feed *kube.PodsFeed
	// tunnel and kubelet are the nodes' kubelet API (Config.Kubelet):
	// the streams to the nodes and the server in front of them, both
	// nil without it and until Run; ports are the nodes' ports at this
	// bridge, and knownPorts those their Nodes had.
	tunnel     *tunnel.Dialer
	kubelet    *kubeletServer
	ports      map[int]string
	knownPorts map[string]int
}

// listedLease is a node's Lease as listNodeLeases read it, or as
// renewTaken renewed it since (renewed).
type listedLease struct {
	lease   *coordv1.Lease
	renewed bool
}

// Stats are the bridge's counters.
type Stats struct {
	Published, Statuses, Rejected, Nodes int
}

// New returns a Bridge; it starts nothing until Run.
func New(cfg Config, deps Deps) (*Bridge, error) {
	if cfg.Dir == "" {
		return nil, errors.New("sync/bridge: no scratch directory")
	}
	if deps.Client == nil || deps.Dial == nil || deps.Clock == nil {
		return nil, errors.New("sync/bridge: client, dialer and clock are required")
	}
	if cfg.Shards > 0 {
		if err := checkIdentity(cfg.Identity); err != nil {
			return nil, fmt.Errorf("sync/bridge: replica identity: %w", err)
		}
		if cfg.Namespace == "" {
			return nil, errors.New("sync/bridge: shards need a namespace for their Leases")
		}
	}
	if k := cfg.Kubelet; k.enabled() {
		if net.ParseIP(k.Address) == nil {
			return nil, fmt.Errorf("sync/bridge: kubelet api address %q: not an IP address", k.Address)
		}
		if k.FirstPort <= 0 || k.LastPort > 65535 || k.FirstPort > k.LastPort {
			return nil, fmt.Errorf("sync/bridge: kubelet api ports %d-%d: not a range of ports", k.FirstPort, k.LastPort)
		}
		if k.Check == nil || len(k.Certificate.Certificate) == 0 {
			return nil, errors.New("sync/bridge: the kubelet api needs a check and a serving certificate")
		}
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	cfg.setDefaults()
	b := &Bridge{
		cfg: cfg, deps: deps, log: deps.Log, nodes: map[string]*node{},
		changed: make(chan struct{}), retained: map[string]heldIndex{}, fetches: map[string]chan<- mqtt.Message{},
		held: map[int]bool{}, heard: map[string]*heard{},
		ports: map[int]string{}, knownPorts: map[string]int{},
	}
	if cfg.Signer != nil {
		b.own = mqtt.NewKeyring(cfg.Signer.Public())
		b.vault, b.hashKey = cfg.Signer.SealKey(), cfg.Signer.HashKey()
	} else {
		b.hashKey = make([]byte, 32)
		rand.Read(b.hashKey)
	}
	return b, nil
}

// seal lays out e for topic, signed when the bridge has a signer.
func (b *Bridge) seal(topic string, e mqtt.Envelope) []byte {
	if b.cfg.Signer == nil {
		return e.Marshal()
	}
	return b.cfg.Signer.Seal(topic, e)
}

// checkOwn reports whether payload (decoded as e) at topic was signed
// by the bridge's own key; always true without a signer.
func (b *Bridge) checkOwn(topic string, payload []byte, e mqtt.Envelope) error {
	if b.own == nil {
		return nil
	}
	_, err := b.own.Verify(topic, payload, e)
	return err
}

// Stats returns the bridge's counters.
func (b *Bridge) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.stats
	s.Nodes = len(b.nodes)
	return s
}

// Run bridges until ctx ends and returns after every goroutine it
// started has exited.
func (b *Bridge) Run(ctx context.Context) error {
	if err := os.RemoveAll(b.cfg.Dir); err != nil {
		return fmt.Errorf("empty scratch directory %s: %w", b.cfg.Dir, err)
	}
	if err := os.MkdirAll(filepath.Join(b.cfg.Dir, "nodes"), 0o700); err != nil {
		return fmt.Errorf("scratch directory: %w", err)
	}
	cst, err := store.Open(filepath.Join(b.cfg.Dir, "cluster.db"), store.Options{SkipCheck: true, Scratch: true})
	if err != nil {
		return err
	}
	defer cst.Close()
	services, err := kube.New(kube.Config{NodeName: "outpost-bridge", Loops: kube.LoopServices},
		kube.Deps{Client: b.deps.Client, Store: cst, Clock: b.deps.Clock, Log: b.log.With("scope", "cluster")})
	if err != nil {
		return err
	}
	feed, err := kube.NewPodsFeed(kube.Deps{Client: b.deps.Client, Store: cst, Clock: b.deps.Clock, Log: b.log.With("scope", "pods")})
	if err != nil {
		return err
	}
	if b.cfg.Kubelet.enabled() {
		if err := b.startKubelet(); err != nil {
			return err
		}
		defer b.stopKubelet()
	}
	b.mu.Lock()
	b.run = ctx
	b.feed = feed
	b.cluster = &publisher{b: b, scope: mqtt.ScopeCluster, st: cst, wake: make(chan struct{}, 1)}
	b.mu.Unlock()
	b.wg.Go(func() { feed.Run(ctx) })
	b.wg.Go(func() { services.Run(ctx) })
	b.wg.Go(func() { b.runLink(ctx) })
	b.wg.Go(func() { b.unmapStores(ctx, cst) })
	if b.cfg.Shards > 0 {
		b.log.Info("bridge replica sharing the fleet", "identity", b.cfg.Identity, "shards", b.cfg.Shards, "namespace", b.cfg.Namespace)
		sh := newSharder(b)
		b.wg.Go(func() { sh.run(ctx) })
	} else {
		b.wg.Go(func() { b.cluster.loop(ctx) })
		b.wg.Go(func() { b.adoptNodes(ctx) })
	}
	<-ctx.Done()
	b.wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, n := range b.nodes {
		n.st.Close()
	}
	return nil
}

// unmapEvery is how often the bridge unmaps its stores' pages
// (store.Unmap, which skips a store unused since): a node's store is read
// through once when the node starts or its pods change, and little
// between. At 10 s, the pages of the nodes started in the last 10 s
// (2,000 starting at once) put 17 MiB on the bridge's RSS.
const unmapEvery = 2 * time.Second

// unmapStores unmaps the pages of every store (the nodes' and the
// cluster's) every unmapEvery until ctx ends, so the bridge's RSS holds
// what it read lately, not every page of a store per node; it also
// forgets the pod statuses heard of nodes not served once they are older
// than recentKeep.
func (b *Bridge) unmapStores(ctx context.Context, cluster *store.Store) {
	t := b.deps.Clock.NewTicker(unmapEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		b.mu.Lock()
		stores := []*store.Store{cluster}
		for _, n := range b.nodes {
			if n.st != nil {
				stores = append(stores, n.st)
			}
		}
		now := b.deps.Clock.Now()
		for _, h := range b.heard {
			h.pruneRecent(now)
		}
		b.mu.Unlock()
		for _, st := range stores {
			// A node handed over meanwhile has its store closed: bbolt
			// says so, and there is nothing to unmap.
			st.Unmap()
		}
	}
}

// owns reports whether this replica serves node name; b.mu is held.
func (b *Bridge) owns(name string) bool {
	return b.cfg.Shards <= 0 || b.held[ShardOf(name, b.cfg.Shards)]
}

// gainShards starts serving shards (just taken): the nodes of them
// heard of on the broker (from what was heard of them) and those the
// API server knows, then reads what the broker retains of the nodes
// heard too little of; shard 0 also runs the cluster publisher. Before
// any of those nodes starts, their Leases are listed and those of the
// nodes heard online renewed (listNodeLeases, renewTaken), on a
// goroutine of their own. The sharder's goroutine calls it.
func (b *Bridge) gainShards(shards []int) {
	in := map[int]bool{}
	b.mu.Lock()
	for _, i := range shards {
		in[i] = true
		b.held[i] = true
	}
	ctx := b.run
	// The nodes heard of start at once, from what was heard of them;
	// what the broker retains is read again only of those of which this
	// replica heard too little (no Node status or online flag). Reading
	// it again for every node taken (30,000 retained statuses for 1,000
	// nodes) overran the broker's queue for the bridge
	// (max_queued_messages), which then dropped them and live statuses
	// of other nodes alike; the pod statuses of the move are what was
	// heard lately (heard.recent).
	var names, unknown []string
	for name, h := range b.heard {
		if in[ShardOf(name, b.cfg.Shards)] {
			names = append(names, name)
			if h.status == nil || !h.known {
				unknown = append(unknown, name)
			}
		}
	}
	b.mu.Unlock()
	if in[0] {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		b.wg.Go(func() {
			defer close(done)
			b.cluster.loop(cctx)
		})
		b.clusterStop = func() { cancel(); <-done }
	}
	b.wg.Go(func() {
		defer b.forgetLeases(in)
		// Here, not in the sharder's round: the list of a thousand
		// Leases must not hold back the renewals of the shards.
		b.listNodeLeases(ctx, in)
		b.renewTaken(ctx, in)
		for _, name := range names {
			if ctx.Err() != nil {
				return
			}
			b.ensureNode(name)
		}
		if len(unknown) > 0 {
			b.wg.Go(func() { b.reread(ctx, unknown) })
		}
		b.adoptNodes(ctx)
	})
}

// Renewing the Leases of the nodes taken over.
const (
	// takenRenewers is how many renewals go at once.
	takenRenewers = 32
	// takenRenewWait bounds them all: the nodes left start anyway, and
	// each renews its own Lease.
	takenRenewWait = 2 * RenewInterval
)

// renewTaken renews the listed Leases (listNodeLeases) of the nodes of
// shards (in, just taken) heard online, before any of them starts:
// each node then starts from its Lease renewed (kube.Config.LeaseRenewed).
// Started at once, a thousand nodes' Leases waited for their stores,
// their publishers' first passes and their pods listed, and were all
// renewed only 8 s after the shards were taken; their renewals alone,
// with nothing else asked of the API server, take a second or two.
func (b *Bridge) renewTaken(ctx context.Context, in map[int]bool) {
	var names []string
	b.mu.Lock()
	for name := range b.leases {
		if h := b.heard[name]; in[ShardOf(name, b.cfg.Shards)] && h != nil && h.known && h.online {
			names = append(names, name)
		}
	}
	b.mu.Unlock()
	if len(names) == 0 {
		return
	}
	start := b.deps.Clock.Now()
	rctx, cancel := context.WithTimeout(ctx, takenRenewWait)
	defer cancel()
	work := make(chan string)
	var renewed, failed atomic.Int64
	var wg sync.WaitGroup
	for range min(takenRenewers, len(names)) {
		wg.Go(func() {
			for name := range work {
				b.mu.Lock()
				l := b.leases[name]
				ok := l != nil && !l.renewed && b.owns(name) && b.nodes[name] == nil
				b.mu.Unlock()
				if !ok {
					continue
				}
				got, err := kube.RenewLease(rctx, b.deps.Client, l.lease, b.deps.Clock.Now())
				if err != nil {
					// Its node's Syncer renews it, read again on a
					// conflict.
					failed.Add(1)
					continue
				}
				renewed.Add(1)
				b.mu.Lock()
				if b.leases[name] == l {
					b.leases[name] = &listedLease{lease: got, renewed: true}
				}
				b.mu.Unlock()
			}
		})
	}
	for _, name := range names {
		if rctx.Err() != nil {
			break
		}
		work <- name
	}
	close(work)
	wg.Wait()
	b.log.Info("leases of the nodes taken renewed", "nodes", len(names), "renewed", renewed.Load(), "failed", failed.Load(),
		"took", b.deps.Clock.Since(start).Round(time.Millisecond))
}

// listNodeLeases reads, with one list, the Leases of the nodes of the
// shards in (just taken), for each node's Syncer to renew with no read of its own
// (kube.Config.Lease): a thousand reads fewer for the API server while
// a dead replica's nodes move. The list is served from the API server's
// cache (resourceVersion 0): a Lease changed since is read again at its
// renewal's conflict. Without it, each node reads its own.
func (b *Bridge) listNodeLeases(ctx context.Context, in map[int]bool) {
	var list coordv1.LeaseList
	lctx, cancel := context.WithTimeout(ctx, RenewInterval)
	defer cancel()
	err := b.deps.Client.Coordination.Get().Namespace(corev1.NamespaceNodeLease).Resource("leases").
		VersionedParams(&metav1.ListOptions{ResourceVersion: "0"}, metav1.ParameterCodec).Do(lctx).Into(&list)
	if err != nil {
		b.log.Info("list the nodes' leases of the shards taken; each node reads its own", "err", err)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.leases == nil {
		b.leases = map[string]*listedLease{}
	}
	for i := range list.Items {
		l := list.Items[i] // a copy: the list's array is not kept
		if in[ShardOf(l.Name, b.cfg.Shards)] && b.nodes[l.Name] == nil {
			l.ManagedFields = nil
			b.leases[l.Name] = &listedLease{lease: &l}
		}
	}
}

// loseShard stops serving shard i, and returns once its nodes stopped.
// The sharder's goroutine calls it.
func (b *Bridge) loseShard(i int) {
	b.mu.Lock()
	delete(b.held, i)
	var stop []*node
	for name, n := range b.nodes {
		if ShardOf(name, b.cfg.Shards) == i {
			stop = append(stop, n)
			delete(b.nodes, name)
		}
	}
	b.mu.Unlock()
	if i == 0 && b.clusterStop != nil {
		b.clusterStop()
		b.clusterStop = nil
	}
	for _, n := range stop {
		n.halt()
	}
}

// forgetLeases drops the listed Leases (listNodeLeases) of the nodes
// of shards (in) that none started from.
func (b *Bridge) forgetLeases(in map[int]bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for name := range b.leases {
		if in[ShardOf(name, b.cfg.Shards)] {
			delete(b.leases, name)
		}
	}
}

// reread subscribes again to the status and online topics of names, so
// the broker sends what it retains of them, and unsubscribes after
// IndexWait; the session's wildcard subscriptions stay. A node's newer
// statuses win over what it had (generations), so a copy that comes
// twice changes nothing.
func (b *Bridge) reread(ctx context.Context, names []string) {
	conn, _ := b.current()
	if conn == nil {
		return // the next session subscribes to everything anyway
	}
	var filters []string
	for _, n := range names {
		filters = append(filters, mqtt.Prefix+"nodes/"+n+"/status/#", mqtt.OnlineTopic(n))
	}
	for chunk := range slices.Chunk(filters, 100) {
		if err := b.request(ctx, func(ctx context.Context) error { return conn.Subscribe(ctx, chunk...) }); err != nil {
			b.log.Warn("read again what the broker retains of the nodes taken", "nodes", len(names), "err", err)
			return
		}
	}
	if sleep(ctx, b.deps.Clock, b.cfg.IndexWait) != nil {
		return
	}
	for chunk := range slices.Chunk(filters, 100) {
		if err := b.request(ctx, func(ctx context.Context) error { return conn.Unsubscribe(ctx, chunk...) }); err != nil {
			return
		}
	}
}

// adoptNodes starts the nodes the API server already knows as MQTT
// nodes (those this replica serves), so their desired state is
// published while they are away too.
func (b *Bridge) adoptNodes(ctx context.Context) {
	bo := backoff.Backoff{Min: time.Second, Max: time.Minute}
	for {
		var list corev1.NodeList
		err := b.deps.Client.Core.Get().Resource("nodes").
			VersionedParams(&metav1.ListOptions{LabelSelector: LabelTransport + "=mqtt"}, metav1.ParameterCodec).
			Do(ctx).Into(&list)
		if err == nil {
			b.mu.Lock()
			for _, n := range list.Items {
				if p := n.Status.DaemonEndpoints.KubeletEndpoint.Port; p > 0 {
					b.knownPorts[n.Name] = int(p)
				}
			}
			b.mu.Unlock()
			for _, n := range list.Items {
				b.ensureNode(n.Name)
			}
			return
		}
		b.log.Warn("list mqtt nodes; retrying", "err", err)
		if sleep(ctx, b.deps.Clock, bo.Next()) != nil {
			return
		}
	}
}

// broadcast wakes everything waiting on the connection; b.mu is held.
func (b *Bridge) broadcast() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// current returns the connection when the broker's indexes were read,
// else nil, and a channel closed at the next change.
func (b *Bridge) current() (mqtt.Conn, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.ready {
		return nil, b.changed
	}
	return b.conn, b.changed
}

// nextGen issues a generation: Unix milliseconds, and always above the
// last one issued or seen on the broker, so a bridge restarted (or a
// second one) goes on where the retained messages are.
func (b *Bridge) nextGen() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gen = max(b.gen+1, uint64(b.deps.Clock.Now().UnixMilli()))
	return b.gen
}

// runLink connects to the broker, reads what it holds, and hands every
// message to handle, connecting again after a Redial delay.
func (b *Bridge) runLink(ctx context.Context) {
	// As the agent's: never more than two keepalives between connects,
	// so a broker that is back is used within three, and a broker that
	// refuses connections is tried every second or so for the first
	// minutes of an outage.
	rd := mqtt.Redial{
		Backoff: backoff.Backoff{Min: time.Second, Max: max(time.Second, min(time.Minute, 2*b.cfg.KeepAlive))},
		Clock:   b.deps.Clock,
	}
	failed := 0 // connects failed in a row
	for ctx.Err() == nil {
		in := mqtt.NewInbox(mqtt.MaxInboxBytes)
		conn, err := b.deps.Dial(ctx, mqtt.Will{}, func(m mqtt.Message) {
			if isRPCUp(m.Topic) {
				b.rpc(m)
				return
			}
			in.Put(m)
		})
		if err != nil {
			// A refused broker is tried every second: said once.
			if failed++; failed == 1 || !mqtt.Refused(err) {
				b.log.Warn("mqtt broker not reachable; retrying", "err", err)
			}
			if sleep(ctx, b.deps.Clock, rd.Next(err)) != nil {
				return
			}
			continue
		}
		rd.Reset()
		failed = 0
		err = b.session(ctx, conn, in)
		b.mu.Lock()
		b.conn, b.ready = nil, false
		b.broadcast()
		nodes := slices.Collect(maps.Values(b.nodes))
		for _, h := range b.heard {
			h.known = false
		}
		b.mu.Unlock()
		if ctx.Err() != nil {
			conn.Close(true)
			return
		}
		conn.Close(false)
		// Without the broker nothing is heard of any node, its Last
		// Will included: each is away, its Lease left to expire, until
		// the next connection reads its online flag again.
		b.log.Warn("mqtt broker connection lost; its nodes are away until their online flags are read again", "nodes", len(nodes), "err", err)
		for _, n := range nodes {
			if b.tunnel != nil {
				b.tunnel.Reset(n.name, errors.New("the bridge lost its connection to the mqtt broker"))
			}
			n.setOnline(false, false)
		}
		if sleep(ctx, b.deps.Clock, rd.Next(err)) != nil {
			return
		}
	}
}

// session runs one connection: the indexes first (what the broker
// holds), then the nodes' statuses, online flags and events.
func (b *Bridge) session(ctx context.Context, conn mqtt.Conn, in *mqtt.Inbox) error {
	sctx, cancel := context.WithCancelCause(ctx)
	if !conn.SessionPresent() {
		b.log.Info("mqtt broker holds no session of the bridge; what it retains is read from its indexes")
	}
	b.mu.Lock()
	clear(b.retained)
	b.conn = conn
	b.mu.Unlock()
	var wg sync.WaitGroup
	// The handler goroutine ends with sctx: cancel before waiting for
	// it, or a lost connection would wait forever.
	defer func() {
		cancel(nil)
		wg.Wait()
	}()
	wg.Go(func() {
		for {
			select {
			case <-sctx.Done():
				return
			case <-in.Wake():
			}
			msgs, overflow := in.Take()
			for _, m := range msgs {
				b.handle(m)
				if m.Ack != nil {
					m.Ack()
				}
			}
			if overflow {
				cancel(errors.New("messages dropped while the bridge caught up; reconnecting to read them again"))
			}
		}
	})
	if err := b.request(sctx, func(ctx context.Context) error {
		return conn.Subscribe(ctx, mqtt.Prefix+"nodes/+/desired/index", mqtt.ClusterIndexTopic)
	}); err != nil {
		return err
	}
	if sleep(sctx, b.deps.Clock, b.cfg.IndexWait) != nil {
		return context.Cause(sctx)
	}
	b.mu.Lock()
	b.ready = true
	b.broadcast()
	b.mu.Unlock()
	if err := b.request(sctx, func(ctx context.Context) error {
		return conn.Subscribe(ctx, mqtt.Prefix+"nodes/+/status/#", mqtt.Prefix+"nodes/+/online", mqtt.Prefix+"nodes/+/events")
	}); err != nil {
		return err
	}
	if b.tunnel != nil {
		if err := b.request(sctx, func(ctx context.Context) error { return conn.Subscribe(ctx, mqtt.Prefix+"nodes/+/rpc/up") }); err != nil {
			return err
		}
	}
	b.log.Info("mqtt broker connected", "session", conn.SessionPresent())
	select {
	case <-sctx.Done():
		return context.Cause(sctx)
	case <-conn.Done():
		return errors.New("connection lost")
	}
}

// fetchRetained returns what the broker retains at topics, by topic. It
// subscribes to each topic alone (the broker sends its retained message
// at once), waits until all came or IndexWait passed, and unsubscribes.
// A topic missing from the result holds nothing, or it did not come in
// time.
func (b *Bridge) fetchRetained(ctx context.Context, conn mqtt.Conn, topics []string) (map[string][]byte, error) {
	ch := make(chan mqtt.Message, len(topics))
	b.mu.Lock()
	for _, t := range topics {
		b.fetches[t] = ch
	}
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		for _, t := range topics {
			if b.fetches[t] == ch {
				delete(b.fetches, t)
			}
		}
		b.mu.Unlock()
	}()
	if err := b.request(ctx, func(ctx context.Context) error { return conn.Subscribe(ctx, topics...) }); err != nil {
		return nil, fmt.Errorf("subscribe to %d retained topics: %w", len(topics), err)
	}
	got := map[string][]byte{}
	timer := b.deps.Clock.NewTimer(b.cfg.IndexWait)
	defer timer.Stop()
wait:
	for len(got) < len(topics) {
		select {
		case m := <-ch:
			got[m.Topic] = m.Payload
		case <-timer.C():
			break wait
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err := b.request(ctx, func(ctx context.Context) error { return conn.Unsubscribe(ctx, topics...) }); err != nil {
		return nil, fmt.Errorf("unsubscribe from %d retained topics: %w", len(topics), err)
	}
	return got, nil
}

func (b *Bridge) request(ctx context.Context, fn func(context.Context) error) error {
	rctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
	defer cancel()
	return fn(rctx)
}

// handle applies one message from the broker.
func (b *Bridge) handle(m mqtt.Message) {
	if len(m.Payload) > b.cfg.MaxMessageBytes {
		b.reject(m.Topic, "size", fmt.Errorf("%d bytes, over %d", len(m.Payload), b.cfg.MaxMessageBytes))
		return
	}
	// A fetch may be of the bridge's own topics, which ParseTopic does
	// not take.
	b.mu.Lock()
	fetch, ok := b.fetches[m.Topic]
	delete(b.fetches, m.Topic)
	b.mu.Unlock()
	if ok {
		fetch <- m // room for every topic of the fetch
		return
	}
	t, err := mqtt.ParseTopic(m.Topic)
	if err != nil {
		b.reject(m.Topic, "topic", err)
		return
	}
	if t.Index {
		b.noteIndex(t, m.Payload)
		return
	}
	// A node this replica does not serve is another's; what it says of
	// itself is kept all the same, for a take-over.
	b.hear(t, m.Topic, m.Payload)
	n := b.ensureNode(t.Node)
	if n == nil {
		return
	}
	switch {
	case t.Online:
		n.setOnline(string(m.Payload) == mqtt.OnlineTrue, !m.Retained)
	case t.Status == "node":
		if err := n.nodeStatus(m.Payload, !m.Retained); err != nil {
			b.reject(m.Topic, "invalid", err)
		}
	case t.Status == "pods":
		if err := n.podStatus(t, m.Topic, m.Payload, !m.Retained); err != nil {
			b.reject(m.Topic, "invalid", err)
		} else {
			b.mu.Lock()
			b.stats.Statuses++
			b.mu.Unlock()
		}
	case t.Events:
		if err := n.event(m.Payload); err != nil {
			b.reject(m.Topic, "invalid", err)
		}
	}
}

func (b *Bridge) reject(topic, reason string, err error) {
	b.mu.Lock()
	b.stats.Rejected++
	b.mu.Unlock()
	b.log.Warn("mqtt message refused", "topic", topic, "reason", reason, "err", err)
}

// noteIndex records an index the broker holds.
func (b *Bridge) noteIndex(t mqtt.Topic, payload []byte) {
	topic := t.String()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(payload) == 0 {
		delete(b.retained, topic)
		return
	}
	e, err := mqtt.UnmarshalEnvelope(payload)
	var x mqtt.Index
	if err == nil {
		x, err = mqtt.ParseIndex(e, t.Scope)
	}
	if err != nil {
		b.log.Warn("index on the broker unreadable; its objects are published again", "topic", topic, "err", err)
		delete(b.retained, topic)
		return
	}
	// An index the bridge did not sign with its key now (unsigned,
	// signed with a key rotated out, or forged) says nothing of what
	// the broker holds: every object is published again, signed. Its
	// generations are taken only up to a day ahead of the clock, so a
	// forged one cannot run them out.
	limit := uint64(math.MaxUint64)
	if err := b.checkOwn(topic, payload, e); err != nil {
		b.log.Info("index on the broker not signed with the bridge's key; its objects are published again, signed", "topic", topic, "reason", err)
		x.Hashes = nil
		limit = uint64(b.deps.Clock.Now().Add(24 * time.Hour).UnixMilli())
	}
	// The body as it came: what ParseIndex just read.
	b.retained[topic] = heldIndex{gen: x.Generation, scope: t.Scope, body: bytes.Clone(e.Body), noHashes: x.Hashes == nil}
	for _, g := range append(slices.Collect(maps.Values(x.Entries)), x.Generation) {
		if g > limit {
			b.log.Warn("generation on the broker too far ahead of the clock; ignored", "topic", topic, "generation", g)
			continue
		}
		b.gen = max(b.gen, g)
	}
}

// retainedIndex returns the index the broker holds at topic.
func (b *Bridge) retainedIndex(topic string) (mqtt.Index, bool) {
	b.mu.Lock()
	h, ok := b.retained[topic]
	b.mu.Unlock()
	if !ok {
		return mqtt.Index{}, false
	}
	return h.index(), true
}

// setRetained records h as the index the broker holds at topic.
func (b *Bridge) setRetained(topic string, h heldIndex) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.retained[topic] = h
}

// heldIndex is an index the broker holds, kept as its body (as
// Index.Marshal made it, or as it came from the broker) and parsed
// again when a publisher's pass needs it: a bridge keeps one for every
// node, and parsed (two maps, keyed by substrings of the body) each took
// two and a half times its body's memory, 8 MiB of the bridge's heap at
// 2,000 nodes.
type heldIndex struct {
	gen   uint64
	scope mqtt.Scope
	body  []byte
	// noHashes: the index says nothing of what the objects were (it was
	// not signed with the bridge's key), so every one is published again.
	noHashes bool
}

// index parses the index again. It parsed when it was kept, or was made
// by Index.Marshal: an error cannot happen, and would leave the index
// empty, so that every object is published again.
func (h heldIndex) index() mqtt.Index {
	x, err := mqtt.ParseIndex(mqtt.Envelope{Kind: "Index", Generation: h.gen, Encoding: mqtt.EncodingIndex, Body: h.body}, h.scope)
	if err != nil {
		return mqtt.Index{Generation: h.gen, Entries: map[string]uint64{}}
	}
	if h.noHashes {
		x.Hashes = nil
	}
	return x
}

// sleep waits d on c, or until ctx ends.
func sleep(ctx context.Context, c clock.Clock, d time.Duration) error {
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}
