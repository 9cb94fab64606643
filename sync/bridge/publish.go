package bridge

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/outpost-edge/outpost/internal/backoff"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/sync/kube"
	"github.com/outpost-edge/outpost/sync/mqtt"
)

// publisher keeps one scope's retained messages (a node's desired
// objects, or the cluster's Services and EndpointSlices) and its index
// equal to what the store holds from the API server. It compares with
// the index the broker holds, by hash, so it publishes only what
// differs: after a restart of the bridge nothing, after a broker lost its
// retained messages everything.
type publisher struct {
	b     *Bridge
	scope mqtt.Scope
	node  string // for ScopeNode
	st    *store.Store
	wake  chan struct{}
	// prepare, if set, runs at the start of every pass, and every
	// prepareEvery besides: a node's tokens (token.go), so what the
	// pass publishes has them.
	prepare      func(context.Context, mqtt.Conn)
	prepareEvery time.Duration
	// sealTo returns the node's public seal key, nil while it is not
	// known (for ScopeNode): Secrets are sealed to it, and held until
	// it is known.
	sealTo func() *mqtt.SealPublicKey
	// holding says Secrets are held now (said once in the log).
	holding bool
}

// object is one desired object as published.
type object struct {
	topic string
	kind  string // the envelope's
	body  []byte
	hash  string
	// sealTo, if set, is the node's key the body is sealed to; held
	// says it is a Secret whose node's key is not known yet.
	sealTo *mqtt.SealPublicKey
	held   bool
}

func (p *publisher) indexTopic() string {
	if p.scope == mqtt.ScopeCluster {
		return mqtt.ClusterIndexTopic
	}
	return mqtt.NodeIndexTopic(p.node)
}

// loop publishes after every change of the store or the connection
// until ctx ends; a failed pass is tried again after a backoff.
func (p *publisher) loop(ctx context.Context) {
	kinds := []store.Kind{store.KindPod, store.KindConfigMap, store.KindSecret}
	if p.scope == mqtt.ScopeCluster {
		kinds = []store.Kind{store.KindService, store.KindEndpointSlice}
	}
	changes, cancel := p.st.Subscribe(kinds...)
	defer cancel()
	var tick <-chan time.Time
	if p.prepare != nil && p.prepareEvery > 0 {
		t := p.b.deps.Clock.NewTicker(p.prepareEvery)
		defer t.Stop()
		tick = t.C()
	}
	bo := backoff.Backoff{Min: 500 * time.Millisecond, Max: 30 * time.Second}
	for {
		conn, connChanged := p.b.current()
		if conn != nil && !p.listed() {
			// What the store lacks is deleted on the broker: not before
			// the API server's objects are in it.
			if sleep(ctx, p.b.deps.Clock, listedPoll) != nil {
				return
			}
			continue
		}
		if conn != nil {
			// The pass on a goroutine that ends with it: this one waits
			// most of the time, for each of thousands of nodes, and keeps
			// the small stack of a wait (kube.Offload).
			var err error
			kube.Offload(func() {
				err = p.pass(ctx, conn)
				if p.scope == mqtt.ScopeNode {
					// A pass reads the node's every object; few are read
					// again before its next (store.Unmap).
					p.st.Unmap()
				}
			})
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				p.b.log.Warn("publish desired objects; retrying", "index", p.indexTopic(), "err", err)
				if sleep(ctx, p.b.deps.Clock, bo.Next()) != nil {
					return
				}
				continue
			}
			bo.Reset()
		}
		select {
		case <-ctx.Done():
			return
		case <-changes:
		case <-connChanged:
		case <-p.wake:
		case <-tick:
		}
	}
}

// listedPoll is how often a publisher looks whether its store was
// listed.
const listedPoll = 100 * time.Millisecond

