package mqtt

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/store"
)

func testSigner(t testing.TB) *Signer {
	t.Helper()
	key, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return NewSigner(key)
}

func TestSealVerify(t *testing.T) {
	s := testSigner(t)
	keys := NewKeyring(s.Public())
	topic := DesiredTopic("pi-1", KindPods, "default", "web")
	e := Envelope{Kind: "Pod", Generation: 42, Encoding: EncodingProtobuf, Issued: time.UnixMilli(1_700_000_000_000), Body: []byte("body")}
	payload := s.Seal(topic, e)

	got, err := UnmarshalEnvelope(payload)
	if err != nil {
		t.Fatal(err)
	}
	if got.Kind != e.Kind || got.Generation != e.Generation || !bytes.Equal(got.Body, e.Body) || !got.Issued.Equal(e.Issued) {
		t.Fatalf("sealed envelope decodes as %+v, want %+v", got, e)
	}
	// The body is no pod: Decode fails on it, after the header.
	if d, _ := Decode(payload); d.Envelope == nil || d.Envelope.SignedBy != s.ID().String() {
		t.Errorf("outpost mqtt decode shows %+v; want signedBy %s", d.Envelope, s.ID())
	}
	if id, err := keys.Verify(topic, payload, got); err != nil || id != s.ID() {
		t.Fatalf("Verify = %s, %v; want %s, nil", id, err, s.ID())
	}
	// Marshal of what was decoded keeps the signature valid.
	again := got.Marshal()
	if e2, err := UnmarshalEnvelope(again); err != nil {
		t.Fatal(err)
	} else if _, err := keys.Verify(topic, again, e2); err != nil {
		t.Fatalf("re-marshalled envelope: %v", err)
	}

	check := func(name, topic string, payload []byte, keys *Keyring, want error) {
		t.Helper()
		e, err := UnmarshalEnvelope(payload)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := keys.Verify(topic, payload, e); !errors.Is(err, want) {
			t.Errorf("%s: Verify = %v, want %v", name, err, want)
		}
	}
	check("another node's topic", DesiredTopic("pi-2", KindPods, "default", "web"), payload, keys, ErrBadSignature)
	check("another object's topic", DesiredTopic("pi-1", KindPods, "default", "db"), payload, keys, ErrBadSignature)
	check("a config map's topic", DesiredTopic("pi-1", KindConfigMaps, "default", "web"), payload, keys, ErrBadSignature)
	changed := bytes.Clone(payload)
	changed[len(changed)-1] ^= 1
	check("body changed", topic, changed, keys, ErrBadSignature)
	later := s.Seal(topic, Envelope{Kind: "Pod", Generation: 43, Encoding: EncodingProtobuf, Body: []byte("body")})
	spliced := append(bytes.Clone(later[:bytes.Index(later, []byte{tagSignature, sigFieldLen})]), payload[bytes.Index(payload, []byte{tagSignature, sigFieldLen}):]...)
	check("generation 43 with generation 42's signature", topic, spliced, keys, ErrBadSignature)
	check("unsigned", topic, e.Marshal(), keys, ErrUnsigned)
	check("another key", topic, testSigner(t).Seal(topic, e), keys, ErrUnknownKey)
	check("a second trusted key", topic, payload, NewKeyring(testSigner(t).Public(), s.Public()), nil)
}

func TestSignatureIsTheLastHeaderField(t *testing.T) {
	s := testSigner(t)
	payload := s.Seal("t", Envelope{Kind: "Pod", Generation: 1, Encoding: EncodingTombstone})
	// A field after the signature: the end byte replaced by an unknown
	// field, then the end.
	bad := append(bytes.Clone(payload[:len(payload)-1]), 0x10, 0, tagEnd)
	if _, err := UnmarshalEnvelope(bad); err == nil {
		t.Fatal("an envelope with a field after its signature decoded")
	}
	short := Envelope{Kind: "Pod", Generation: 1, Encoding: EncodingTombstone, Signature: []byte{1, 2, 3}}.Marshal()
	if _, err := UnmarshalEnvelope(short); err == nil {
		t.Fatal("a 3-byte signature decoded")
	}
}

