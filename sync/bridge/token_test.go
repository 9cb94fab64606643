package bridge

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/sync/mqtt"
)

// retainConn is an mqtt.Conn with the broker's retained messages: a
// publish replaces what the topic retains (an empty one deletes it), and
// subscribing to a topic hands its retained message to the bridge.
type retainConn struct {
	recConn
	b        *Bridge
	mu       sync.Mutex
	retained map[string][]byte
}

func (c *retainConn) Publish(ctx context.Context, topic string, retained bool, payload []byte) error {
	c.mu.Lock()
	if len(payload) == 0 {
		delete(c.retained, topic)
	} else {
		c.retained[topic] = append([]byte(nil), payload...)
	}
	c.mu.Unlock()
	return c.recConn.Publish(ctx, topic, retained, payload)
}

func (c *retainConn) Subscribe(_ context.Context, filters ...string) error {
	for _, f := range filters {
		c.mu.Lock()
		payload, ok := c.retained[f]
		c.mu.Unlock()
		if ok {
			c.b.handle(mqtt.Message{Topic: f, Payload: payload, Retained: true})
		}
	}
	return nil
}

func tokenPod(name string) *corev1.Pod {
	p := bridgePod(name, "busybox")
	exp := int64(3600)
	p.Spec.Volumes = []corev1.Volume{{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: &exp}}},
	}}}}
	return p
}

// A pod's tokens Secret is published before the pod. A restarted bridge
// (its store starts empty) reads the tokens Secrets back from the broker
// and publishes nothing: no token is requested again before it is due,
// when it is renewed and sent once.
func TestRestartedBridgeReadsTokensBackFromTheBroker(t *testing.T) {
	b, st, clk := testBridge(t)
	b.cfg.IndexWait = time.Second
	requests := 0
	newNode := func(st *store.Store) *node {
		n := &node{b: b, name: "pi-1", st: st}
		n.token = func(context.Context, *corev1.Pod, *corev1.ServiceAccountTokenProjection) (string, time.Time, error) {
			requests++
			return fmt.Sprintf("token-%d", requests), clk.Now().Add(time.Hour), nil
		}
		n.pub = &publisher{b: b, scope: mqtt.ScopeNode, node: "pi-1", st: st, prepare: n.syncTokens}
		return n
	}
	if err := st.Pods().Put(store.SourceAPI, tokenPod("web")); err != nil {
		t.Fatal(err)
	}
	conn := &retainConn{recConn: recConn{done: make(chan struct{})}, b: b, retained: map[string][]byte{}}
	ctx := context.Background()
	index := mqtt.NodeIndexTopic("pi-1")
	secretTopic := mqtt.DesiredTopic("pi-1", mqtt.KindSecrets, "default", mqtt.TokensSecretName("web"))
	podTopic := mqtt.DesiredTopic("pi-1", mqtt.KindPods, "default", "web")
	// The broker's index as the bridge reads it back.
	readIndex := func() {
		t.Helper()
		e, err := mqtt.UnmarshalEnvelope(conn.retained[index])
		if err != nil {
			t.Fatal(err)
		}
		x, err := mqtt.ParseIndex(e, mqtt.ScopeNode)
		if err != nil {
			t.Fatal(err)
		}
		b.retained = map[string]mqtt.Index{index: x}
	}

	first := newNode(st)
	if err := first.pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(topics(conn.take()), " "), secretTopic+" "+podTopic+" "+index; got != want {
		t.Fatalf("first pass published %s, want %s", got, want)
	}
	if requests != 1 {
		t.Fatalf("%d token requests, want 1", requests)
	}

	// The bridge restarts ten minutes later with an empty store.
	st2, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if err := st2.Pods().Put(store.SourceAPI, tokenPod("web")); err != nil {
		t.Fatal(err)
	}
	readIndex()
	clk.Advance(10 * time.Minute)
	second := newNode(st2)
	if err := second.pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if got := conn.take(); len(got) != 0 || requests != 1 {
		t.Fatalf("the restarted bridge published %v and made %d token requests, want nothing and 1", topics(got), requests)
	}

	// 80 % into the token's hour it is renewed, and sent once.
	clk.Advance(40 * time.Minute)
	for range 2 {
		if err := second.pub.pass(ctx, conn); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := strings.Join(topics(conn.take()), " "), secretTopic+" "+index; got != want || requests != 2 {
		t.Fatalf("at renewal published %s with %d token requests, want %s with 2", got, requests, want)
	}

	// Tokens on the broker for an earlier pod of the same name are not
	// used: the new pod gets its own.
	readIndex()
	st3, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st3.Close()
	again := tokenPod("web")
	again.UID = "uid-web-2"
	if err := st3.Pods().Put(store.SourceAPI, again); err != nil {
		t.Fatal(err)
	}
	third := newNode(st3)
	if err := third.pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(topics(conn.take()), " "), secretTopic+" "+podTopic+" "+index; got != want || requests != 3 {
		t.Fatalf("for a new pod of the same name published %s with %d token requests, want %s with 3", got, requests, want)
	}
}
