package mqtt

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/store"
)

// The seal key is made once, readable by its owner only, and read back
// the same at the next start.
func TestSealKeyPersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pki", SealKeyFile)
	k, err := LoadSealKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v", fi, err)
	}
	again, err := LoadSealKey(path)
	if err != nil || again.Public() != k.Public() {
		t.Fatalf("read back %v, %v; want the key made (%s)", again, err, k.Public())
	}
	if err := os.WriteFile(path, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSealKey(path); err == nil {
		t.Fatal("a file that is no key read as one")
	}
}

// A Secret sealed to the node opens there and is stored as any other;
// sealed to another node, sealed when the node has no key, or a sealed
// pod, it is refused and the store keeps what it had; the ciphertext
// holds no byte of the value.
func TestSealedSecret(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{NodeName: testNode, SkipCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	mine, err := LoadSealKey(filepath.Join(t.TempDir(), SealKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	other, err := LoadSealKey(filepath.Join(t.TempDir(), SealKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	sealed := func(to *SealKey, kind string, obj interface{ Marshal() ([]byte, error) }, gen uint64) []byte {
		t.Helper()
		body, err := obj.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		pub, err := ParseSealPublicKey(to.Public())
		if err != nil {
			t.Fatal(err)
		}
		box, err := pub.Seal(body)
		if err != nil {
			t.Fatal(err)
		}
		return Envelope{Kind: kind, Generation: gen, Encoding: EncodingSealed, Body: box}.Marshal()
	}
	value := []byte("the-value-of-the-secret")
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "db"}, Data: map[string][]byte{"password": value}}
	tp := Topic{Node: testNode, Scope: ScopeNode, Kind: KindSecrets, Namespace: "default", Name: "db"}
	payload := sealed(mine, "Secret", sec, 5)
	if bytes.Contains(payload, value) {
		t.Fatal("the sealed payload holds the value in clear")
	}
	if res, err := applyDesired(st, testNode, tp, payload, 1<<20, guard{seal: mine}); err != nil || res != applyStored {
		t.Fatalf("sealed secret: %v, %v", res, err)
	}
	rec, ok, err := st.Secrets().Get("default", "db")
	if err != nil || !ok || !bytes.Equal(rec.Object.Data["password"], value) {
		t.Fatalf("stored %v, %v, %v", rec.Object, ok, err)
	}

	sec.Data["password"] = []byte("changed")
	for name, c := range map[string]struct {
		payload []byte
		g       guard
		reason  string
	}{
		"sealed to another node": {sealed(other, "Secret", sec, 6), guard{seal: mine}, rejectSeal},
		"no seal key":            {sealed(mine, "Secret", sec, 6), guard{}, rejectSeal},
		"changed in transit":     {flipLast(sealed(mine, "Secret", sec, 6)), guard{seal: mine}, rejectSeal},
		"a sealed pod":           {sealed(mine, "Pod", testPod("db", "u1"), 6), guard{seal: mine}, rejectEnvelope},
	} {
		ptp := tp
		if c.reason == rejectEnvelope {
			ptp.Kind = KindPods
		}
		_, err := applyDesired(st, testNode, ptp, c.payload, 1<<20, c.g)
		var r *rejected
		if !errors.As(err, &r) || r.reason != c.reason {
			t.Errorf("%s: %v, want refused for %s", name, err, c.reason)
		}
		if rec, _, _ := st.Secrets().Get("default", "db"); !bytes.Equal(rec.Object.Data["password"], value) {
			t.Errorf("%s: the stored secret changed", name)
		}
	}
}

func flipLast(b []byte) []byte {
	b[len(b)-1] ^= 1
	return b
}

// The bridge's seal and hash keys follow from its signing key: the same
// after a restart with it, others with another key. What is sealed to
// the bridge opens with its key only; a sealed Secret's index hash
// changes with the hash key, the node's key and the body.
func TestBridgeKeysFromTheSigningKey(t *testing.T) {
	k1, _ := GenerateKey()
	k2, _ := GenerateKey()
	a, again, b := NewSigner(k1), NewSigner(k1), NewSigner(k2)
	if a.SealKey().Public() != again.SealKey().Public() || !bytes.Equal(a.HashKey(), again.HashKey()) {
		t.Fatal("keys differ for the same signing key")
	}
	if a.SealKey().Public() == b.SealKey().Public() || bytes.Equal(a.HashKey(), b.HashKey()) {
		t.Fatal("keys equal for two signing keys")
	}
	sealed, err := a.SealKey().PublicKey().Seal([]byte("token"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := again.SealKey().Open(sealed); err != nil || string(got) != "token" {
		t.Fatalf("opened %q, %v", got, err)
	}
	if _, err := b.SealKey().Open(sealed); err == nil {
		t.Fatal("opened with another bridge's key")
	}
	n1, n2 := a.SealKey().PublicKey(), b.SealKey().PublicKey()
	h := SealedHash(a.HashKey(), n1, []byte("x"))
	for _, other := range []string{SealedHash(b.HashKey(), n1, []byte("x")), SealedHash(a.HashKey(), n2, []byte("x")), SealedHash(a.HashKey(), n1, []byte("y")), BodyHash([]byte("x"))} {
		if other == h {
			t.Errorf("hash %s the same for another key or body", h)
		}
	}
}