// listed reports whether sync/kube listed the scope's resources into the
// store once (it records their resume versions then): the bridge's store
// starts empty, and a pass before the list would delete on the broker,
// and on the node, every object it holds.
func (p *publisher) listed() bool {
	resources := []string{"pods"}
	if p.scope == mqtt.ScopeCluster {
		resources = []string{"services", "endpointslices"}
	}
	for _, r := range resources {
		if rv, err := p.st.ResumeVersion(r); err != nil || rv == "" {
			return false
		}
	}
	return true
}

// desired lists the scope's objects from the API server in the store.
func (p *publisher) desired() (map[string]object, error) {
	out := map[string]object{}
	add := func(kind, ekind, ns, name string, body []byte) {
		topic := mqtt.ClusterTopic(kind, ns, name)
		if p.scope == mqtt.ScopeNode {
			topic = mqtt.DesiredTopic(p.node, kind, ns, name)
		}
		out[mqtt.IndexKey(kind, ns, name)] = object{topic: topic, kind: ekind, body: body, hash: mqtt.BodyHash(body)}
	}
	var err error
	if p.scope == mqtt.ScopeNode {
		err = collect(p.st.Pods(), func(r store.Record[*podT]) error { return marshalAdd(add, mqtt.KindPods, "Pod", r) })
		if err == nil {
			err = collect(p.st.ConfigMaps(), func(r store.Record[*cmT]) error { return marshalAdd(add, mqtt.KindConfigMaps, "ConfigMap", r) })
		}
		if err == nil {
			err = collect(p.st.Secrets(), func(r store.Record[*secretT]) error { return marshalAdd(add, mqtt.KindSecrets, "Secret", r) })
		}
		// Secrets go sealed to the node, or not at all: never in clear.
		var to *mqtt.SealPublicKey
		if p.sealTo != nil {
			to = p.sealTo()
		}
		for key, o := range out {
			if o.kind != "Secret" {
				continue
			}
			if to == nil {
				o.held, o.hash = true, ""
			} else {
				o.sealTo, o.hash = to, mqtt.SealedHash(p.b.hashKey, to, o.body)
			}
			out[key] = o
		}
	} else {
		err = collect(p.st.Services(), func(r store.Record[*svcT]) error { return marshalAdd(add, mqtt.KindServices, "Service", r) })
		if err == nil {
			err = collect(p.st.EndpointSlices(), func(r store.Record[*sliceT]) error {
				return marshalAdd(add, mqtt.KindEndpointSlices, "EndpointSlice", r)
			})
		}
	}
	return out, err
}

