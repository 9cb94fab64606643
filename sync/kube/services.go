package kube

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/outpost-edge/outpost/store"
)

// Services and endpoint slices from the API server, for the service proxy.
//
// Services of all namespaces, and the endpoint slices of all namespaces
// that carry the label kubernetes.io/service-name (labelSelector: slices
// a controller made for a Service), are listed and watched into the store
// as SourceAPI, each by its own goroutine. They are stored whole, status
// included (a Service's status.loadBalancer is what the proxy serves),
// without type meta, resourceVersion and managedFields: a change of
// managedFields alone writes nothing to the SD card. An object of another
// source (a static Service of the same namespace/name) is never replaced
// or removed; the API's is then not stored, and that is logged.
//
// Resuming is the pods watch's (pods.go): the resourceVersion each watch
// reached is persisted under its own resume key ("services",
// "endpointslices"), after a change of a stored object and otherwise at
// most every rvPersistPeriod; a restarted agent watches from it without
// listing, and only a 410 Gone relists, replacing the store's API objects
// of that kind with the list, so objects deleted meanwhile are removed.
//
// The node identity may list and watch services (the Node authorizer's
// rules allow it), but not endpoint slices: packaging/rbac.yaml binds
// ClusterRole system:node-proxier to group system:nodes for that. Until
// it is applied the endpoint slices watch fails with 403 and is retried
// with backoff; the services watch is not affected.

// The resume keys of the watches, also their resources' REST names.
const (
	servicesResource       = "services"
	endpointSlicesResource = "endpointslices"
)

// runServices keeps the store's API services in step with the API server,
// until ctx ends.
func (s *Syncer) runServices(ctx context.Context) {
	newClusterSync(s, s.deps.Store.Services(), clusterKind{
		resource: servicesResource, noun: "service", logKey: "service",
		client:  s.deps.Client.Core,
		newList: func() runtime.Object { return &corev1.ServiceList{} },
	}).run(ctx)
}

// runEndpointSlices keeps the store's API endpoint slices (those of a
// Service) in step with the API server, until ctx ends.
func (s *Syncer) runEndpointSlices(ctx context.Context) {
	newClusterSync(s, s.deps.Store.EndpointSlices(), clusterKind{
		resource: endpointSlicesResource, noun: "endpoint slice", logKey: "endpointSlice",
		client:  s.deps.Client.Discovery,
		labels:  discoveryv1.LabelServiceName,
		newList: func() runtime.Object { return &discoveryv1.EndpointSliceList{} },
	}).run(ctx)
}

// clusterKind describes a resource watched in all namespaces.
type clusterKind struct {
	// resource is the REST resource and the resume key.
	resource string
	// noun names one object in logs and errors ("endpoint slice");
	// logKey is the log attribute holding its namespace/name.
	noun, logKey string
	client       rest.Interface
	// labels is the label selector of the list and the watch.
	labels  string
	newList func() runtime.Object
}

// apiObject is an object a clusterSync stores.
type apiObject[T any] interface {
	storedObject[T]
	runtime.Object
	GetResourceVersion() string
}

// clusterSync is the state of one watch of a resource in all namespaces:
// the newest resourceVersion seen and the one last persisted.
type clusterSync[T any, P apiObject[T]] struct {
	s    *Syncer
	c    store.Collection[T, P]
	kind clusterKind

	rv          string
	persisted   string
	persistedAt time.Time
}

func newClusterSync[T any, P apiObject[T]](s *Syncer, c store.Collection[T, P], k clusterKind) *clusterSync[T, P] {
	return &clusterSync[T, P]{s: s, c: c, kind: k, persistedAt: s.deps.Clock.Now()}
}

// what names the watch in logs and errors.
func (w *clusterSync[T, P]) what() string { return w.kind.resource + " of all namespaces" }

// run lists (unless a resume version is stored) and watches until ctx
// ends, then persists the version reached.
func (w *clusterSync[T, P]) run(ctx context.Context) {
	s := w.s
	rv, err := s.deps.Store.ResumeVersion(w.kind.resource)
	if err != nil {
		s.log.Warn("read resume version; relisting", "watch", w.what(), "err", err)
		rv = ""
	}
	w.rv, w.persisted = rv, rv
	if rv != "" {
		s.log.Info("resuming watch", "watch", w.what(), "resourceVersion", rv)
	}
	s.listWatch(ctx, &listWatch{
		what:     w.what(),
		client:   w.kind.client,
		resource: w.kind.resource,
		labels:   w.kind.labels,
		list:     w.list,
		event:    w.event,
		progress: w.progress,
	}, rv)
	w.persist()
}