func TestKeysSpelled(t *testing.T) {
	s := testSigner(t)
	pub, err := ParsePublicKey(FormatPublicKey(s.Public()))
	if err != nil || !pub.Equal(s.Public()) {
		t.Fatalf("ParsePublicKey(FormatPublicKey) = %v, %v", pub, err)
	}
	for _, bad := range []string{"", "ed25519:", "ed25519:AAAA", "rsa:" + FormatPublicKey(s.Public())[8:], FormatPublicKey(s.Public()) + "A"} {
		if _, err := ParsePublicKey(bad); err == nil {
			t.Errorf("ParsePublicKey(%q) took it", bad)
		}
	}
	der, err := MarshalPrivateKey(s.key)
	if err != nil {
		t.Fatal(err)
	}
	priv, err := ParsePrivateKey(der)
	if err != nil || !priv.Equal(s.key) {
		t.Fatalf("ParsePrivateKey(MarshalPrivateKey) = %v", err)
	}
	if _, err := ParsePrivateKey([]byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")); err == nil {
		t.Error("ParsePrivateKey took a public key")
	}
}

// newSignedHarness is newHarness with the node trusting signer's key.
func newSignedHarness(t *testing.T, signer *Signer) *harness {
	h := newHarness(t)
	h.s = h.withKeys(h.st, signer.Public())
	return h
}

