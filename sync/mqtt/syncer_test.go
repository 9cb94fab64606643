package mqtt

import (
	"bytes"
	"context"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/internal/waittest"
	"github.com/outpost-edge/outpost/store"
)

const testNode = "pi-1"

type harness struct {
	t      *testing.T
	b      *fakeBroker
	st     *store.Store
	clk    *clocktest.Fake
	s      *Syncer
	facts  func() NodeFacts
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
	// wait looks for what the syncer does, advancing the fake clock a
	// little between looks so timers (the index's settling, backoff)
	// fire. Generous in real time: under qemu-user on a loaded machine a
	// step takes long.
	wait waittest.Poll
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{NodeName: testNode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := &harness{t: t, b: newFakeBroker(), st: st, clk: clocktest.New(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))}
	h.wait = waittest.Poll{Timeout: 60 * time.Second, Every: 2 * time.Millisecond, Between: func() { h.clk.Advance(100 * time.Millisecond) }}
	h.facts = func() NodeFacts {
		return NodeFacts{Labels: map[string]string{"outpost.io/board": "raspberry-pi-4-model-b"}, Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}},
		}}
	}
	h.s, err = New(Config{NodeName: testNode, KeepAlive: time.Minute}, Deps{
		Dial: h.b.dialer(testNode), Store: st, Clock: h.clk,
		NodeFacts: func() NodeFacts { h.mu.Lock(); defer h.mu.Unlock(); return h.facts() },
	})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan struct{})
	go func() { h.s.Run(ctx); close(h.done) }()
	h.t.Cleanup(h.stop)
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		h.t.Fatal("Run did not return after its context ended")
	}
	h.cancel = nil
}

func testPod(name, uid string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(uid)},
		Spec:       corev1.PodSpec{NodeName: testNode, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
}

func desiredPayload(t testing.TB, kind string, obj interface{ Marshal() ([]byte, error) }, gen uint64) []byte {
	t.Helper()
	body, err := obj.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return Envelope{Kind: kind, Generation: gen, Encoding: EncodingProtobuf, Body: body}.Marshal()
}

// bridgePod publishes pod retained at gen, as the bridge does.
func (h *harness) bridgePod(pod *corev1.Pod, gen uint64) {
	h.b.publish("bridge", DesiredTopic(testNode, KindPods, pod.Namespace, pod.Name), true, desiredPayload(h.t, "Pod", pod, gen))
}

func (h *harness) bridgeIndex(gen uint64, entries map[string]uint64) {
	h.b.publish("bridge", NodeIndexTopic(testNode), true, Index{Generation: gen, Entries: entries}.Envelope().Marshal())
}

func (h *harness) storedPod(name string) (*corev1.Pod, bool) {
	rec, ok, err := h.st.Pods().Get("default", name)
	if err != nil {
		h.t.Fatal(err)
	}
	return rec.Object, ok
}

func (h *harness) podGen(name string) uint64 {
	p, ok := h.storedPod(name)
	if !ok {
		return 0
	}
	g, _ := strconv.ParseUint(p.ResourceVersion, 10, 64)
	return g
}

func (h *harness) msgsIn(kind string) uint64 {
	h.s.m.mu.Lock()
	defer h.s.m.mu.Unlock()
	return h.s.m.msgsIn[kind]
}

func TestDesiredObjectsFromRetainedMessages(t *testing.T) {
	h := newHarness(t)
	h.bridgePod(testPod("web", "u1"), 10)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-config"}, Data: map[string]string{"k": "v"}}
	h.b.publish("bridge", DesiredTopic(testNode, KindConfigMaps, "default", "web-config"), true, desiredPayload(t, "ConfigMap", cm, 11))
	h.start()
	h.wait.Until(h.t, "the pod and config map stored", func() bool {
		_, ok, _ := h.st.ConfigMaps().Get("default", "web-config")
		return h.podGen("web") == 10 && ok
	})
	rec, _, _ := h.st.Pods().Get("default", "web")
	if rec.Source != store.SourceMQTT {
		t.Errorf("pod source %s, want mqtt", rec.Source)
	}
	h.wait.Until(h.t, "online true", func() bool { return string(h.b.retainedAt(OnlineTopic(testNode))) == OnlineTrue })
	if !h.s.Link().Connected {
		t.Error("link not connected")
	}
}

