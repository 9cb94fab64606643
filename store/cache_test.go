package store

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestListCached: a cached list returns what List returns; an unchanged
// object is the one the last list returned (not decoded again), a changed
// one is decoded anew, and a deleted one leaves the cache.
func TestListCached(t *testing.T) {
	s := openTemp(t)
	svc := func(name, ip string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: corev1.ServiceSpec{ClusterIP: ip}}
	}
	for _, o := range []*corev1.Service{svc("a", "10.43.0.1"), svc("b", "10.43.0.2"), svc("c", "10.43.0.3")} {
		if err := s.Services().Put(SourceAPI, o); err != nil {
			t.Fatal(err)
		}
	}
	cache := NewCache[*corev1.Service]()
	first, err := s.Services().ListCached(cache)
	if err != nil || len(first) != 3 {
		t.Fatalf("ListCached = %d records, %v", len(first), err)
	}
	if err := s.Services().Put(SourceAPI, svc("b", "10.43.0.20")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Services().Delete("default", "c"); err != nil {
		t.Fatal(err)
	}
	second, err := s.Services().ListCached(cache)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := s.Services().List()
	if err != nil {
		t.Fatal(err)
	}
	if len(second) != len(plain) {
		t.Fatalf("cached list has %d records, List %d", len(second), len(plain))
	}
	for i := range plain {
		if second[i].Object.Name != plain[i].Object.Name || second[i].Object.Spec.ClusterIP != plain[i].Object.Spec.ClusterIP || second[i].Source != plain[i].Source {
			t.Errorf("record %d: cached %s %s, List %s %s", i, second[i].Object.Name, second[i].Object.Spec.ClusterIP, plain[i].Object.Name, plain[i].Object.Spec.ClusterIP)
		}
	}
	if second[0].Object != first[0].Object {
		t.Error("the unchanged service a was decoded again")
	}
	if second[1].Object == first[1].Object {
		t.Error("the changed service b came from the cache")
	}
	if cache.Len() != 2 {
		t.Errorf("cache holds %d objects after c was deleted, want 2", cache.Len())
	}
}
