package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outpost-edge/outpost/internal/waittest"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/sync/kube"
	"github.com/outpost-edge/outpost/sync/mqtt"
)

// settle looks in real time for what goroutines do between the fake
// clock's steps.
var settle = waittest.Poll{Timeout: 10 * time.Second, Every: time.Millisecond}

func (b *Bridge) isReady() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ready
}

func (c *recConn) published() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pubs)
}

func (n *node) isOnline() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.online
}

// A session ends when its connection is lost. It used to wait for its
// message handler before cancelling it, forever: a bridge whose broker
// restarted never connected again (TestMQTTBrokerRestarts saw it).
func TestSessionEndsWhenItsConnectionIsLost(t *testing.T) {
	b, _, clk := testBridge(t)
	b.cfg.IndexWait = time.Second
	conn := &recConn{done: make(chan struct{})}
	ended := make(chan error, 1)
	go func() { ended <- b.session(context.Background(), conn, mqtt.NewInbox(1<<20)) }()
	settle.Until(t, "the wait for the indexes", func() bool { return clk.Waiters() > 0 })
	clk.Advance(time.Second)
	settle.Until(t, "the session ready", b.isReady)
	close(conn.done)
	select {
	case err := <-ended:
		if err == nil {
			t.Error("a lost connection ended the session with no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the session did not end after its connection was lost")
	}
}

// Without a broker connection the bridge hears nothing of a node, not
// even its Last Will: every node is away (its Lease left to expire) from
// the loss until the next connection reads its online flag again.
func TestNodesAreAwayWhileTheBridgeHasNoBroker(t *testing.T) {
	b, st, clk := testBridge(t)
	b.cfg.IndexWait = time.Second
	type dialed struct {
		conn   *recConn
		handle func(mqtt.Message)
	}
	conns := make(chan *recConn, 2)
	dials := make(chan dialed, 2)
	b.deps.Dial = func(ctx context.Context, _ mqtt.Will, handle func(mqtt.Message)) (mqtt.Conn, error) {
		select {
		case c := <-conns:
			dials <- dialed{c, handle}
			return c, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	n := &node{b: b, name: "pi-1", st: st, hasFacts: make(chan struct{})}
	b.nodes["pi-1"] = n
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.runLink(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// advance lets the timers the link waits on (the indexes, the
	// backoff) fire until what it waits for holds.
	advance := settle
	advance.Between = func() {
		if clk.Waiters() > 0 {
			clk.Advance(100 * time.Millisecond)
		}
	}
	conns <- &recConn{done: make(chan struct{})}
	first := <-dials
	advance.Until(t, "the first connection ready", b.isReady)
	first.handle(mqtt.Message{Topic: mqtt.OnlineTopic("pi-1"), Payload: []byte(mqtt.OnlineTrue)})
	settle.Until(t, "the node online", n.isOnline)

	close(first.conn.done)
	settle.Until(t, "the node away once the broker connection was lost", func() bool { return !n.isOnline() })

	conns <- &recConn{done: make(chan struct{})}
	var second dialed
	advance.Until(t, "a second connection", func() bool {
		select {
		case second = <-dials:
			return true
		default:
			return false
		}
	})
	advance.Until(t, "the second connection ready", b.isReady)
	if n.isOnline() {
		t.Fatal("the node online again before its online flag was read")
	}
	second.handle(mqtt.Message{Topic: mqtt.OnlineTopic("pi-1"), Payload: []byte(mqtt.OnlineTrue)})
	settle.Until(t, "the node online again", n.isOnline)
}

// A publisher deletes nothing on the broker before sync/kube listed the
// node's pods into the bridge's store (empty at start): a pass before
// the list would have published an empty retained message for every
// pod the broker holds, and the node would have stopped them all.
func TestPublisherDeletesNothingBeforeTheStoreIsListed(t *testing.T) {
	b, st, clk := testBridge(t)
	index := mqtt.NodeIndexTopic("pi-1")
	b.retained[index] = heldNodeIndex(mqtt.Index{Generation: 10, Entries: map[string]uint64{"pods/default/a": 5}, Hashes: map[string]string{"pods/default/a": "0123456789abcdef"}})
	conn := &recConn{done: make(chan struct{})}
	b.conn, b.ready = conn, true
	pub := &publisher{b: b, scope: mqtt.ScopeNode, node: "pi-1", st: st, wake: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { pub.loop(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	for range 20 {
		settle.Until(t, "the publisher waiting or publishing", func() bool { return clk.Waiters() > 0 || conn.published() > 0 })
		if got := conn.take(); len(got) != 0 {
			t.Fatalf("published %v before the store was listed", topics(got))
		}
		clk.Advance(listedPoll)
	}

	if err := st.Pods().Put(store.SourceAPI, bridgePod("a", "busybox")); err != nil {
		t.Fatal(err)
	}
	if err := st.SetResumeVersion("pods", "100"); err != nil {
		t.Fatal(err)
	}
	var pubs []recPub
	settle.Until(t, "the index published once the store was listed", func() bool {
		if clk.Waiters() > 0 {
			clk.Advance(listedPoll)
		}
		pubs = append(pubs, conn.take()...)
		return len(pubs) > 0 && pubs[len(pubs)-1].topic == index
	})
	for _, p := range pubs {
		if p.topic == mqtt.DesiredTopic("pi-1", mqtt.KindPods, "default", "a") && len(p.payload) == 0 {
			t.Errorf("pod a deleted on the broker: published %v", topics(pubs))
		}
	}
}

// A replica hears every node's online flag and Node status, served or
// not, and starts a node it takes over from them: online, its Lease
// renewed at once, without waiting for the broker to send its retained
// messages again (at fleet size those came too late, and the nodes moved
// went NotReady).
func TestNodeTakenOverStartsFromWhatWasHeard(t *testing.T) {
	b, _, clk := testBridge(t)
	withAPI(t, b, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not here", http.StatusServiceUnavailable)
	}))
	b.cfg.Shards, b.held, b.heard = 2, map[int]bool{}, map[string]*heard{}
	runFor(t, b)

	// A node of shard 1 (shard 0's holder runs the cluster publisher
	// too, which this test has not set up).
	name := "pi-1"
	for i := 2; ShardOf(name, b.cfg.Shards) != 1; i++ {
		name = fmt.Sprintf("pi-%d", i)
	}
	shard := 1
	b.handle(retainedNodeStatus(t, name, 2, map[string]string{"v": "new"}))
	b.handle(retainedNodeStatus(t, name, 1, map[string]string{"v": "old"})) // late, and older: not kept
	b.handle(mqtt.Message{Topic: mqtt.OnlineTopic(name), Payload: []byte(mqtt.OnlineTrue)})
	// A pod status the node published while no replica served it (its
	// shard changing hands), and one heard too long ago.
	podStatus := func(pod string, gen uint64) mqtt.Message {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: pod, UID: types.UID("uid-" + pod)},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		body, err := p.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		e := mqtt.Envelope{Kind: "Pod", Generation: gen, Encoding: mqtt.EncodingProtobuf, Body: body}
		return mqtt.Message{Topic: mqtt.PodStatusTopic(name, "default", pod), Payload: e.Marshal()}
	}
	b.handle(podStatus("old", 7))
	clk.Advance(recentKeep + time.Second)
	b.handle(podStatus("web", 8))
	if len(b.nodes) != 0 {
		t.Fatalf("a node of a shard not held was started: %v", b.nodes)
	}

	b.gainShards([]int{shard})
	var n *node
	settle.Until(t, "the node started with its shard", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		n = b.nodes[name]
		return n != nil
	})
	if !n.isOnline() {
		t.Error("the node taken over is away: its online flag heard before was not used")
	}
	select {
	case <-n.hasFacts:
	default:
		t.Fatal("the node taken over has no Node status: the one heard before was not used")
	}
	if got := n.nodeFacts().Labels["v"]; got != "new" {
		t.Errorf("the node taken over started from status %q, want the newest heard", got)
	}
	var keys []string
	if es, err := n.st.Pending(0, 0); err == nil {
		for _, e := range es {
			keys = append(keys, e.Key)
		}
	}
	if !slices.Equal(keys, []string{"pod/default/web"}) {
		t.Errorf("journal of the node taken over: %q, want the pod status heard lately (not the one heard too long ago)", keys)
	}

	// A lost broker connection forgets the flags heard on it.
	b.loseShard(shard)
	b.mu.Lock()
	for _, h := range b.heard {
		h.known = false // as runLink does on a lost connection
	}
	b.mu.Unlock()
	if n := b.ensureNode(name); n != nil {
		t.Fatal("a node of a shard given back was started")
	}
	b.gainShards([]int{shard})
	settle.Until(t, "the node started again with its shard", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		n = b.nodes[name]
		return n != nil
	})
	if n.isOnline() {
		t.Error("a node was started online from a flag heard on a connection since lost")
	}
}

// A replica that takes shards renews the Leases of their online nodes,
// as it listed them, before it starts any of those nodes, and the nodes
// then start from the Leases renewed: one write each. An offline node's
// Lease is left to expire.
func TestLeasesOfNodesTakenRenewedFirst(t *testing.T) {
	b, _, _ := testBridge(t)
	b.cfg.Shards, b.held, b.heard = 2, map[int]bool{}, map[string]*heard{}
	// Three nodes of shard 1: two online, one offline.
	var names []string
	for i := 1; len(names) < 3; i++ {
		if name := fmt.Sprintf("pi-%d", i); ShardOf(name, b.cfg.Shards) == 1 {
			names = append(names, name)
		}
	}
	online, offline := names[:2], names[2]
	leasePath := "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
	var mu sync.Mutex
	var requests []string
	withAPI(t, b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := r.Method + " " + r.URL.Path
		if name, ok := strings.CutPrefix(r.URL.Path, leasePath+"/"); ok {
			b.mu.Lock()
			req += fmt.Sprintf(" started=%t", b.nodes[name] != nil)
			b.mu.Unlock()
		}
		mu.Lock()
		requests = append(requests, req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodGet && r.URL.Path == leasePath:
			list := coordv1.LeaseList{}
			for _, n := range names {
				list.Items = append(list.Items, coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: "kube-node-lease", ResourceVersion: "5"}})
			}
			json.NewEncoder(w).Encode(&list)
		case r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, leasePath+"/"):
			var l coordv1.Lease
			body, _ := io.ReadAll(r.Body)
			if _, _, err := serializer.NewCodecFactory(kube.Scheme()).UniversalDeserializer().Decode(body, nil, &l); err != nil || l.ResourceVersion != "5" {
				http.Error(w, fmt.Sprintf("rv %q: %v", l.ResourceVersion, err), http.StatusConflict)
				return
			}
			l.ResourceVersion = "6"
			json.NewEncoder(w).Encode(&l)
		default:
			http.Error(w, "not here", http.StatusServiceUnavailable)
		}
	}))
	runFor(t, b)
	for _, name := range names {
		b.handle(retainedNodeStatus(t, name, 1, nil))
		flag := mqtt.OnlineTrue
		if name == offline {
			flag = mqtt.OnlineFalse
		}
		b.handle(mqtt.Message{Topic: mqtt.OnlineTopic(name), Payload: []byte(flag), Retained: true})
	}

	b.gainShards([]int{1})
	settle.Until(t, "the nodes started with their shard", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.nodes) == len(names)
	})
	// The online nodes' Syncers connect (their Node reads fail here);
	// a Syncer that renewed its Lease at connect would have done so by
	// then.
	settle.Until(t, "the online nodes' Syncers reading their Nodes", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, r := range requests {
			for _, name := range online {
				if r == "GET /api/v1/nodes/"+name {
					n++
				}
			}
		}
		return n == len(online)
	})
	mu.Lock()
	defer mu.Unlock()
	for _, name := range online {
		var puts []string
		for _, r := range requests {
			if strings.HasPrefix(r, "PUT "+leasePath+"/"+name+" ") {
				puts = append(puts, r)
			}
		}
		if !slices.Equal(puts, []string{"PUT " + leasePath + "/" + name + " started=false"}) {
			t.Errorf("lease of online node %s: %q, want one renewal before the node started", name, puts)
		}
	}
	for _, r := range requests {
		if strings.HasPrefix(r, "PUT "+leasePath+"/"+offline+" ") {
			t.Errorf("the lease of offline node %s was renewed: %q", offline, r)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.leases) != 0 {
		t.Errorf("listed leases kept after the nodes started: %v", slices.Collect(maps.Keys(b.leases)))
	}
}

// runFor gives b a run context until the test ends; then b's goroutines
// stop and the stores of the nodes it started close.
func runFor(t *testing.T, b *Bridge) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	b.run = ctx
	t.Cleanup(func() {
		cancel()
		b.wg.Wait()
		for _, n := range b.nodes {
			n.st.Close()
		}
	})
	return ctx
}

// retainedNodeStatus is node name's Node status, generation gen, as the
// broker sends its retained copy.
func retainedNodeStatus(t *testing.T, name string, gen uint64, labels map[string]string) mqtt.Message {
	t.Helper()
	body, err := (&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	e := mqtt.Envelope{Kind: "Node", Generation: gen, Encoding: mqtt.EncodingProtobuf, Body: body}
	return mqtt.Message{Topic: mqtt.NodeStatusTopic(name), Payload: e.Marshal(), Retained: true}
}
