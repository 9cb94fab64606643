package kube

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/outpost-edge/outpost/store"
)

// Config maps and secrets from the API server.
//
// Only those the store's API pods reference are fetched, each by its own
// list+watch with fieldSelector metadata.name=<name> in its namespace, as
// kubelet's watch-based manager does: the Node authorizer lets a node read
// exactly the objects its pods reference, and nothing else. They are
// stored as SourceAPI without resourceVersion and managedFields; one that
// does not exist (or no longer does) is removed from the store, and one no
// pod references any more has its watch stopped and is removed too.
// Objects of other sources (a static config map of the same name) are
// never touched.

// refKind is a kind of object a pod references by name.
type refKind uint8

const (
	refConfigMap refKind = iota
	refSecret
)

// podRef names a config map or secret a pod references.
type podRef struct {
	kind            refKind
	namespace, name string
}

func (r podRef) String() string {
	if r.kind == refSecret {
		return "secret " + r.namespace + "/" + r.name
	}
	return "configmap " + r.namespace + "/" + r.name
}

// podRefs adds to into the config maps and secrets pod references: in
// volumes (configMap, secret, and their projected sources), in env
// (valueFrom configMapKeyRef and secretKeyRef) and envFrom of every
// container (init, regular and ephemeral), and its imagePullSecrets.
func podRefs(pod *corev1.Pod, into map[podRef]struct{}) {
	add := func(k refKind, name string) {
		if name != "" {
			into[podRef{kind: k, namespace: pod.Namespace, name: name}] = struct{}{}
		}
	}
	for _, s := range pod.Spec.ImagePullSecrets {
		add(refSecret, s.Name)
	}
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.ConfigMap != nil:
			add(refConfigMap, v.ConfigMap.Name)
		case v.Secret != nil:
			add(refSecret, v.Secret.SecretName)
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				if src.ConfigMap != nil {
					add(refConfigMap, src.ConfigMap.Name)
				}
				if src.Secret != nil {
					add(refSecret, src.Secret.Name)
				}
			}
		}
	}
	containerRefs := func(env []corev1.EnvVar, envFrom []corev1.EnvFromSource) {
		for _, e := range env {
			if e.ValueFrom == nil {
				continue
			}
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
				add(refConfigMap, r.Name)
			}
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				add(refSecret, r.Name)
			}
		}
		for _, e := range envFrom {
			if e.ConfigMapRef != nil {
				add(refConfigMap, e.ConfigMapRef.Name)
			}
			if e.SecretRef != nil {
				add(refSecret, e.SecretRef.Name)
			}
		}
	}
	for _, c := range pod.Spec.InitContainers {
		containerRefs(c.Env, c.EnvFrom)
	}
	for _, c := range pod.Spec.Containers {
		containerRefs(c.Env, c.EnvFrom)
	}
	for _, c := range pod.Spec.EphemeralContainers {
		containerRefs(c.Env, c.EnvFrom)
	}
}

// wantedRefs returns what the store's API pods reference. On an error the
// refs of the pods that could be read are returned with it.
func (s *Syncer) wantedRefs() (map[podRef]struct{}, error) {
	recs, err := s.deps.Store.Pods().List()
	want := map[podRef]struct{}{}
	for _, r := range recs {
		if r.Source == store.SourceAPI {
			podRefs(r.Object, want)
		}
	}
	return want, err
}

// refWatch is one running watch of a referenced object.
type refWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// runRefs owns the set of config map and secret watches: it recomputes
// what the store's API pods reference whenever the stored pods change,
// starts a watch for each new reference, and stops the watch of (and
// removes from the store) each one no pod references any more. At start
// it also removes stored API objects that nothing references, which a
// pod deleted while the agent was down leaves behind.
func (s *Syncer) runRefs(ctx context.Context) {
	podsChanged, unsubscribe := s.deps.Store.Subscribe(store.KindPod)
	defer unsubscribe()
	watches := map[podRef]*refWatch{}
	defer func() {
		for _, w := range watches {
			w.cancel()
		}
		for _, w := range watches {
			<-w.done
		}
	}()
	swept := false
	for {
		s.offload(func() {
			want, err := s.wantedRefs()
			if err != nil {
				// Start what is known to be wanted; stop nothing on a
				// partial read.
				s.log.Warn("read stored pods for their config maps and secrets", "err", err)
			} else {
				var stop []podRef
				for r, w := range watches {
					if _, ok := want[r]; !ok {
						w.cancel()
						stop = append(stop, r)
					}
				}
				for _, r := range stop {
					<-watches[r].done
					delete(watches, r)
					s.dropRef(r)
				}
				if !swept {
					s.sweepRefs(want)
					swept = true
				}
			}
			for r := range want {
				if _, ok := watches[r]; !ok {
					watches[r] = s.startRefWatch(ctx, r)
				}
			}
		})
		select {
		case <-ctx.Done():
			return
		case <-podsChanged:
		}
	}
}