func (h *harness) withKeys(st *store.Store, keys ...ed25519.PublicKey) *Syncer {
	s, err := New(Config{NodeName: testNode, KeepAlive: time.Minute, TrustedKeys: keys}, Deps{
		Dial: h.b.dialer(testNode), Store: st, Clock: h.clk,
		NodeFacts: func() NodeFacts { h.mu.Lock(); defer h.mu.Unlock(); return h.facts() },
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

func TestSignedDesiredState(t *testing.T) {
	signer := testSigner(t)
	h := newSignedHarness(t, signer)
	h.start()
	podTopic := DesiredTopic(testNode, KindPods, "default", "web")
	signedPod := func(gen uint64, image string) []byte {
		p := testPod("web", "u1")
		p.Spec.Containers[0].Image = image
		body, err := p.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return signer.Seal(podTopic, Envelope{Kind: "Pod", Generation: gen, Encoding: EncodingProtobuf, Body: body})
	}
	index := func(gen uint64, entries map[string]uint64) {
		x := Index{Generation: gen, Entries: entries}
		h.b.publish("bridge", NodeIndexTopic(testNode), true, signer.Seal(NodeIndexTopic(testNode), x.Envelope()))
	}
	rejects := func(reason string) uint64 { return h.s.Counts().Rejects[reason] }

	// Unsigned, or signed by another key: refused.
	h.bridgePod(testPod("web", "u1"), 5)
	h.wait.Until(h.t, "the unsigned pod refused", func() bool { return rejects(rejectSig) == 1 })
	h.b.publish("bridge", podTopic, true, testSigner(t).Seal(podTopic, Envelope{Kind: "Pod", Generation: 6, Encoding: EncodingProtobuf}))
	h.wait.Until(h.t, "the pod signed by another key refused", func() bool { return rejects(rejectSig) == 2 })
	// Signed for another node, published on this node's topic.
	other := signer.Seal(DesiredTopic("pi-2", KindPods, "default", "web"), Envelope{Kind: "Pod", Generation: 7, Encoding: EncodingProtobuf})
	h.b.publish("bridge", podTopic, true, other)
	h.wait.Until(h.t, "the pod signed for pi-2 refused", func() bool { return rejects(rejectSig) == 3 })
	if _, ok := h.storedPod("web"); ok {
		t.Fatal("a pod without a valid signature was stored")
	}

	v10 := signedPod(10, "busybox:10")
	h.b.publish("bridge", podTopic, true, v10)
	h.wait.Until(h.t, "the signed pod stored", func() bool { return h.podGen("web") == 10 })
	index(20, map[string]uint64{"pods/default/web": 10})
	h.wait.Until(h.t, "the index read", func() bool { return h.s.Counts().Indexes == 1 })

	// An empty payload deletes nothing; a signed tombstone does.
	h.b.publish("bridge", podTopic, true, nil)
	h.b.publish("bridge", podTopic, false, signer.Seal(podTopic, Envelope{Kind: "Pod", Generation: 25, Encoding: EncodingTombstone}))
	h.wait.Until(h.t, "the pod deleted by the tombstone", func() bool { _, ok := h.storedPod("web"); return !ok })

	// Published again later, the old signed pod changes nothing, nor
	// does a replayed older index.
	stale := h.s.Counts().Stale
	h.b.publish("bridge", podTopic, true, v10)
	h.wait.Until(h.t, "the replay ignored", func() bool { return h.s.Counts().Stale == stale+1 })
	index(15, map[string]uint64{"pods/default/web": 10})
	h.wait.Until(h.t, "the old index ignored", func() bool { return h.s.Counts().Stale == stale+2 })
	if _, ok := h.storedPod("web"); ok {
		t.Fatal("a replayed signed pod came back after its delete")
	}

	// After a restart the store remembers the last index.
	h.stop()
	h.s = h.withKeys(h.st, signer.Public())
	h.start()
	h.wait.Until(h.t, "connected again", func() bool { return h.s.Link().Connected })
	h.b.publish("bridge", podTopic, true, v10)
	// The retained old index and the retained and republished v10 come
	// in an order the scheduler picks: wait for two of them ignored, or
	// the pod stored (a failure).
	h.wait.Until(h.t, "the replay after a restart ignored", func() bool {
		_, stored := h.storedPod("web")
		return h.s.Counts().Stale >= 2 || stored
	})
	if _, ok := h.storedPod("web"); ok {
		t.Fatal("a replayed signed pod came back after a restart")
	}

	// A newer pod is taken; one the index lists at a generation below
	// the last index's is fetched and taken too.
	h.b.publish("bridge", podTopic, true, signedPod(30, "busybox:30"))
	h.wait.Until(h.t, "the newer pod stored", func() bool { return h.podGen("web") == 30 })
	dbTopic := DesiredTopic(testNode, KindPods, "default", "db")
	db := testPod("db", "u2")
	body, _ := db.Marshal()
	dbPayload := signer.Seal(dbTopic, Envelope{Kind: "Pod", Generation: 35, Encoding: EncodingProtobuf, Body: body})
	index(40, map[string]uint64{"pods/default/web": 30, "pods/default/db": 35})
	h.wait.Until(h.t, "db fetched", func() bool { return h.s.Counts().Fetches == 1 })
	h.b.publish("bridge", dbTopic, true, dbPayload)
	h.wait.Until(h.t, "db stored at the generation the index lists", func() bool { return h.podGen("db") == 35 })
	h.b.publish("bridge", dbTopic, true, dbPayload)
	h.wait.Until(h.t, "db sent again ignored", func() bool { return h.s.Counts().Stale >= 2 })

	// A node that trusts no key takes the signed envelopes as they are.
	if _, err := applyDesired(h.st, testNode, Topic{Node: testNode, Scope: ScopeNode, Kind: KindPods, Namespace: "default", Name: "web"},
		signedPod(50, "busybox:50"), 1<<20, guard{}); err != nil {
		t.Fatalf("a signed pod, no keys: %v", err)
	}
}

func FuzzVerify(f *testing.F) {
	s := NewSigner(ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)))
	topic := DesiredTopic("pi-1", KindPods, "default", "web")
	f.Add(topic, s.Seal(topic, Envelope{Kind: "Pod", Generation: 3, Encoding: EncodingProtobuf, Body: []byte{1}}))
	f.Add(topic, s.Seal(topic, Envelope{Kind: "Pod", Generation: 3, Encoding: EncodingTombstone}))
	f.Add(topic, Envelope{Kind: "Pod", Generation: 3, Encoding: EncodingProtobuf}.Marshal())
	keys := NewKeyring(s.Public())
	f.Fuzz(func(t *testing.T, topic string, payload []byte) {
		e, err := UnmarshalEnvelope(payload)
		if err != nil {
			return
		}
		if _, err := keys.Verify(topic, payload, e); err != nil {
			return
		}
		// What verifies is what the signer sealed: sealing it again
		// gives the same bytes (ed25519 is deterministic).
		if again := s.Seal(topic, e); !bytes.Equal(again, payload) {
			t.Fatalf("a payload verified that the signer did not make:\n%x\n%x", payload, again)
		}
	})
}
