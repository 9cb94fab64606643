package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/sync/kube"
	"github.com/outpost-edge/outpost/sync/mqtt"
)

// node is one MQTT node: a store in the scratch directory, its pods from
// the bridge's sync/kube PodsFeed and the config maps and secrets they
// use from sync/kube's LoopRefs, and sync/kube's node and status parts
// (LoopNode, LoopStatus), which write what the node reports.
type node struct {
	b    *Bridge
	name string
	st   *store.Store
	pods *kube.Syncer
	kube *kube.Syncer
	pub  *publisher
	// cancel stops the node's parts; done is closed once they stopped.
	cancel context.CancelFunc
	done   chan struct{}
	// token requests a pod's token (pods.PodToken).
	token func(context.Context, *corev1.Pod, *corev1.ServiceAccountTokenProjection) (string, time.Time, error)

	mu sync.Mutex
	// facts are the node's status as it last published it; hasFacts
	// says it did, and the Node is registered only then.
	facts    kube.NodeFacts
	hasFacts chan struct{}
	// gens are the generations of the statuses applied, by the hash of
	// their topic (topicKey), with heardLive set once the node sent the
	// topic live since it last said, live, that it is online: an older
	// one delivered late is ignored (fresh).
	gens map[uint64]uint64
	// seal is the node's public seal key, from its status; its Secrets
	// are held until it is known.
	seal *mqtt.SealPublicKey
	// copied are the hashes of the tokens Secrets the bridge's own
	// copies (mqtt.BridgeTokensTopic) hold, by name; only the
	// publisher's goroutine uses it.
	copied map[string]string
	// online is what the bridge last heard of the node's online flag
	// (false too while it has no broker connection); the Lease is
	// renewed only while it is true.
	online bool
	// front is the node's kubelet API at the bridge (kubelet.go), under
	// b.mu; nil when the bridge serves none.
	front *front
}

// heard is what the bridge last heard of a node on the broker, whether
// it serves the node or not: every replica receives every node's
// messages, so a replica that takes over a node starts it from these at
// once rather than waiting for the broker to send what it retains (a
// node started as away renews no Lease).
type heard struct {
	// online is the node's online flag; known says one was heard on
	// the current broker connection.
	online, known bool
	// status is the node's last Node status envelope, gen its
	// generation.
	status []byte
	gen    uint64
	// recent are the pod statuses heard in the last recentKeep while
	// this replica did not serve the node, by topic: what the node said
	// while its shard was changing hands, which the replica that takes
	// it applies (the broker's retained copies, read again then, did not
	// bring them in the fleet benchmark).
	recent map[string]recentStatus
}

// recentStatus is a pod status heard, and when.
type recentStatus struct {
	payload []byte
	at      time.Time
}

// recentKeep is how long the pod statuses of a node not served are
// kept: longer than a dead replica's shards take to move.
const recentKeep = 3 * LeaseDuration

// pruneRecent drops what is older than recentKeep; b.mu is held.
func (h *heard) pruneRecent(now time.Time) {
	for topic, r := range h.recent {
		if now.Sub(r.at) > recentKeep {
			delete(h.recent, topic)
		}
	}
}

// heardOf returns what was heard of node name, an empty record at first;
// b.mu is held.
func (b *Bridge) heardOf(name string) *heard {
	h := b.heard[name]
	if h == nil {
		h = &heard{}
		b.heard[name] = h
	}
	return h
}