// list lists the resource, makes the result the store's complete set of
// API objects of its kind and returns the list's resourceVersion.
func (w *clusterSync[T, P]) list(ctx context.Context) (string, error) {
	s := w.s
	list := w.kind.newList()
	err := w.kind.client.Get().Resource(w.kind.resource).
		VersionedParams(&metav1.ListOptions{LabelSelector: w.kind.labels}, metav1.ParameterCodec).
		Do(ctx).Into(list)
	if err != nil {
		return "", fmt.Errorf("list %s: %w", w.what(), err)
	}
	lm, err := meta.ListAccessor(list)
	if err != nil {
		return "", fmt.Errorf("list %s: %w", w.what(), err)
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return "", fmt.Errorf("list %s: %w", w.what(), err)
	}
	objs := make([]P, 0, len(items))
	for _, it := range items {
		o, ok := it.(P)
		if !ok {
			return "", fmt.Errorf("list %s: unexpected %T", w.what(), it)
		}
		// The list is ours: strip in place rather than copy it all.
		clearMeta(o)
		objs = append(objs, o)
	}
	n, err := w.c.Replace(store.SourceAPI, objs)
	conflicts, err := splitConflicts(err)
	for _, c := range conflicts {
		s.log.Warn("api "+w.kind.noun+" not stored: a "+w.kind.noun+" of another source has its name", "err", c)
	}
	if err != nil {
		return "", fmt.Errorf("store %s: %w", w.what(), err)
	}
	s.log.Info(w.kind.resource+" listed", w.kind.resource, len(objs), "changed", n, "resourceVersion", lm.GetResourceVersion())
	w.rv = lm.GetResourceVersion()
	w.persist()
	return w.rv, nil
}

// event applies one watch event to the store and reports whether a stored
// object changed.
func (w *clusterSync[T, P]) event(typ watch.EventType, obj runtime.Object) (bool, error) {
	o, ok := obj.(P)
	if !ok {
		return false, fmt.Errorf("watch %s: unexpected %T", w.what(), obj)
	}
	s := w.s
	key := o.GetNamespace() + "/" + o.GetName()
	// A change is stored with the event's resourceVersion, in one commit;
	// progress then finds it persisted.
	resume := store.Resume{Resource: w.kind.resource, Version: o.GetResourceVersion()}
	var changed bool
	var err error
	switch typ {
	case watch.Added, watch.Modified:
		// A copy: watchOnce reads the event's resourceVersion after.
		changed, err = putIfChanged(w.c, stripMeta(o).(P), resume)
		if errors.Is(err, store.ErrSourceConflict) {
			s.log.Warn("api "+w.kind.noun+" not stored: a "+w.kind.noun+" of another source has its name", w.kind.logKey, key, "err", err)
			return false, nil
		}
	case watch.Deleted:
		changed, err = deleteIfAPI(w.c, o.GetNamespace(), o.GetName(), o.GetUID(), resume)
	}
	if err != nil {
		return false, fmt.Errorf("store %s %s: %w", w.kind.noun, key, err)
	}
	if changed && resume.Version != "" {
		w.persisted, w.persistedAt = resume.Version, s.deps.Clock.Now()
	}
	s.log.Debug(w.kind.noun+" event", "event", string(typ), w.kind.logKey, key,
		"resourceVersion", o.GetResourceVersion(), "changed", changed)
	return changed, nil
}

// progress records the resourceVersion the watch reached and persists it
// when a stored object changed or the last write is rvPersistPeriod old.
func (w *clusterSync[T, P]) progress(rv string, changed bool) {
	w.rv = rv
	if changed || w.s.deps.Clock.Since(w.persistedAt) >= rvPersistPeriod {
		w.persist()
	}
}

// persist writes the newest resourceVersion seen, unless it is the one
// already stored.
func (w *clusterSync[T, P]) persist() {
	if w.rv == "" || w.rv == w.persisted {
		return
	}
	if err := w.s.deps.Store.SetResumeVersion(w.kind.resource, w.rv); err != nil {
		w.s.log.Warn("persist resume version", "watch", w.what(), "resourceVersion", w.rv, "err", err)
		return
	}
	w.persisted, w.persistedAt = w.rv, w.s.deps.Clock.Now()
}
