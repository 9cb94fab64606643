package bridge

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/sync/mqtt"
)

// recConn is an mqtt.Conn that records what is published; the broker's
// side (retained messages, echoes) is not simulated.
type recConn struct {
	mu   sync.Mutex
	pubs []recPub
	done chan struct{}
}

type recPub struct {
	topic   string
	payload []byte
}

func (c *recConn) Publish(_ context.Context, topic string, _ bool, payload []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pubs = append(c.pubs, recPub{topic, append([]byte(nil), payload...)})
	return nil
}
func (c *recConn) Subscribe(context.Context, ...string) error   { return nil }
func (c *recConn) Unsubscribe(context.Context, ...string) error { return nil }
func (c *recConn) SessionPresent() bool                         { return true }
func (c *recConn) Done() <-chan struct{}                        { return c.done }
func (c *recConn) LastRead() time.Time                          { return time.Time{} }
func (c *recConn) Close(bool)                                   {}

func (c *recConn) take() []recPub {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pubs
	c.pubs = nil
	return p
}

func testBridge(t *testing.T) (*Bridge, *store.Store, *clocktest.Fake) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clocktest.New(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	b := &Bridge{
		cfg: Config{RequestTimeout: time.Second, MaxMessageBytes: 1 << 20}, deps: Deps{Clock: clk}, log: slog.New(slog.DiscardHandler),
		nodes: map[string]*node{}, changed: make(chan struct{}), retained: map[string]heldIndex{}, fetches: map[string]chan<- mqtt.Message{},
		held: map[int]bool{}, heard: map[string]*heard{},
	}
	return b, st, clk
}

func bridgePod(name, image string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{NodeName: "pi-1", Containers: []corev1.Container{{Name: "c", Image: image}}},
	}
}

func topics(pubs []recPub) []string {
	var out []string
	for _, p := range pubs {
		out = append(out, p.topic)
	}
	return out
}

// The publisher sends what differs from the broker's index and the
// index after it: everything the first time, nothing when nothing
// changed (a restarted bridge), one object when one changed, an empty
// retained message for one deleted, everything again for a broker that
// lost its retained messages.
func TestPublisherSendsOnlyWhatDiffersFromTheBrokersIndex(t *testing.T) {
	b, st, clk := testBridge(t)
	for _, p := range []*corev1.Pod{bridgePod("a", "busybox"), bridgePod("b", "busybox")} {
		if err := st.Pods().Put(store.SourceAPI, p); err != nil {
			t.Fatal(err)
		}
	}
	// A static pod in the bridge's store is the node's own: never sent.
	if err := st.Pods().Put(store.SourceStatic, bridgePod("static", "busybox")); err != nil {
		t.Fatal(err)
	}
	pub := &publisher{b: b, scope: mqtt.ScopeNode, node: "pi-1", st: st}
	conn := &recConn{done: make(chan struct{})}
	ctx := context.Background()
	index := mqtt.NodeIndexTopic("pi-1")

	if err := pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	got := conn.take()
	want := []string{mqtt.DesiredTopic("pi-1", "pods", "default", "a"), mqtt.DesiredTopic("pi-1", "pods", "default", "b"), index}
	if strings.Join(topics(got), " ") != strings.Join(want, " ") {
		t.Fatalf("first pass published %v, want %v", topics(got), want)
	}
	e, err := mqtt.UnmarshalEnvelope(got[2].payload)
	if err != nil {
		t.Fatal(err)
	}
	x, err := mqtt.ParseIndex(e, mqtt.ScopeNode)
	if err != nil {
		t.Fatal(err)
	}
	if len(x.Entries) != 2 || len(x.Hashes) != 2 || x.Generation <= x.Entries["pods/default/a"] {
		t.Fatalf("index %+v", x)
	}
	first := x

	// A restarted bridge that read the same index back publishes nothing.
	b.retained = map[string]heldIndex{index: heldNodeIndex(first)}
	if err := pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if got := conn.take(); len(got) != 0 {
		t.Fatalf("unchanged pass published %v", topics(got))
	}

	// One pod changed: that pod and the index, with newer generations.
	clk.Advance(time.Second)
	if err := st.Pods().Put(store.SourceAPI, bridgePod("a", "busybox:2")); err != nil {
		t.Fatal(err)
	}
	if err := pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	got = conn.take()
	if want := []string{mqtt.DesiredTopic("pi-1", "pods", "default", "a"), index}; strings.Join(topics(got), " ") != strings.Join(want, " ") {
		t.Fatalf("after a change published %v, want %v", topics(got), want)
	}
	e, _ = mqtt.UnmarshalEnvelope(got[0].payload)
	if e.Generation <= first.Entries["pods/default/a"] {
		t.Errorf("changed pod's generation %d, not above %d", e.Generation, first.Entries["pods/default/a"])
	}

	// One pod deleted: an empty retained message for it, and the index.
	if _, err := st.Pods().Delete("default", "b"); err != nil {
		t.Fatal(err)
	}
	if err := pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	got = conn.take()
	if len(got) != 2 || got[0].topic != mqtt.DesiredTopic("pi-1", "pods", "default", "b") || len(got[0].payload) != 0 || got[1].topic != index {
		t.Fatalf("after a delete published %v", topics(got))
	}

	// The broker lost its retained messages: everything again.
	clear(b.retained)
	if err := pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if got := conn.take(); len(got) != 2 {
		t.Fatalf("after the broker lost its retained messages published %v, want the pod and the index", topics(got))
	}
}

