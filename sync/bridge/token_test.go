package bridge

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// signWith gives b the signing key and what the bridge derives from it.
func signWith(b *Bridge, key ed25519.PrivateKey) {
	b.cfg.Signer = mqtt.NewSigner(key)
	b.own = mqtt.NewKeyring(b.cfg.Signer.Public())
	b.vault, b.hashKey = b.cfg.Signer.SealKey(), b.cfg.Signer.HashKey()
}

// A pod's tokens Secret is published before the pod, sealed to the node,
// and the bridge keeps a copy sealed to its own key. A restarted bridge
// (its store starts empty, its key the same) reads its copies back and
// publishes nothing: no token is requested again before it is due, when
// it is renewed and sent once. No token is anywhere on the broker in
// clear.
func TestRestartedBridgeReadsTokensBackFromTheBroker(t *testing.T) {
	key, err := mqtt.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	nodeKey, err := mqtt.LoadSealKey(filepath.Join(t.TempDir(), mqtt.SealKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	b, st, clk := testBridge(t)
	signWith(b, key)
	b.cfg.IndexWait = time.Second
	requests := 0
	newNode := func(b *Bridge, st *store.Store) *node {
		n := &node{b: b, name: "pi-1", st: st, seal: nodeKey.PublicKey()}
		n.token = func(context.Context, *corev1.Pod, *corev1.ServiceAccountTokenProjection) (string, time.Time, error) {
			requests++
			return fmt.Sprintf("token-%d", requests), clk.Now().Add(time.Hour), nil
		}
		n.pub = &publisher{b: b, scope: mqtt.ScopeNode, node: "pi-1", st: st, prepare: n.syncTokens, sealTo: n.sealKey}
		return n
	}
	if err := st.Pods().Put(store.SourceAPI, tokenPod("web")); err != nil {
		t.Fatal(err)
	}
	conn := &retainConn{recConn: recConn{done: make(chan struct{})}, b: b, retained: map[string][]byte{}}
	ctx := context.Background()
	index := mqtt.NodeIndexTopic("pi-1")
	secretTopic := mqtt.DesiredTopic("pi-1", mqtt.KindSecrets, "default", mqtt.TokensSecretName("web"))
	copyTopic := mqtt.BridgeTokensTopic("pi-1", "default", mqtt.TokensSecretName("web"))
	podTopic := mqtt.DesiredTopic("pi-1", mqtt.KindPods, "default", "web")
	// The broker's index as the bridge reads it back.
	readIndex := func(b *Bridge) {
		t.Helper()
		e, err := mqtt.UnmarshalEnvelope(conn.retained[index])
		if err != nil {
			t.Fatal(err)
		}
		x, err := mqtt.ParseIndex(e, mqtt.ScopeNode)
		if err != nil {
			t.Fatal(err)
		}
		b.retained = map[string]heldIndex{index: heldNodeIndex(x)}
	}
	// restart is the bridge started again with key and an empty store
	// holding the pod.
	restart := func(key ed25519.PrivateKey, pod *corev1.Pod) *node {
		t.Helper()
		b2, st2, _ := testBridge(t)
		signWith(b2, key)
		b2.deps.Clock, b2.cfg.IndexWait = clk, time.Second
		conn.b = b2
		if err := st2.Pods().Put(store.SourceAPI, pod); err != nil {
			t.Fatal(err)
		}
		readIndex(b2)
		return newNode(b2, st2)
	}
	// noClearToken checks that no token is on the broker in clear, and
	// that the node opens its Secret.
	noClearToken := func() {
		t.Helper()
		for topic, payload := range conn.retained {
			if bytes.Contains(payload, []byte("token-")) {
				t.Errorf("%s holds a token in clear", topic)
			}
		}
		e, err := mqtt.UnmarshalEnvelope(conn.retained[secretTopic])
		if err != nil {
			t.Fatal(err)
		}
		if e.Encoding != mqtt.EncodingSealed {
			t.Fatalf("%s: encoding %s, want sealed", secretTopic, e.Encoding)
		}
		if _, err := nodeKey.Open(e.Body); err != nil {
			t.Errorf("%s: %v", secretTopic, err)
		}
		e, err = mqtt.UnmarshalEnvelope(conn.retained[copyTopic])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nodeKey.Open(e.Body); err == nil {
			t.Errorf("%s: the bridge's copy opens with the node's key", copyTopic)
		}
	}

	first := newNode(b, st)
	if err := first.pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(topics(conn.take()), " "), copyTopic+" "+secretTopic+" "+podTopic+" "+index; got != want {
		t.Fatalf("first pass published %s, want %s", got, want)
	}
	if requests != 1 {
		t.Fatalf("%d token requests, want 1", requests)
	}
	noClearToken()

	// The bridge restarts ten minutes later with an empty store.
	clk.Advance(10 * time.Minute)
	second := restart(key, tokenPod("web"))
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
	if got, want := strings.Join(topics(conn.take()), " "), copyTopic+" "+secretTopic+" "+index; got != want || requests != 2 {
		t.Fatalf("at renewal published %s with %d token requests, want %s with 2", got, requests, want)
	}
	noClearToken()

	// Tokens on the broker for an earlier pod of the same name are not
	// used: the new pod gets its own.
	again := tokenPod("web")
	again.UID = "uid-web-2"
	third := restart(key, again)
	if err := third.pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(topics(conn.take()), " "), copyTopic+" "+secretTopic+" "+podTopic+" "+index; got != want || requests != 3 {
		t.Fatalf("for a new pod of the same name published %s with %d token requests, want %s with 3", got, requests, want)
	}

	// A bridge with another key cannot read the copies: it requests the
	// token anew.
	other, _ := mqtt.GenerateKey()
	fourth := restart(other, again)
	if err := fourth.pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if requests != 4 {
		t.Fatalf("a bridge with another key made %d token requests in all, want 4", requests)
	}
	conn.take()

	// The pod is deleted while no bridge runs: the next one deletes its
	// tokens, and its own copy of them.
	st5 := restart(other, tokenPod("other"))
	if err := st5.pub.pass(ctx, conn); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{secretTopic, copyTopic} {
		if _, ok := conn.retained[topic]; ok {
			t.Errorf("%s still retained after the pod was deleted", topic)
		}
	}
}

// Secrets are held while the node's seal key is not known: the broker
// keeps what it holds of them (their index entries stay), nothing is
// published in clear, and once the key comes they go out sealed to it;
// a new key of the node sends them again.
func TestSecretsHeldUntilTheNodeSealKey(t *testing.T) {
	b, st, _ := testBridge(t)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "db"}, Data: map[string][]byte{"password": []byte("hunter2")}}
	if err := st.Secrets().Put(store.SourceAPI, sec); err != nil {
		t.Fatal(err)
	}
	if err := st.Pods().Put(store.SourceAPI, bridgePod("web", "busybox")); err != nil {
		t.Fatal(err)
	}
	n := &node{b: b, name: "pi-1", st: st}
	n.pub = &publisher{b: b, scope: mqtt.ScopeNode, node: "pi-1", st: st, sealTo: n.sealKey}
	conn := &recConn{done: make(chan struct{})}
	ctx := context.Background()
	index := mqtt.NodeIndexTopic("pi-1")
	secretTopic := mqtt.DesiredTopic("pi-1", mqtt.KindSecrets, "default", "db")
	podTopic := mqtt.DesiredTopic("pi-1", mqtt.KindPods, "default", "web")
	key := mqtt.IndexKey(mqtt.KindSecrets, "default", "db")
	pass := func() []recPub {
		t.Helper()
		if err := n.pub.pass(ctx, conn); err != nil {
			t.Fatal(err)
		}
		return conn.take()
	}

	if got, want := strings.Join(topics(pass()), " "), podTopic+" "+index; got != want {
		t.Fatalf("without the node's key published %s, want %s", got, want)
	}
	if x, _ := b.retainedIndex(index); len(x.Entries) != 1 {
		t.Fatalf("index %v, want the pod alone", x.Entries)
	}
	// A broker that holds the Secret from before keeps it.
	x, _ := b.retainedIndex(index)
	x.Entries[key], x.Hashes[key] = 7, "00000000000e0e11"
	b.setRetained(index, heldNodeIndex(x))
	if got := pass(); len(got) != 0 {
		t.Fatalf("without the node's key published %v, want nothing", topics(got))
	}

	sealed := func(k *mqtt.SealKey) {
		t.Helper()
		got := pass()
		if s := strings.Join(topics(got), " "); s != secretTopic+" "+index {
			t.Fatalf("with the node's key published %s, want %s", s, secretTopic+" "+index)
		}
		if bytes.Contains(got[0].payload, []byte("hunter2")) || bytes.Contains(got[1].payload, []byte(mqtt.BodyHash(mustMarshal(t, sec)))) {
			t.Fatal("the Secret, or its plain hash, is on the broker")
		}
		e, err := mqtt.UnmarshalEnvelope(got[0].payload)
		if err != nil {
			t.Fatal(err)
		}
		plain, err := k.Open(e.Body)
		if err != nil {
			t.Fatal(err)
		}
		var out corev1.Secret
		if err := out.Unmarshal(plain); err != nil || string(out.Data["password"]) != "hunter2" {
			t.Fatalf("sealed secret opens to %v (%v)", out.Data, err)
		}
		if got := pass(); len(got) != 0 {
			t.Fatalf("a second pass published %v", topics(got))
		}
	}
	for i := range 2 {
		k, err := mqtt.LoadSealKey(filepath.Join(t.TempDir(), fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		n.seal = k.PublicKey()
		sealed(k)
	}
}

func mustMarshal(t *testing.T, s *corev1.Secret) []byte {
	t.Helper()
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
