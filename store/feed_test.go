package store

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestFeed: a Feed reports everything at its first Take, then the keys
// that puts, deletes and replaces changed (not those of writes that
// changed nothing, nor of other kinds), and everything again after too
// many keys or once closed.
func TestFeed(t *testing.T) {
	s := openTemp(t)
	svc := func(name, ip string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: corev1.ServiceSpec{ClusterIP: ip}}
	}
	put := func(o *corev1.Service) {
		t.Helper()
		if err := s.Services().Put(SourceAPI, o); err != nil {
			t.Fatal(err)
		}
	}
	take := func(f *Feed, wantAll bool, want map[Kind][]string) {
		t.Helper()
		got, all := f.Take()
		if all != wantAll {
			t.Fatalf("Take: all = %v, want %v", all, wantAll)
		}
		for k, keys := range want {
			if !slices.Equal(got[k], keys) {
				t.Errorf("Take: %s keys = %q, want %q", k, got[k], keys)
			}
		}
		for k, keys := range got {
			if _, ok := want[k]; !ok && len(keys) > 0 {
				t.Errorf("Take: %s keys = %q, want none", k, keys)
			}
		}
	}
	put(svc("a", "10.43.0.1"))
	f := s.Feed(KindService, KindEndpointSlice)
	take(f, true, nil)
	take(f, false, nil)

	put(svc("b", "10.43.0.2"))
	put(svc("a", "10.43.0.1")) // the same bytes: no change
	put(svc("c", "10.43.0.3"))
	if _, err := s.Services().Delete("default", "b"); err != nil {
		t.Fatal(err)
	}
	if err := s.Pods().Put(SourceAPI, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p"}}); err != nil {
		t.Fatal(err)
	}
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a-1"}, AddressType: discoveryv1.AddressTypeIPv4}
	if err := s.EndpointSlices().Put(SourceAPI, sl); err != nil {
		t.Fatal(err)
	}
	take(f, false, map[Kind][]string{KindService: {"default/b", "default/c"}, KindEndpointSlice: {"default/a-1"}})

	// Replace: a kept, c changed, d added, nothing deleted but c's old
	// value; then one that changes nothing.
	if _, err := s.Services().Replace(SourceAPI, []*corev1.Service{svc("a", "10.43.0.1"), svc("c", "10.43.0.30"), svc("d", "10.43.0.4")}); err != nil {
		t.Fatal(err)
	}
	take(f, false, map[Kind][]string{KindService: {"default/c", "default/d"}})
	if _, err := s.Services().Replace(SourceAPI, []*corev1.Service{svc("a", "10.43.0.1"), svc("d", "10.43.0.4")}); err != nil {
		t.Fatal(err)
	}
	take(f, false, map[Kind][]string{KindService: {"default/c"}})
	take(f, false, nil)

	many := make([]*corev1.Service, maxFeedKeys+1)
	for i := range many {
		many[i] = svc(fmt.Sprintf("m%d", i), "")
	}
	if _, err := s.Services().Replace(SourceAPI, many); err != nil {
		t.Fatal(err)
	}
	take(f, true, nil)
	put(svc("a", "10.43.0.10"))
	take(f, false, map[Kind][]string{KindService: {"default/a"}})

	f.Close()
	put(svc("a", "10.43.0.11"))
	take(f, true, nil)
	take(f, true, nil)
}