func TestOlderGenerationIgnored(t *testing.T) {
	h := newHarness(t)
	h.start()
	pod := testPod("web", "u1")
	h.bridgePod(pod, 20)
	h.wait.Until(h.t, "gen 20 stored", func() bool { return h.podGen("web") == 20 })
	old := pod.DeepCopy()
	old.Spec.Containers[0].Image = "busybox:old"
	h.bridgePod(old, 19)
	h.bridgePod(old, 20)
	h.wait.Until(h.t, "two stale messages counted", func() bool { return h.s.Counts().Stale == 2 })
	if p, _ := h.storedPod("web"); p.Spec.Containers[0].Image != "busybox" {
		t.Errorf("image %s after a replay of an older generation, want busybox", p.Spec.Containers[0].Image)
	}
	// A tombstone older than the stored object deletes nothing; a newer
	// one does.
	tomb := func(gen uint64) []byte {
		return Envelope{Kind: "Pod", Generation: gen, Encoding: EncodingTombstone}.Marshal()
	}
	h.b.publish("bridge", DesiredTopic(testNode, KindPods, "default", "web"), false, tomb(15))
	h.wait.Until(h.t, "stale tombstone counted", func() bool { return h.s.Counts().Stale == 3 })
	if _, ok := h.storedPod("web"); !ok {
		t.Fatal("an older tombstone deleted the pod")
	}
	h.b.publish("bridge", DesiredTopic(testNode, KindPods, "default", "web"), false, tomb(21))
	h.wait.Until(h.t, "pod deleted", func() bool { _, ok := h.storedPod("web"); return !ok })
}

func TestBadMessagesAreRefusedAndTheStoreKeepsItsObjects(t *testing.T) {
	h := newHarness(t)
	h.start()
	h.bridgePod(testPod("web", "u1"), 5)
	h.wait.Until(h.t, "pod stored", func() bool { return h.podGen("web") == 5 })
	before, _ := h.storedPod("web")

	other := testPod("web", "u1")
	other.Spec.NodeName = "pi-2"
	wrongName := testPod("db", "u1")
	noUID := testPod("web", "")
	big := make([]byte, 2<<20)
	topic := DesiredTopic(testNode, KindPods, "default", "web")
	cases := []struct {
		name, reason string
		topic        string
		payload      []byte
	}{
		{"not an envelope", rejectEnvelope, topic, []byte("{\"kind\":\"Pod\"}")},
		{"truncated envelope", rejectEnvelope, topic, desiredPayload(t, "Pod", testPod("web", "u1"), 9)[:6]},
		{"body not a pod", rejectDecode, topic, Envelope{Kind: "Pod", Generation: 9, Encoding: EncodingProtobuf, Body: []byte{0xff, 0xff, 0xff}}.Marshal()},
		{"kind not the topic's", rejectEnvelope, topic, desiredPayload(t, "Secret", &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}}, 9)},
		{"another node's pod", rejectInvalid, topic, desiredPayload(t, "Pod", other, 9)},
		{"another name than the topic's", rejectInvalid, topic, desiredPayload(t, "Pod", wrongName, 9)},
		{"no uid", rejectInvalid, topic, desiredPayload(t, "Pod", noUID, 9)},
		{"oversized", rejectSize, topic, big},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h.b.publish("bridge", c.topic, false, c.payload)
			h.wait.Until(h.t, "rejected as "+c.reason, func() bool {
				n := uint64(0)
				for _, v := range h.s.Counts().Rejects {
					n += v
				}
				return n == uint64(i+1)
			})
			if got := h.s.Counts().Rejects[c.reason]; got == 0 {
				t.Errorf("no reject counted as %s: %v", c.reason, h.s.Counts().Rejects)
			}
			after, ok := h.storedPod("web")
			if !ok || !bytes.Equal(mustMarshal(t, after), mustMarshal(t, before)) {
				t.Errorf("the stored pod changed")
			}
		})
	}
}