// pass publishes what differs from the broker's index, then the index:
// config maps and secrets before the pods that use them.
func (p *publisher) pass(ctx context.Context, conn mqtt.Conn) error {
	if p.prepare != nil {
		p.prepare(ctx, conn)
	}
	want, err := p.desired()
	if err != nil {
		return err
	}
	topic := p.indexTopic()
	have, _ := p.b.retainedIndex(topic)
	next := mqtt.Index{Entries: map[string]uint64{}, Hashes: map[string]string{}}
	changed := false
	held := 0
	for _, key := range slices.SortedFunc(maps.Keys(want), podsLast) {
		o := want[key]
		if o.held {
			// What the broker holds of it stays, until it can be sealed.
			if g, ok := have.Entries[key]; ok {
				next.Entries[key] = g
				if h, ok := have.Hashes[key]; ok {
					next.Hashes[key] = h
				}
			}
			held++
			continue
		}
		if h, ok := have.Hashes[key]; ok && h == o.hash {
			next.Entries[key], next.Hashes[key] = have.Entries[key], h
			continue
		}
		gen := p.b.nextGen()
		env := mqtt.Envelope{Kind: o.kind, Generation: gen, Encoding: mqtt.EncodingProtobuf, Issued: p.b.deps.Clock.Now(), Body: o.body}
		if o.sealTo != nil {
			sealed, err := o.sealTo.Seal(o.body)
			if err != nil {
				return fmt.Errorf("seal %s: %w", o.topic, err)
			}
			env.Encoding, env.Body = mqtt.EncodingSealed, sealed
		}
		payload := p.b.seal(o.topic, env)
		if err := p.b.request(ctx, func(ctx context.Context) error { return conn.Publish(ctx, o.topic, true, payload) }); err != nil {
			return err
		}
		p.b.countPublished()
		next.Entries[key], next.Hashes[key] = gen, o.hash
		changed = true
	}
	for key := range have.Entries {
		if _, ok := want[key]; ok {
			continue
		}
		t, err := keyTopic(p, key)
		if err != nil {
			continue
		}
		if err := p.remove(ctx, conn, t, keyKind(key)); err != nil {
			return err
		}
		if parts := splitKey(key); parts[0] == mqtt.KindSecrets && strings.HasSuffix(parts[2], mqtt.TokensSecretName("")) {
			// The bridge's own copy of a pod's tokens goes with them.
			if err := p.b.request(ctx, func(ctx context.Context) error {
				return conn.Publish(ctx, mqtt.BridgeTokensTopic(p.node, parts[1], parts[2]), true, nil)
			}); err != nil {
				return err
			}
		}
		changed = true
	}
	if held > 0 != p.holding {
		p.holding = held > 0
		if p.holding {
			p.b.log.Info("node has not published its seal key; its Secrets are held until it does", "node", p.node, "secrets", held)
		}
	}
	if !changed && have.Entries != nil {
		return nil
	}
	next.Generation = p.b.nextGen()
	env := next.Envelope()
	payload := p.b.seal(topic, env)
	if err := p.b.request(ctx, func(ctx context.Context) error {
		return conn.Publish(ctx, topic, true, payload)
	}); err != nil {
		return err
	}
	p.b.countPublished()
	p.b.setRetained(topic, heldIndex{gen: next.Generation, scope: p.scope, body: env.Body})
	return nil
}

// remove deletes the object at topic (of the envelope kind kind). A
// signing bridge first sends a signed tombstone, not retained: nodes
// that trust keys delete on nothing less (an offline node learns of the
// delete from the signed index, which no longer lists the object). The
// empty retained message then deletes it on the broker and, on a node
// that trusts no key, in its store.
func (p *publisher) remove(ctx context.Context, conn mqtt.Conn, topic, kind string) error {
	if p.b.cfg.Signer != nil && kind != "" {
		e := mqtt.Envelope{Kind: kind, Generation: p.b.nextGen(), Encoding: mqtt.EncodingTombstone, Issued: p.b.deps.Clock.Now()}
		payload := p.b.seal(topic, e)
		if err := p.b.request(ctx, func(ctx context.Context) error { return conn.Publish(ctx, topic, false, payload) }); err != nil {
			return err
		}
		p.b.countPublished()
	}
	if err := p.b.request(ctx, func(ctx context.Context) error { return conn.Publish(ctx, topic, true, nil) }); err != nil {
		return err
	}
	p.b.countPublished()
	return nil
}

// podsLast orders index keys by kind, pods last, then by name.
func podsLast(a, b string) int {
	ap, bp := strings.HasPrefix(a, mqtt.KindPods+"/"), strings.HasPrefix(b, mqtt.KindPods+"/")
	switch {
	case ap && !bp:
		return 1
	case bp && !ap:
		return -1
	}
	return strings.Compare(a, b)
}

func (b *Bridge) countPublished() {
	b.mu.Lock()
	b.stats.Published++
	b.mu.Unlock()
}

// keyKind is the envelope kind of an index key, or "".
func keyKind(key string) string { return mqtt.EnvelopeKind(splitKey(key)[0]) }

// keyTopic is the topic of an index key of p's scope.
func keyTopic(p *publisher, key string) (string, error) {
	parts := splitKey(key)
	if len(parts) != 3 {
		return "", errBadKey
	}
	if p.scope == mqtt.ScopeCluster {
		return mqtt.ClusterTopic(parts[0], parts[1], parts[2]), nil
	}
	return mqtt.DesiredTopic(p.node, parts[0], parts[1], parts[2]), nil
}