// A node's pod status goes into its journal; a static pod's, which
// comes with its spec, also puts the pod into the store (for its mirror
// pod); an older generation is ignored; an empty payload removes the
// static pod.
func TestNodePodStatusIntoTheJournal(t *testing.T) {
	b, st, _ := testBridge(t)
	n := &node{b: b, name: "pi-1", st: st, hasFacts: make(chan struct{})}
	static := bridgePod("sensor-pi-1", "busybox")
	static.Annotations = map[string]string{"kubernetes.io/config.source": "file"}
	static.Status = corev1.PodStatus{Phase: corev1.PodRunning}
	body, _ := static.Marshal()
	topic := mqtt.PodStatusTopic("pi-1", "default", "sensor-pi-1")
	tp, _ := mqtt.ParseTopic(topic)
	// send hands the node a status as the broker would: live, or a
	// retained copy.
	send := func(gen uint64, body []byte, live bool) error {
		var payload []byte
		if body != nil {
			payload = mqtt.Envelope{Kind: "Pod", Generation: gen, Encoding: mqtt.EncodingProtobuf, Body: body}.Marshal()
		}
		return n.podStatus(tp, topic, payload, live)
	}
	// journal returns the pod's journal entry and its status.
	journal := func() (uint64, corev1.PodPhase) {
		t.Helper()
		es, _ := st.Pending(0, 0)
		if len(es) != 1 {
			t.Fatalf("journal %+v", es)
		}
		var p corev1.Pod
		if err := p.Unmarshal(es[0].Value); err != nil {
			t.Fatal(err)
		}
		return es[0].Seq, p.Status.Phase
	}
	if err := send(5, body, false); err != nil {
		t.Fatal(err)
	}
	rec, ok, _ := st.Pods().Get("default", "sensor-pi-1")
	if !ok || rec.Source != store.SourceStatic || rec.Object.Status.Phase != "" {
		t.Fatalf("static pod in the store: %v %+v", ok, rec)
	}
	es, _ := st.Pending(0, 0)
	if len(es) != 1 || es[0].Key != "pod/default/sensor-pi-1" {
		t.Fatalf("journal %+v", es)
	}
	var p corev1.Pod
	if err := p.Unmarshal(es[0].Value); err != nil || p.Status.Phase != corev1.PodRunning || p.UID != static.UID || len(p.Spec.Containers) != 0 {
		t.Fatalf("journal entry %+v, %v", p, err)
	}
	seq := es[0].Seq

	older := static.DeepCopy()
	older.Status.Phase = corev1.PodPending
	ob, _ := older.Marshal()
	// step sends a status and checks whether it was applied.
	step := func(what string, gen uint64, body []byte, live, applied bool) {
		t.Helper()
		if err := send(gen, body, live); err != nil {
			t.Fatal(err)
		}
		s, phase := journal()
		if got := s != seq; got != applied {
			t.Errorf("%s (generation %d, live %v): applied %v, want %v (phase now %s)", what, gen, live, got, applied, phase)
		}
		seq = s
	}
	step("an older retained copy", 4, ob, false, false)
	// The retained online flag again (the bridge subscribed anew): an
	// older status, retained too, is still older.
	n.setOnline(true, false)
	step("an older retained copy after a retained online flag", 4, ob, false, false)
	step("a newer status, live", 6, body, true, true)
	step("an older status, live, within the same connection of the node", 4, ob, true, false)
	step("the same status again, live", 6, body, true, false)

	// The node connected again and said so, live; the bridge then
	// subscribed anew (its own reconnect, after the broker queued the
	// flag for its session), and the broker sent its retained copy of
	// what was applied already: it is not written again.
	n.setOnline(true, true)
	step("the retained copy of the last applied, after a live online flag", 6, body, false, false)
	// A node whose store was made anew numbers its journal from 1
	// again: its first status of the topic on its new connection is
	// heard, though its generation is lower; the next one must be newer.
	step("the first live status since the node came online, renumbered", 2, ob, true, true)
	if _, phase := journal(); phase != corev1.PodPending {
		t.Errorf("after the node came online again, its status with a lower generation was ignored: %s", phase)
	}
	step("an older live status after it", 1, body, true, false)
	step("a newer live status", 3, body, true, true)

	if err := send(1<<63, body, true); err == nil {
		t.Error("a generation of 2^63 accepted")
	}

	if err := send(0, nil, true); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := st.Pods().Get("default", "sensor-pi-1"); ok {
		t.Error("the static pod stayed after its status was cleared")
	}
	if err := n.podStatus(tp, topic, []byte("garbage"), true); err == nil {
		t.Error("garbage accepted")
	}
}

