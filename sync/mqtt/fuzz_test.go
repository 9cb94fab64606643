package mqtt

import (
	"bytes"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/store"
)

func FuzzEnvelope(f *testing.F) {
	f.Add(Envelope{Kind: "Pod", Generation: 7, Encoding: EncodingProtobuf, Body: []byte{1, 2}}.Marshal())
	f.Add(Envelope{Kind: "Pod", Generation: 7, Encoding: EncodingTombstone}.Marshal())
	f.Add([]byte("op\x01\x01\x03Pod\x02\x01\x07\x03\x01\x01\x00"))
	f.Add([]byte("op\x01\x09\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := UnmarshalEnvelope(data)
		if err != nil {
			return
		}
		// What decodes lays out again to something that decodes the
		// same.
		again, err := UnmarshalEnvelope(e.Marshal())
		if err != nil {
			t.Fatalf("re-encoded envelope does not decode: %v", err)
		}
		if again.Kind != e.Kind || again.Generation != e.Generation || again.Encoding != e.Encoding || !bytes.Equal(again.Body, e.Body) || !again.Issued.Equal(e.Issued) {
			t.Fatalf("round trip changed the envelope: %+v -> %+v", e, again)
		}
	})
}

func FuzzParseTopic(f *testing.F) {
	for _, s := range []string{
		DesiredTopic("pi-1", KindPods, "default", "web"), ClusterTopic(KindServices, "kube-system", "dns"),
		NodeIndexTopic("pi-1"), ClusterIndexTopic, PodStatusTopic("pi-1", "default", "web"),
		NodeStatusTopic("pi-1"), EventsTopic("pi-1"), OnlineTopic("pi-1"), "outpost/v1/nodes/+/status/#",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tp, err := ParseTopic(s)
		if err != nil {
			return
		}
		if got := tp.String(); got != s {
			t.Fatalf("ParseTopic(%q).String() = %q", s, got)
		}
	})
}

func FuzzParseIndex(f *testing.F) {
	f.Add([]byte("pods/default/web 12\nconfigmaps/default/c 3\n"), uint8(ScopeNode))
	f.Add([]byte("services/default/web 12\n"), uint8(ScopeCluster))
	f.Add([]byte("pods/default/web x\n"), uint8(ScopeNode))
	f.Add([]byte("pods/default/web 12 9f2c4e1a0b3d5c7e\n"), uint8(ScopeNode))
	f.Fuzz(func(t *testing.T, body []byte, scope uint8) {
		sc := Scope(scope%2 + 1)
		x, err := ParseIndex(Envelope{Kind: "Index", Generation: 1, Encoding: EncodingIndex, Body: body}, sc)
		if err != nil {
			return
		}
		y, err := ParseIndex(x.Envelope(), sc)
		if err != nil {
			t.Fatalf("re-encoded index does not parse: %v", err)
		}
		if len(x.Entries) != len(y.Entries) {
			t.Fatalf("round trip: %d entries, then %d", len(x.Entries), len(y.Entries))
		}
		for k, g := range x.Entries {
			if y.Entries[k] != g || y.Hashes[k] != x.Hashes[k] {
				t.Fatalf("round trip changed %s: %d %s -> %d %s", k, g, x.Hashes[k], y.Entries[k], y.Hashes[k])
			}
		}
	})
}

// FuzzApplyDesired feeds any payload to every desired kind's decoder
// over a store holding one object of each: it may refuse the message,
// but never panic, and a refused message leaves the store as it was.
func FuzzApplyDesired(f *testing.F) {
	pod := testPod("web", "u1")
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}, Spec: corev1.ServiceSpec{ClusterIP: "10.43.0.9"}}
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}}, AddressType: discoveryv1.AddressTypeIPv4}
	f.Add(uint8(0), desiredPayload(f, "Pod", pod, 9))
	f.Add(uint8(3), desiredPayload(f, "Service", svc, 9))
	f.Add(uint8(4), desiredPayload(f, "EndpointSlice", slice, 9))
	f.Add(uint8(1), []byte{})
	st, err := store.Open(filepath.Join(f.TempDir(), store.FileName), store.Options{NodeName: testNode, SkipCheck: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	kinds := []string{KindPods, KindConfigMaps, KindSecrets, KindServices, KindEndpointSlices}
	f.Fuzz(func(t *testing.T, k uint8, payload []byte) {
		kind := kinds[int(k)%len(kinds)]
		tp := Topic{Node: testNode, Scope: ScopeNode, Kind: kind, Namespace: "default", Name: "web"}
		if oneOf(kind, clusterKinds) {
			tp = Topic{Scope: ScopeCluster, Kind: kind, Namespace: "default", Name: "web"}
		}
		before, _ := storedGenerations(st, tp.Scope)
		_, err := applyDesired(st, testNode, tp, payload, 1<<16, guard{})
		if err != nil {
			after, _ := storedGenerations(st, tp.Scope)
			if len(after) != len(before) {
				t.Fatalf("a refused message changed the store: %v -> %v (%v)", before, after, err)
			}
			for key, g := range before {
				if after[key] != g {
					t.Fatalf("a refused message changed %s: %d -> %d (%v)", key, g, after[key], err)
				}
			}
		}
	})
}

func FuzzDecode(f *testing.F) {
	f.Add(desiredPayload(f, "Pod", testPod("web", "u1"), 9))
	f.Add([]byte("true"))
	f.Add(Index{Generation: 3, Entries: map[string]uint64{"pods/default/web": 3}}.Envelope().Marshal())
	f.Fuzz(func(t *testing.T, payload []byte) { Decode(payload) })
}
