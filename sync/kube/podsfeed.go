package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/outpost-edge/outpost/store"
)

// PodsFeed keeps the API pods of many nodes, each in a store of its own,
// with one watch of every bound pod (fieldSelector spec.nodeName!=): the
// MQTT bridge's. A watch per node (LoopPods) costs the API server a
// watch and the client a stream with its goroutines and buffers for every
// node; at fleet size that, not the work, is the cost.
//
// A node added (Add) is listed alone (spec.nodeName=<node>) into its
// store, which is then its complete set of API pods, and its store's
// pods resume version is set, so readers know it was listed; from then
// on the shared watch's events for the node go to its store. Events that
// reach a store before its list, or that the list already had, change
// nothing in the end: the watch delivers each pod's events in order, and
// applying one twice writes nothing. A watch that fell too far behind
// (410 Gone) starts again from now and lists every node again.
//
// Its stores' pods are what LoopPods would store: without status,
// resourceVersion and managedFields, and no mirror pods. The config maps
// and secrets they reference each node's Syncer watches (LoopRefs).
type PodsFeed struct {
	s *Syncer

	mu    sync.Mutex
	nodes map[string]*store.Store
}

// NewPodsFeed returns a PodsFeed; deps.Store is not used but required
// as for New.
func NewPodsFeed(deps Deps) (*PodsFeed, error) {
	s, err := New(Config{NodeName: "pods-feed"}, deps)
	if err != nil {
		return nil, err
	}
	return &PodsFeed{s: s, nodes: map[string]*store.Store{}}, nil
}

// Add feeds node's API pods into st, listing them first; it returns once
// they were listed, retrying until ctx ends.
func (f *PodsFeed) Add(ctx context.Context, node string, st *store.Store) error {
	f.mu.Lock()
	f.nodes[node] = st
	f.mu.Unlock()
	bo := newReconnectBackoff()
	for {
		err := f.listNode(ctx, node, st)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		f.s.retryLater(ctx, &bo, "pods of node "+node, err)
	}
}

// Remove stops feeding node.
func (f *PodsFeed) Remove(node string) {
	f.mu.Lock()
	delete(f.nodes, node)
	f.mu.Unlock()
}

// listNode makes node's listed pods st's complete set of API pods.
func (f *PodsFeed) listNode(ctx context.Context, node string, st *store.Store) error {
	var list corev1.PodList
	err := f.s.deps.Client.Core.Get().Resource("pods").
		VersionedParams(&metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()}, metav1.ParameterCodec).
		Do(ctx).Into(&list)
	if err != nil {
		return fmt.Errorf("list pods of node %s: %w", node, err)
	}
	pods := make([]*corev1.Pod, 0, len(list.Items))
	for i := range list.Items {
		if pod := &list.Items[i]; !isMirrorPod(pod) {
			pods = append(pods, stripPod(pod))
		}
	}
	_, err = st.Pods().Replace(store.SourceAPI, pods)
	conflicts, err := splitConflicts(err)
	for _, c := range conflicts {
		f.s.log.Warn("api pod not stored: a pod of another source has its name", "node", node, "err", c)
	}
	if err != nil {
		return fmt.Errorf("store pods of node %s: %w", node, err)
	}
	if err := st.SetResumeVersion(podsResource, list.ResourceVersion); err != nil {
		return fmt.Errorf("store pods of node %s: %w", node, err)
	}
	return nil
}

// Run watches until ctx ends.
func (f *PodsFeed) Run(ctx context.Context) {
	lw := &listWatch{
		what:     "bound pods",
		client:   f.s.deps.Client.Core,
		resource: "pods",
		selector: fields.OneTermNotEqualSelector("spec.nodeName", "").String(),
		list:     f.relist,
		event:    f.event,
	}
	f.s.listWatch(ctx, lw, "")
}

// relist returns the resourceVersion to watch from (a list of one pod
// gives it), and lists every node again.
func (f *PodsFeed) relist(ctx context.Context) (string, error) {
	var list corev1.PodList
	limit := int64(1)
	err := f.s.deps.Client.Core.Get().Resource("pods").
		VersionedParams(&metav1.ListOptions{Limit: limit}, metav1.ParameterCodec).Do(ctx).Into(&list)
	if err != nil {
		return "", fmt.Errorf("list pods: %w", err)
	}
	f.mu.Lock()
	nodes := make(map[string]*store.Store, len(f.nodes))
	for n, st := range f.nodes {
		nodes[n] = st
	}
	f.mu.Unlock()
	var errs []error
	for n, st := range nodes {
		if err := f.listNode(ctx, n, st); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return "", errors.Join(errs...)
	}
	if len(nodes) > 0 {
		f.s.log.Info("pods of every node listed again", "nodes", len(nodes), "resourceVersion", list.ResourceVersion)
	}
	return list.ResourceVersion, nil
}

// event applies one watch event to the store of the pod's node, if it
// is fed.
func (f *PodsFeed) event(typ watch.EventType, obj runtime.Object) (bool, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return false, fmt.Errorf("pods watch: unexpected %T", obj)
	}
	f.mu.Lock()
	st := f.nodes[pod.Spec.NodeName]
	f.mu.Unlock()
	if st == nil || isMirrorPod(pod) {
		return false, nil
	}
	var changed bool
	var err error
	switch typ {
	case watch.Added, watch.Modified:
		changed, err = putIfChanged(st.Pods(), stripPod(pod), store.Resume{})
		if errors.Is(err, store.ErrSourceConflict) {
			f.s.log.Warn("api pod not stored: a pod of another source has its name", "pod", pod.Namespace+"/"+pod.Name, "err", err)
			return false, nil
		}
	case watch.Deleted:
		changed, err = deleteIfAPI(st.Pods(), pod.Namespace, pod.Name, pod.UID, store.Resume{})
	}
	if err != nil {
		// Not the watch's fault (the node may have been removed and its
		// store closed meanwhile): it goes on.
		f.s.log.Warn("store pod", "pod", pod.Namespace+"/"+pod.Name, "node", pod.Spec.NodeName, "err", err)
		return false, nil
	}
	return changed, nil
}
