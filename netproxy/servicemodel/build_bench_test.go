package servicemodel

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/outpost-edge/outpost/store"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BenchmarkIndexAddOne: with N API Services × 5 endpoints in an Index,
// one op is adding one Service and its slice and building (what the
// proxy builds for one Service added, without reading the store).
func BenchmarkIndexAddOne(b *testing.B) {
	ptr := func(v bool) *bool { return &v }
	svc := func(i int) store.Record[*corev1.Service] {
		return store.Record[*corev1.Service]{Source: store.SourceAPI, Object: &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%05d", i), Namespace: "bench"},
			Spec: corev1.ServiceSpec{ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String(),
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
		}}
	}
	slice := func(i int) store.Record[*discoveryv1.EndpointSlice] {
		port, name := int32(8080), "http"
		sl := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("svc-%05d", i), Namespace: "bench", Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("svc-%05d", i)}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
		}
		for e := range 5 {
			n := i*5 + e
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{netip.AddrFrom4([4]byte{10, 64 + byte(n>>16), byte(n >> 8), byte(n)}).String()},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
			})
		}
		return store.Record[*discoveryv1.EndpointSlice]{Source: store.SourceAPI, Object: sl}
	}
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			x := NewIndex("node")
			all := Objects{Services: map[string]store.Record[*corev1.Service]{}, Slices: map[string]store.Record[*discoveryv1.EndpointSlice]{}}
			for i := range n + 1 {
				r, sl := svc(i), slice(i)
				all.Services[store.Key(r.Object.Namespace, r.Object.Name)] = r
				all.Slices[store.Key(sl.Object.Namespace, sl.Object.Name)] = sl
				if i < n {
					x.ServiceChanged(store.Key(r.Object.Namespace, r.Object.Name), true)
					x.SliceChanged(store.Key(sl.Object.Namespace, sl.Object.Name), SliceOwner(sl.Object))
				}
			}
			build := func() []PortChange {
				x.Pending(nil)
				ch, _ := x.Build(all)
				return ch
			}
			build()
			key := fmt.Sprintf("bench/svc-%05d", n)
			for b.Loop() {
				x.ServiceChanged(key, true)
				x.SliceChanged(key, key)
				if ch := build(); len(ch) != 1 {
					b.Fatalf("Build = %d changes, want 1", len(ch))
				}
				b.StopTimer()
				x.ServiceChanged(key, false)
				x.SliceChanged(key, "")
				build()
				b.StartTimer()
			}
		})
	}
}