// A signing bridge signs every object and index for its topic, deletes
// with a signed tombstone before the empty retained message, publishes
// everything again when the broker's index was signed by another key
// (a rotation, or a forgery), and takes no generation from such an
// index that runs far ahead of its clock.
func TestSigningPublisher(t *testing.T) {
	b, st, clk := testBridge(t)
	key, err := mqtt.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	b.cfg.Signer = mqtt.NewSigner(key)
	b.own = mqtt.NewKeyring(b.cfg.Signer.Public())
	node := mqtt.NewKeyring(b.cfg.Signer.Public())
	for _, p := range []*corev1.Pod{bridgePod("a", "busybox"), bridgePod("b", "busybox")} {
		if err := st.Pods().Put(store.SourceAPI, p); err != nil {
			t.Fatal(err)
		}
	}
	pub := &publisher{b: b, scope: mqtt.ScopeNode, node: "pi-1", st: st}
	conn := &recConn{done: make(chan struct{})}
	ctx := context.Background()
	index := mqtt.NodeIndexTopic("pi-1")
	verified := func(pubs []recPub) {
		t.Helper()
		for _, p := range pubs {
			if len(p.payload) == 0 {
				continue
			}
			e, err := mqtt.UnmarshalEnvelope(p.payload)
			if err != nil {
				t.Fatalf("%s: %v", p.topic, err)
			}
			if _, err := node.Verify(p.topic, p.payload, e); err != nil {
				t.Errorf("%s: %v", p.topic, err)
			}
		}
	}

	if err := pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	got := conn.take()
	if len(got) != 3 {
		t.Fatalf("first pass published %v", topics(got))
	}
	verified(got)
	signedIndex := got[2].payload

	// The bridge restarted: its own index read back, nothing to send.
	b.retained = map[string]heldIndex{}
	b.noteIndex(mustTopic(t, index), signedIndex)
	if err := pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if got := conn.take(); len(got) != 0 {
		t.Fatalf("with its own index read back published %v", topics(got))
	}

	// A delete: a signed tombstone, then the empty retained message.
	if _, err := st.Pods().Delete("default", "b"); err != nil {
		t.Fatal(err)
	}
	if err := pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	got = conn.take()
	bTopic := mqtt.DesiredTopic("pi-1", mqtt.KindPods, "default", "b")
	if len(got) != 3 || got[0].topic != bTopic || got[1].topic != bTopic || len(got[1].payload) != 0 || got[2].topic != index {
		t.Fatalf("a delete published %v", topics(got))
	}
	verified(got)
	if e, _ := mqtt.UnmarshalEnvelope(got[0].payload); e.Encoding != mqtt.EncodingTombstone || e.Kind != "Pod" {
		t.Errorf("a delete sent %+v, want a Pod tombstone", e)
	}

	// The broker's index signed with another key, with a generation far
	// ahead: everything is sent again, signed, and the generations stay
	// near the clock.
	other, _ := mqtt.GenerateKey()
	forged := mqtt.Index{Generation: 1 << 62, Entries: map[string]uint64{"pods/default/a": 1 << 62}, Hashes: map[string]string{}}
	e, _ := mqtt.UnmarshalEnvelope(signedIndex)
	x, _ := mqtt.ParseIndex(e, mqtt.ScopeNode)
	forged.Hashes["pods/default/a"] = x.Hashes["pods/default/a"]
	b.retained = map[string]heldIndex{}
	b.noteIndex(mustTopic(t, index), mqtt.NewSigner(other).Seal(index, forged.Envelope()))
	clk.Advance(time.Second)
	if err := pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	got = conn.take()
	if len(got) != 2 || got[0].topic != mqtt.DesiredTopic("pi-1", mqtt.KindPods, "default", "a") || got[1].topic != index {
		t.Fatalf("after an index of another key published %v", topics(got))
	}
	verified(got)
	if e, _ := mqtt.UnmarshalEnvelope(got[0].payload); e.Generation >= 1<<62 {
		t.Errorf("generation %d taken from the forged index", e.Generation)
	}
}