// startRefWatch starts the watch of r; it stops when its cancel is
// called or ctx ends.
func (s *Syncer) startRefWatch(ctx context.Context, r podRef) *refWatch {
	wctx, cancel := context.WithCancel(ctx)
	w := &refWatch{cancel: cancel, done: make(chan struct{})}
	s.log.Debug("watching", "object", r.String())
	go func() {
		defer close(w.done)
		var lw *listWatch
		switch r.kind {
		case refConfigMap:
			lw = refListWatch(s, r, s.deps.Store.ConfigMaps(), "configmaps", func() runtime.Object { return &corev1.ConfigMapList{} })
		case refSecret:
			lw = refListWatch(s, r, s.deps.Store.Secrets(), "secrets", func() runtime.Object { return &corev1.SecretList{} })
		}
		s.listWatch(wctx, lw, "")
	}()
	return w
}

// dropRef removes r from the store if it came from the API server.
func (s *Syncer) dropRef(r podRef) {
	var err error
	var gone bool
	switch r.kind {
	case refConfigMap:
		gone, err = deleteIfAPI(s.deps.Store.ConfigMaps(), r.namespace, r.name, "", store.Resume{})
	case refSecret:
		gone, err = deleteIfAPI(s.deps.Store.Secrets(), r.namespace, r.name, "", store.Resume{})
	}
	if err != nil {
		s.log.Warn("remove unreferenced object from the store", "object", r.String(), "err", err)
	} else if gone {
		s.log.Info("unreferenced object removed from the store", "object", r.String())
	}
}

// sweepRefs removes the stored API config maps and secrets not in want.
func (s *Syncer) sweepRefs(want map[podRef]struct{}) {
	cms, err := s.deps.Store.ConfigMaps().List()
	for _, rec := range cms {
		if r := (podRef{refConfigMap, rec.Object.Namespace, rec.Object.Name}); rec.Source == store.SourceAPI {
			if _, ok := want[r]; !ok {
				s.dropRef(r)
			}
		}
	}
	secs, err2 := s.deps.Store.Secrets().List()
	for _, rec := range secs {
		if r := (podRef{refSecret, rec.Object.Namespace, rec.Object.Name}); rec.Source == store.SourceAPI {
			if _, ok := want[r]; !ok {
				s.dropRef(r)
			}
		}
	}
	if err := errors.Join(err, err2); err != nil {
		s.log.Warn("read stored config maps and secrets", "err", err)
	}
}

// refObject is a config map or a secret.
type refObject[T any] interface {
	storedObject[T]
	runtime.Object
}

// refListWatch is the list+watch of one referenced object into c.
func refListWatch[T any, P refObject[T]](s *Syncer, r podRef, c store.Collection[T, P], resource string, newList func() runtime.Object) *listWatch {
	selector := fields.OneTermEqualSelector("metadata.name", r.name).String()
	put := func(obj runtime.Object) (bool, error) {
		o, ok := obj.(P)
		if !ok {
			return false, fmt.Errorf("watch %s: unexpected %T", r, obj)
		}
		if o.GetNamespace() != r.namespace || o.GetName() != r.name {
			return false, nil
		}
		changed, err := putIfChanged(c, stripMeta(o).(P), store.Resume{})
		if errors.Is(err, store.ErrSourceConflict) {
			s.log.Warn("api object not stored: an object of another source has its name", "object", r.String(), "err", err)
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("store %s: %w", r, err)
		}
		return changed, nil
	}
	drop := func(uid types.UID) (bool, error) {
		gone, err := deleteIfAPI(c, r.namespace, r.name, uid, store.Resume{})
		if err != nil {
			return false, fmt.Errorf("remove %s from the store: %w", r, err)
		}
		return gone, nil
	}
	return &listWatch{
		what:      r.String(),
		client:    s.deps.Client.Core,
		resource:  resource,
		namespace: r.namespace,
		selector:  selector,
		list: func(ctx context.Context) (string, error) {
			list := newList()
			err := s.deps.Client.Core.Get().Namespace(r.namespace).Resource(resource).
				VersionedParams(&metav1.ListOptions{FieldSelector: selector}, metav1.ParameterCodec).
				Do(ctx).Into(list)
			if err != nil {
				return "", fmt.Errorf("list %s: %w", r, err)
			}
			items, err := meta.ExtractList(list)
			if err != nil {
				return "", fmt.Errorf("list %s: %w", r, err)
			}
			found := false
			for _, it := range items {
				if m, err := meta.Accessor(it); err == nil && m.GetName() == r.name {
					found = true
					if _, err := put(it); err != nil {
						return "", err
					}
				}
			}
			if !found {
				if _, err := drop(""); err != nil {
					return "", err
				}
			}
			lm, err := meta.ListAccessor(list)
			if err != nil {
				return "", fmt.Errorf("list %s: %w", r, err)
			}
			return lm.GetResourceVersion(), nil
		},
		event: func(typ watch.EventType, obj runtime.Object) (bool, error) {
			if typ == watch.Deleted {
				m, err := meta.Accessor(obj)
				if err != nil {
					return false, fmt.Errorf("watch %s: %w", r, err)
				}
				return drop(m.GetUID())
			}
			return put(obj)
		},
	}
}

// stripMeta returns a copy of obj as it is stored: without type meta,
// resourceVersion and managedFields.
func stripMeta(obj runtime.Object) runtime.Object {
	out := obj.DeepCopyObject()
	clearMeta(out)
	return out
}

// clearMeta removes in place what stripMeta leaves out of its copy.
func clearMeta(obj runtime.Object) {
	obj.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
	if m, err := meta.Accessor(obj); err == nil {
		m.SetResourceVersion("")
		m.SetManagedFields(nil)
	}
}