func mustMarshal(t *testing.T, p *corev1.Pod) []byte {
	b, err := p.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestReconnectFetchesOnlyWhatChangedWhenTheQueueDropped(t *testing.T) {
	h := newHarness(t)
	keep, change, gone := testPod("keep", "u1"), testPod("change", "u2"), testPod("gone", "u3")
	h.bridgePod(keep, 10)
	h.bridgePod(change, 11)
	h.bridgePod(gone, 12)
	h.bridgeIndex(12, map[string]uint64{"pods/default/keep": 10, "pods/default/change": 11, "pods/default/gone": 12})
	h.start()
	h.wait.Until(h.t, "three pods", func() bool { return h.podGen("keep") == 10 && h.podGen("change") == 11 && h.podGen("gone") == 12 })

	// The link dies; while it is down the broker's queue drops
	// everything the bridge publishes.
	h.b.mu.Lock()
	h.b.refuse, h.b.dropQueued = true, true
	h.b.mu.Unlock()
	h.b.kill(testNode)
	h.wait.Until(h.t, "link down", func() bool { return !h.s.Link().Connected })
	changed := change.DeepCopy()
	changed.Spec.Containers[0].Image = "busybox:2"
	h.bridgePod(changed, 20)
	h.b.publish("bridge", DesiredTopic(testNode, KindPods, "default", "gone"), true, nil)
	h.bridgePod(testPod("new", "u4"), 21)
	h.bridgeIndex(21, map[string]uint64{"pods/default/keep": 10, "pods/default/change": 20, "pods/default/new": 21})
	podsBefore := h.msgsIn(KindPods)

	h.b.mu.Lock()
	h.b.refuse = false
	h.b.mu.Unlock()
	h.wait.Until(h.t, "converged", func() bool {
		_, goneThere := h.storedPod("gone")
		return h.podGen("change") == 20 && h.podGen("new") == 21 && !goneThere && h.podGen("keep") == 10
	})
	if got := h.msgsIn(KindPods) - podsBefore; got != 2 {
		t.Errorf("%d pod messages after the reconnect, want 2 (the changed and the new one only)", got)
	}
	if p, _ := h.storedPod("change"); p.Spec.Containers[0].Image != "busybox:2" {
		t.Errorf("changed pod has image %s", p.Spec.Containers[0].Image)
	}
	h.wait.Until(h.t, "fetch subscriptions ended", func() bool {
		h.b.mu.Lock()
		defer h.b.mu.Unlock()
		return len(h.b.sessions[testNode].subs) == 5
	})
}

func TestBrokerThatLostRetainedMessagesDeletesNothing(t *testing.T) {
	h := newHarness(t)
	h.bridgePod(testPod("web", "u1"), 10)
	h.bridgeIndex(10, map[string]uint64{"pods/default/web": 10})
	h.start()
	h.wait.Until(h.t, "pod stored", func() bool { return h.podGen("web") == 10 })
	// The broker restarts with neither its retained messages nor the
	// session: the node finds no index and keeps its pods.
	dials := h.s.Counts().Connects
	h.b.mu.Lock()
	h.b.refuse = true
	h.b.mu.Unlock()
	h.b.kill(testNode)
	h.b.mu.Lock()
	clear(h.b.retained)
	delete(h.b.sessions, testNode)
	h.b.refuse = false
	h.b.mu.Unlock()
	h.wait.Until(h.t, "reconnected", func() bool { return h.s.Counts().Connects > dials && h.s.Link().Connected })
	// The bridge publishes everything again, unchanged.
	h.bridgePod(testPod("web", "u1"), 10)
	h.bridgeIndex(10, map[string]uint64{"pods/default/web": 10})
	h.wait.Until(h.t, "republished pod seen as stale", func() bool { return h.s.Counts().Stale >= 1 })
	if h.podGen("web") != 10 {
		t.Errorf("pod generation %d, want 10", h.podGen("web"))
	}
}

func TestStatusDrainsTheJournalRetainedWithItsSequence(t *testing.T) {
	h := newHarness(t)
	h.bridgePod(testPod("web", "u1"), 10)
	h.start()
	h.wait.Until(h.t, "pod stored", func() bool { return h.podGen("web") == 10 })
	status := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.42.0.2"}}
	data, _ := status.Marshal()
	seq, err := h.st.Append("pod/default/web", data)
	if err != nil {
		t.Fatal(err)
	}
	// A status of a pod the store no longer has is not sent.
	gone := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "gone", UID: "u9"}}
	gdata, _ := gone.Marshal()
	h.st.Append("pod/default/gone", gdata)
	topic := PodStatusTopic(testNode, "default", "web")
	h.wait.Until(h.t, "status retained", func() bool { return h.b.retainedAt(topic) != nil })
	e, err := UnmarshalEnvelope(h.b.retainedAt(topic))
	if err != nil {
		t.Fatal(err)
	}
	if e.Kind != "Pod" || e.Generation != seq || !bytes.Equal(e.Body, data) {
		t.Errorf("status envelope %s gen %d (want Pod, %d), body equal: %v", e.Kind, e.Generation, seq, bytes.Equal(e.Body, data))
	}
	h.wait.Until(h.t, "journal empty", func() bool {
		n, _ := h.st.Backlog()
		return n == 0
	})
	if p := h.b.published(PodStatusTopic(testNode, "default", "gone")); len(p) != 0 {
		t.Errorf("status of a pod no longer desired was published")
	}
	// The pod's deletion clears its retained status.
	h.b.publish("bridge", DesiredTopic(testNode, KindPods, "default", "web"), true, nil)
	h.wait.Until(h.t, "status cleared", func() bool { return h.b.retainedAt(topic) == nil })
}