// hear records a node's online flag or Node status (t is its topic),
// served or not, and its pod statuses while it is not served.
func (b *Bridge) hear(t mqtt.Topic, topic string, payload []byte) {
	if t.Status == "pods" {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.nodes[t.Node] != nil {
			return // served: applied as it comes
		}
		h := b.heardOf(t.Node)
		if h.recent == nil {
			h.recent = map[string]recentStatus{}
		}
		now := b.deps.Clock.Now()
		h.pruneRecent(now)
		h.recent[topic] = recentStatus{payload: bytes.Clone(payload), at: now}
		return
	}
	var gen uint64
	if t.Status == "node" {
		e, err := mqtt.UnmarshalEnvelope(payload)
		if err != nil || e.Kind != "Node" {
			return // nodeStatus says what is wrong with it
		}
		gen = e.Generation
	} else if !t.Online {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.heardOf(t.Node)
	if t.Online {
		h.online, h.known = string(payload) == mqtt.OnlineTrue, true
	} else if gen >= h.gen {
		h.status, h.gen = bytes.Clone(payload), gen
	}
}

// ensureNode returns the node of name, starting it on first sight, or
// nil when another replica serves it. A node started is given what was
// heard of it (its Node status and online flag) before anyone else can
// reach it: under b.mu, as hear is, so a message heard later is applied
// after.
func (b *Bridge) ensureNode(name string) *node {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := b.nodes[name]; n != nil {
		return n
	}
	h := b.heardOf(name)
	if !b.owns(name) {
		return nil
	}
	n, err := b.newNode(name)
	if err != nil {
		b.log.Error("start mqtt node", "node", name, "err", err)
		return &node{b: b, name: name, hasFacts: make(chan struct{})}
	}
	b.nodes[name] = n
	if b.cfg.Kubelet.enabled() {
		if err := b.openFront(n); err != nil {
			b.log.Error("kubelet api of mqtt node not served", "node", name, "err", err)
		}
	}
	if h.status != nil {
		if err := n.nodeStatus(h.status, false); err != nil {
			b.log.Warn("node status heard before; waiting for the next", "node", name, "err", err)
		}
	}
	if h.known {
		n.setOnline(h.online, false)
	}
	// What it said of its pods while another replica served it, or none
	// did; a newer status that comes later wins (generations).
	h.pruneRecent(b.deps.Clock.Now())
	for topic, r := range h.recent {
		if t, err := mqtt.ParseTopic(topic); err == nil {
			if err := n.podStatus(t, topic, r.payload, false); err != nil {
				b.log.Warn("pod status heard before the node was served; dropped", "topic", topic, "err", err)
			}
		}
	}
	h.recent = nil
	ctx, cancel := context.WithCancel(b.run)
	n.cancel, n.done = cancel, make(chan struct{})
	b.wg.Go(func() {
		defer close(n.done)
		n.runAll(ctx)
	})
	b.log.Info("mqtt node", "node", name, "online", h.known && h.online)
	return n
}

// halt stops the node's parts and closes its store: another replica
// serves it now.
func (n *node) halt() {
	if n.cancel == nil {
		return
	}
	n.cancel()
	<-n.done
	if n.b.kubelet != nil {
		n.b.closeFront(n)
	}
	n.st.Close()
	n.b.log.Info("mqtt node handed over", "node", n.name)
}

// newNode makes a node's store and Syncers; b.mu is held.
func (b *Bridge) newNode(name string) (*node, error) {
	st, err := store.Open(filepath.Join(b.cfg.Dir, "nodes", name+".db"), store.Options{NodeName: name, SkipCheck: true, Scratch: true})
	if err != nil {
		return nil, err
	}
	n := &node{b: b, name: name, st: st, hasFacts: make(chan struct{})}
	log := b.log.With("node", name)
	// The pods come from the bridge's PodsFeed (one watch for all the
	// nodes); this Syncer watches the config maps and secrets they use.
	n.pods, err = kube.New(kube.Config{NodeName: name, Loops: kube.LoopRefs, Offload: true},
		kube.Deps{Client: b.deps.Client, Store: st, Clock: b.deps.Clock, Log: log})
	if err != nil {
		st.Close()
		return nil, err
	}
	labels := map[string]string{LabelTransport: "mqtt"}
	maps.Copy(labels, b.cfg.Labels)
	// Its Lease as listed when its shard was taken, if it was.
	var lease *coordv1.Lease
	renewed := false
	if l := b.leases[name]; l != nil {
		lease, renewed = l.lease, l.renewed
		delete(b.leases, name)
	}
	n.kube, err = kube.New(kube.Config{NodeName: name, Labels: labels, Loops: kube.LoopNode | kube.LoopStatus, WriteQPS: b.cfg.WriteQPS, WriteBurst: b.cfg.WriteBurst,
		StatusAfterPodsListed: true, Offload: true, LeaseFirst: true, Lease: lease, LeaseRenewed: renewed},
		kube.Deps{Client: b.deps.Client, Store: st, Clock: b.deps.Clock, Log: log, NodeFacts: n.nodeFacts})
	if err != nil {
		st.Close()
		return nil, err
	}
	// Away until its online topic says otherwise.
	n.kube.SetPresent(false)
	n.token = n.pods.PodToken
	n.pub = &publisher{b: b, scope: mqtt.ScopeNode, node: name, st: st, wake: make(chan struct{}, 1), prepare: n.syncTokens, prepareEvery: tokenCheck, sealTo: n.sealKey}
	return n, nil
}

// runAll runs the node's parts until ctx ends: its pods from the feed,
// the references they use and the publisher (which keeps the pods'
// tokens) at once, the Node part (its Lease) once the node published its
// status, and the status part only once its pods are in the store (so
// no status of a pod is dropped for a pod not listed yet, however long
// the list takes).
func (n *node) runAll(ctx context.Context) {
	var wg sync.WaitGroup
	if n.b.feed != nil {
		defer n.b.feed.Remove(n.name)
		wg.Go(func() {
			// The list wrote the node's every pod: its pages go from the
			// bridge's RSS at once, not at the next unmapStores.
			if n.b.feed.Add(ctx, n.name, n.st) == nil {
				n.st.Unmap()
			}
		})
	}
	wg.Go(func() { n.pods.Run(ctx) })
	wg.Go(func() {
		select {
		case <-ctx.Done():
			return
		case <-n.hasFacts:
		}
		n.kube.Run(ctx)
	})
	// The publisher in this goroutine, which would otherwise only wait:
	// a bridge runs this for every node.
	n.pub.loop(ctx)
	wg.Wait()
}

// sealKey is the node's public seal key, nil while it is not known.
func (n *node) sealKey() *mqtt.SealPublicKey {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.seal
}

func (n *node) nodeFacts() kube.NodeFacts {
	n.b.mu.Lock()
	fr := n.front
	n.b.mu.Unlock()
	n.mu.Lock()
	defer n.mu.Unlock()
	f := n.facts
	if fr != nil {
		f.Status = n.b.kubeletFacts(f.Status, fr.port)
	}
	return f
}

// setOnline records the node's online flag and has sync/kube renew its
// Lease only while it is true.
//
// A live true (not a retained copy, which the broker sends again at every
// subscribe of the bridge) starts a new connection of the node, before
// any status of it: the first status of each topic it then sends live
// is taken even if its generation is lower than the last applied, so a
// node whose store was made anew (its journal numbering starts again) is
// heard at once (fresh).
func (n *node) setOnline(online, live bool) {
	n.mu.Lock()
	was := n.online
	n.online = online
	if online && live {
		for k, g := range n.gens {
			n.gens[k] = g &^ heardLive
		}
	}
	n.mu.Unlock()
	if n.b.tunnel != nil {
		switch {
		case was && !online:
			n.b.tunnel.Reset(n.name, errors.New("the node went offline (its mqtt connection ended)"))
		case online && live:
			// A new connection of the node: its streams ended with the
			// old one.
			n.b.tunnel.Reset(n.name, errors.New("the node connected to the broker again"))
		}
	}
	if n.kube != nil {
		n.kube.SetPresent(online)
	}
}

// fresh reports whether a status of topic with generation gen, heard
// live or as a retained copy, is to be applied, and records it. A newer
// one is. An older one is only when it is the first the node sent live
// on topic since it last said, live, that it is online: a node sends a
// topic's statuses in order (its journal keeps only the newest unsent
// of each), so that is its store made anew. A retained copy no newer
// than the last applied is one the broker sent again at a subscribe of
// the bridge: after the bridge's own reconnect those come after what the
// broker queued for its session, the node's live online flag among it,
// and clearing the generations then wrote every pod's status again.
func (n *node) fresh(topic string, gen uint64, live bool) (bool, error) {
	if gen&heardLive != 0 {
		return false, fmt.Errorf("generation %d: not below 2^63", gen)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.gens == nil {
		n.gens = map[uint64]uint64{}
	}
	k := topicKey(topic)
	last, mark := n.gens[k]&^heardLive, n.gens[k]&heardLive
	first := live && mark == 0
	if live {
		mark = heardLive
	}
	ok := gen > last || first && gen < last
	if ok {
		last = gen
	}
	n.gens[k] = last | mark
	return ok, nil
}

// heardLive marks a generation in node.gens: a journal's sequence
// numbers stay below it.
const heardLive = 1 << 63

// topicKey is the key of a status topic in node.gens: its 64-bit FNV-1a
// hash. A bridge keeps a generation for every pod of thousands of nodes;
// the topics' strings, each kept from a message, took more than the rest
// of it, and two of a node's few dozen topics share a hash with a
// chance near 2^-55.
func topicKey(topic string) uint64 {
	h := uint64(14695981039346656037) // FNV-1a, as hash/fnv's, without its allocations
	for i := range len(topic) {
		h ^= uint64(topic[i])
		h *= 1099511628211
	}
	return h
}

// nodeStatus takes the node's published status as its facts; live says
// it was not a retained copy.
func (n *node) nodeStatus(payload []byte, live bool) error {
	if len(payload) == 0 {
		return nil
	}
	e, err := mqtt.UnmarshalEnvelope(payload)
	if err != nil {
		return err
	}
	if e.Kind != "Node" || e.Encoding != mqtt.EncodingProtobuf {
		return fmt.Errorf("envelope kind %s encoding %s, want Node protobuf", e.Kind, e.Encoding)
	}
	if ok, err := n.fresh(mqtt.NodeStatusTopic(n.name), e.Generation, live); !ok {
		return err
	}
	var obj corev1.Node
	if err := obj.Unmarshal(e.Body); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if obj.Name != n.name {
		return fmt.Errorf("metadata.name: %q, the topic is node %s's", obj.Name, n.name)
	}
	// The node's public seal key is kept in its Node's annotations, and
	// its Secrets are sealed to it.
	var annotations map[string]string
	var seal *mqtt.SealPublicKey
	if v, ok := obj.Annotations[mqtt.AnnotationSealKey]; ok {
		if seal, err = mqtt.ParseSealPublicKey(v); err != nil {
			return fmt.Errorf("metadata.annotations[%s]: %w", mqtt.AnnotationSealKey, err)
		}
		annotations = map[string]string{mqtt.AnnotationSealKey: v}
	}
	n.mu.Lock()
	first := n.facts.Status.Conditions == nil && n.facts.Labels == nil
	n.facts = kube.NodeFacts{Labels: obj.Labels, Annotations: annotations, Status: obj.Status}
	rekeyed := (seal == nil) != (n.seal == nil) || seal != nil && *seal != *n.seal
	n.seal = seal
	n.mu.Unlock()
	if rekeyed && n.pub != nil {
		// Its Secrets go out (again) sealed to the new key.
		select {
		case n.pub.wake <- struct{}{}:
		default:
		}
	}
	if first {
		select {
		case <-n.hasFacts:
		default:
			close(n.hasFacts)
		}
	}
	return nil
}

// podStatus puts a pod's published status into the node's journal, for
// sync/kube's status sink. A static pod's status comes with its spec: the
// pod goes into the store as a static pod, for its mirror pod. An empty
// payload (the node cleared the topic: the pod is gone) removes a static
// pod. live says it was not a retained copy.
func (n *node) podStatus(t mqtt.Topic, topic string, payload []byte, live bool) error {
	if n.st == nil {
		return errors.New("node not started")
	}
	if len(payload) == 0 {
		rec, ok, err := n.st.Pods().Get(t.Namespace, t.Name)
		if err == nil && ok && rec.Source == store.SourceStatic {
			_, err = n.st.Pods().Delete(t.Namespace, t.Name)
		}
		return err
	}
	e, err := mqtt.UnmarshalEnvelope(payload)
	if err != nil {
		return err
	}
	if e.Kind != "Pod" || e.Encoding != mqtt.EncodingProtobuf {
		return fmt.Errorf("envelope kind %s encoding %s, want Pod protobuf", e.Kind, e.Encoding)
	}
	if ok, err := n.fresh(topic, e.Generation, live); !ok {
		return err
	}
	var p corev1.Pod
	if err := p.Unmarshal(e.Body); err != nil {
		return fmt.Errorf("pod: %w", err)
	}
	if p.Namespace != t.Namespace || p.Name != t.Name {
		return fmt.Errorf("metadata: holds %s/%s", p.Namespace, p.Name)
	}
	if p.UID == "" {
		return errors.New("metadata.uid: empty")
	}
	if len(p.Spec.Containers) > 0 {
		static := p.DeepCopy()
		static.Status = corev1.PodStatus{}
		static.ResourceVersion = ""
		if err := n.st.Pods().Put(store.SourceStatic, static); err != nil {
			return fmt.Errorf("static pod: %w", err)
		}
	}
	entry := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID}, Status: p.Status}
	value, err := entry.Marshal()
	if err != nil {
		return err
	}
	_, err = n.st.Append("pod/"+p.Namespace+"/"+p.Name, value)
	return err
}

// event hands a node's event to sync/kube's event sink.
func (n *node) event(payload []byte) error {
	e, err := mqtt.UnmarshalEnvelope(payload)
	if err != nil {
		return err
	}
	if e.Kind != "Event" || e.Encoding != mqtt.EncodingProtobuf {
		return fmt.Errorf("envelope kind %s encoding %s, want Event protobuf", e.Kind, e.Encoding)
	}
	var ev corev1.Event
	if err := ev.Unmarshal(e.Body); err != nil {
		return fmt.Errorf("event: %w", err)
	}
	o := ev.InvolvedObject
	if o.Kind != "Pod" || o.Name == "" || o.UID == "" {
		return fmt.Errorf("involvedObject: %s %s/%s uid %q is not a pod", o.Kind, o.Namespace, o.Name, o.UID)
	}
	if n.kube != nil {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: o.Name, UID: o.UID}}
		n.kube.Event(pod, ev.Type, ev.Reason, ev.Message, ev.LastTimestamp.Time)
	}
	return nil
}
