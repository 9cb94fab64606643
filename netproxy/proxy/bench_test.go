package proxy

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/netproxy/nft"
	"github.com/outpost-edge/outpost/store"
)

// BenchmarkSyncUnchanged is what one sync costs with N API Services × 5
// endpoints in the store and nothing changed: what every pod status change
// costs the proxy (read and decode the store, Build, compare).
func BenchmarkSyncUnchanged(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st, err := store.Open(filepath.Join(b.TempDir(), store.FileName), store.Options{NodeName: node})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			svcs := make([]*corev1.Service, n)
			slices := make([]*discoveryv1.EndpointSlice, n)
			for i := range n {
				name := fmt.Sprintf("svc-%d", i)
				svcs[i] = &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: "u"},
					Spec: corev1.ServiceSpec{ClusterIP: netip.AddrFrom4([4]byte{10, 43, byte(i >> 8), byte(i)}).String(),
						Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
				}
				sl := &discoveryv1.EndpointSlice{
					ObjectMeta:  metav1.ObjectMeta{Name: name + "-x", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
					AddressType: discoveryv1.AddressTypeIPv4,
					Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
				}
				for e := range 5 {
					sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
						Addresses:  []string{netip.AddrFrom4([4]byte{10, 44, byte(i >> 6), byte(i<<2 | e)}).String()},
						Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
					})
				}
				slices[i] = sl
			}
			if _, err := st.Services().Replace(store.SourceAPI, svcs); err != nil {
				b.Fatal(err)
			}
			if _, err := st.EndpointSlices().Replace(store.SourceAPI, slices); err != nil {
				b.Fatal(err)
			}
			p, err := New(Config{Node: node, PodCIDR: podCIDR}, Deps{Store: st, Ruleset: nft.NewFake()})
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Sync(); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := p.Sync(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