func TestNodeStatusIsSentOnChangeOnly(t *testing.T) {
	h := newHarness(t)
	h.start()
	topic := NodeStatusTopic(testNode)
	h.wait.Until(h.t, "first node status", func() bool { return len(h.b.published(topic)) == 1 })
	for range 5 {
		h.clk.Advance(10 * time.Second)
	}
	h.wait.Until(h.t, "journal empty", func() bool { n, _ := h.st.Backlog(); return n == 0 })
	if n := len(h.b.published(topic)); n != 1 {
		t.Fatalf("%d node statuses with nothing changed, want 1", n)
	}
	h.mu.Lock()
	h.facts = func() NodeFacts {
		return NodeFacts{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "ContainerdDown"}}}}
	}
	h.mu.Unlock()
	h.wait.Until(h.t, "second node status", func() bool { return len(h.b.published(topic)) == 2 })
	var n corev1.Node
	e, _ := UnmarshalEnvelope(h.b.retainedAt(topic))
	if err := n.Unmarshal(e.Body); err != nil {
		t.Fatal(err)
	}
	if n.Name != testNode || len(n.Status.Conditions) != 1 || n.Status.Conditions[0].Status != corev1.ConditionFalse {
		t.Errorf("node status %s %+v", n.Name, n.Status.Conditions)
	}
}

func TestOnlineFalseOnShutdownAndLastWillOnDeath(t *testing.T) {
	h := newHarness(t)
	h.start()
	online := OnlineTopic(testNode)
	h.wait.Until(h.t, "online", func() bool { return string(h.b.retainedAt(online)) == OnlineTrue })
	h.b.kill(testNode)
	if got := string(h.b.retainedAt(online)); got != OnlineFalse {
		t.Errorf("after the connection died, online is %q, want the Last Will's false", got)
	}
	h.wait.Until(h.t, "online again", func() bool { return string(h.b.retainedAt(online)) == OnlineTrue })
	h.stop()
	if got := string(h.b.retainedAt(online)); got != OnlineFalse {
		t.Errorf("after a clean stop, online is %q, want false", got)
	}
}

func TestWatchdogReplacesASilentConnection(t *testing.T) {
	h := newHarness(t)
	h.start()
	h.wait.Until(h.t, "connected", func() bool { return h.s.Link().Connected })
	h.b.mu.Lock()
	h.b.sessions[testNode].conn.lastRead.Store(wall.Now().Add(-time.Hour).UnixNano())
	h.b.mu.Unlock()
	h.wait.Until(h.t, "a second connection", func() bool { return h.s.Counts().Connects == 2 && h.s.Link().Connected })
	if h.s.Counts().Watchdog != 1 {
		t.Errorf("watchdog resets %d, want 1", h.s.Counts().Watchdog)
	}
}

// A static pod whose manifest went (the store no longer holds it) has
// its retained status cleared, so the bridge deletes its mirror pod; its
// status carried its spec, for that mirror pod.
func TestStaticPodStatusClearedWhenItGoes(t *testing.T) {
	h := newHarness(t)
	h.start()
	static := testPod("sensor-pi-1", "s1")
	if err := h.st.Pods().Put(store.SourceStatic, static); err != nil {
		t.Fatal(err)
	}
	entry := &corev1.Pod{ObjectMeta: static.ObjectMeta, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	data, _ := entry.Marshal()
	if _, err := h.st.Append("pod/default/sensor-pi-1", data); err != nil {
		t.Fatal(err)
	}
	topic := PodStatusTopic(testNode, "default", "sensor-pi-1")
	h.wait.Until(h.t, "static pod status retained", func() bool { return h.b.retainedAt(topic) != nil })
	e, _ := UnmarshalEnvelope(h.b.retainedAt(topic))
	var full corev1.Pod
	if err := full.Unmarshal(e.Body); err != nil || len(full.Spec.Containers) != 1 || full.Status.Phase != corev1.PodRunning {
		t.Fatalf("a static pod's status without its spec: %+v, %v", full, err)
	}
	if _, err := h.st.Pods().Delete("default", "sensor-pi-1"); err != nil {
		t.Fatal(err)
	}
	h.wait.Until(h.t, "status cleared", func() bool { return h.b.retainedAt(topic) == nil })
}