func mustTopic(t *testing.T, s string) mqtt.Topic {
	t.Helper()
	tp, err := mqtt.ParseTopic(s)
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

// ShardOf spreads node names over the shards and keeps each in one.
func TestShardOf(t *testing.T) {
	count := make([]int, 8)
	for i := range 800 {
		name := fmt.Sprintf("pi-%03d", i)
		s := ShardOf(name, 8)
		if s != ShardOf(name, 8) || s < 0 || s >= 8 {
			t.Fatalf("ShardOf(%s) = %d", name, s)
		}
		count[s]++
	}
	for s, c := range count {
		if c < 60 || c > 140 {
			t.Errorf("shard %d has %d of 800 nodes: %v", s, c, count)
		}
	}
}

// topicKey is hash/fnv's 64-bit FNV-1a.
func TestTopicKeyIsFNV1a(t *testing.T) {
	for _, topic := range []string{"", "outpost/v1/nodes/pi-1/status/pods/default/web", "outpost/v1/nodes/pi-1/status/node"} {
		h := fnv.New64a()
		h.Write([]byte(topic))
		if got, want := topicKey(topic), h.Sum64(); got != want {
			t.Errorf("topicKey(%q) = %x, want %x", topic, got, want)
		}
	}
}

// An index kept as its body reads back as it was, an index without
// hashes (not signed with the bridge's key) without them.
func TestHeldIndexReadsBack(t *testing.T) {
	x := mqtt.Index{Generation: 42, Entries: map[string]uint64{"pods/default/a": 5, "configmaps/default/c": 7},
		Hashes: map[string]string{"pods/default/a": "0123456789abcdef"}}
	got := heldNodeIndex(x).index()
	if got.Generation != 42 || !maps.Equal(got.Entries, x.Entries) || !maps.Equal(got.Hashes, x.Hashes) || got.Hashes == nil {
		t.Errorf("read back %+v, want %+v", got, x)
	}
	x.Hashes = nil
	if got := heldNodeIndex(x).index(); got.Hashes != nil || !maps.Equal(got.Entries, x.Entries) {
		t.Errorf("without hashes read back %+v", got)
	}
}

// heldNodeIndex is node index x as the bridge keeps what the broker
// holds: its body as published.
func heldNodeIndex(x mqtt.Index) heldIndex {
	return heldIndex{gen: x.Generation, scope: mqtt.ScopeNode, body: x.Marshal(), noHashes: x.Hashes == nil}
}
