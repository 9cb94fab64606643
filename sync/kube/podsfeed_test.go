package kube

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/store"
)

// One PodsFeed watch keeps each node's store: a node added is listed
// into its store (its resume version set), the events of its pods go
// there and nowhere else, mirror pods and other nodes' pods are not
// stored, and a node removed gets no more.
func TestPodsFeed(t *testing.T) {
	e := pwStartAPI(t)
	c, err := NewClient(e.api.Config, "outpost-test-feed")
	if err != nil {
		t.Fatal(err)
	}
	e.createPod("a1", "n1")
	e.createPod("b1", "n2")
	e.createPod("c1", "n3")
	e.createPod("mirror", "n1", func(p *corev1.Pod) {
		p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "abc"}
	})
	st1, st2 := pwStore(t, "n1"), pwStore(t, "n2")
	f, err := NewPodsFeed(Deps{Client: c, Store: pwStore(t, "feed"), Clock: clock.Real{}, Log: pwLog(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	defer func() { cancel(); <-done }()

	if err := f.Add(ctx, "n1", st1); err != nil {
		t.Fatal(err)
	}
	if err := f.Add(ctx, "n2", st2); err != nil {
		t.Fatal(err)
	}
	if pwResumeVersion(t, st1) == "" || pwResumeVersion(t, st2) == "" {
		t.Fatal("a node listed has no pods resume version")
	}
	has := func(st *store.Store, name string) bool { _, ok := pwStored(t, st, name); return ok }
	if !has(st1, "a1") || !has(st2, "b1") || has(st1, "b1") || has(st1, "mirror") || has(st1, "c1") || has(st2, "c1") {
		t.Fatal("listed stores do not hold exactly their nodes' pods")
	}

	e.createPod("a2", "n1")
	e.createPod("b2", "n2")
	e.createPod("c2", "n3")
	apiWait.Until(e.t, "a2 and b2 in their nodes' stores", func() bool { return has(st1, "a2") && has(st2, "b2") })
	e.deletePod("a1", 0)
	apiWait.Until(e.t, "a1 gone from n1's store", func() bool { return !has(st1, "a1") })
	if has(st1, "b2") || has(st2, "a2") || has(st1, "c2") || has(st2, "c2") {
		t.Fatal("a pod went to another node's store")
	}

	f.Remove("n2")
	e.createPod("b3", "n2")
	e.createPod("a3", "n1")
	apiWait.Until(e.t, "a3 in n1's store", func() bool { return has(st1, "a3") })
	if has(st2, "b3") {
		t.Fatal("a node removed from the feed got a pod")
	}
}
