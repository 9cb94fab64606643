package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/outpost-edge/outpost/internal/backoff"
	"github.com/outpost-edge/outpost/store"
)

// Pods from the API server.
//
// The pods bound to the node are listed and watched (fieldSelector
// spec.nodeName=<node>) into the store as SourceAPI, without status,
// resourceVersion and managedFields: the watch echoes every status patch
// of ours, and such an echo must write nothing to the SD card. Mirror pods
// are status of static pods, not desired state, and are never stored.
//
// Resuming: the resourceVersion the watch reached is persisted in the
// store's meta bucket (resource "pods"). A restarted agent watches from it
// without listing; only when the server answers 410 Gone (the version left
// its watch cache) does it relist, and the list replaces the store's API
// pods, so pods deleted meanwhile are removed. The version is written
// after an event that changed a stored pod (right after that pod, so a
// crash can only make it older, which replays events and costs nothing),
// and otherwise (bookmarks, status echoes) at most every rvPersistPeriod
// and when the loop stops: an idle node writes nothing per event.

// podsResource names the pods watch's resume version in the store.
const podsResource = "pods"

const (
	// rvPersistPeriod bounds how often a resourceVersion that changed
	// nothing stored (a bookmark, an echo of a status patch) is written.
	rvPersistPeriod = 5 * time.Minute
	// watchTimeout plus up to watchTimeoutJitter is the timeoutSeconds
	// of a watch: the server then ends it cleanly and it is restarted
	// from where it got, so a half-open connection is noticed within
	// that time and watches of a fleet do not all restart together.
	watchTimeout       = 5 * time.Minute
	watchTimeoutJitter = 5 * time.Minute
	// minWatchLife: a watch that ends sooner with no event is treated as
	// a failure and retried with backoff, so a server that accepts and
	// closes at once is not hammered.
	minWatchLife = time.Second
)

// runPods keeps the store's API pods and the config maps and secrets they
// reference in step with the API server, until ctx ends.
func (s *Syncer) runPods(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { s.runRefs(ctx) })
	rv, err := s.deps.Store.ResumeVersion(podsResource)
	if err != nil {
		s.log.Warn("read pods resume version; relisting", "err", err)
		rv = ""
	}
	p := &podSync{s: s, rv: rv, persisted: rv, persistedAt: s.deps.Clock.Now()}
	lw := &listWatch{
		what:     "pods of node " + s.cfg.NodeName,
		client:   s.deps.Client.Core,
		resource: "pods",
		selector: fields.OneTermEqualSelector("spec.nodeName", s.cfg.NodeName).String(),
		list:     p.list,
		event:    p.event,
		progress: p.progress,
	}
	if rv != "" {
		s.log.Info("resuming pods watch", "resourceVersion", rv)
	}
	s.listWatch(ctx, lw, rv)
	p.persist()
	wg.Wait()
}

// podSync is the state of the pods watch: the newest resourceVersion seen
// and the one last persisted.
type podSync struct {
	s           *Syncer
	rv          string
	persisted   string
	persistedAt time.Time
}

// list lists the node's pods, makes them the store's complete set of API
// pods and returns the list's resourceVersion.
func (p *podSync) list(ctx context.Context) (string, error) {
	s := p.s
	var list corev1.PodList
	err := s.deps.Client.Core.Get().Resource("pods").
		VersionedParams(&metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", s.cfg.NodeName).String()}, metav1.ParameterCodec).
		Do(ctx).Into(&list)
	if err != nil {
		return "", fmt.Errorf("list pods of node %s: %w", s.cfg.NodeName, err)
	}
	pods := make([]*corev1.Pod, 0, len(list.Items))
	for i := range list.Items {
		if pod := &list.Items[i]; !isMirrorPod(pod) {
			pods = append(pods, stripPod(pod))
		}
	}
	n, err := s.deps.Store.Pods().Replace(store.SourceAPI, pods)
	conflicts, err := splitConflicts(err)
	for _, c := range conflicts {
		s.log.Warn("api pod not stored: a pod of another source has its name", "err", c)
	}
	if err != nil {
		return "", fmt.Errorf("store pods of node %s: %w", s.cfg.NodeName, err)
	}
	s.log.Info("pods listed", "pods", len(pods), "changed", n, "resourceVersion", list.ResourceVersion)
	p.rv = list.ResourceVersion
	p.persist()
	return list.ResourceVersion, nil
}

// event applies one watch event to the store and reports whether a stored
// pod changed.
func (p *podSync) event(typ watch.EventType, obj runtime.Object) (bool, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return false, fmt.Errorf("pods watch: unexpected %T", obj)
	}
	if isMirrorPod(pod) {
		return false, nil
	}
	s := p.s
	// A change is stored with the event's resourceVersion, in one commit;
	// progress then finds it persisted.
	resume := store.Resume{Resource: podsResource, Version: pod.ResourceVersion}
	var changed bool
	var err error
	switch typ {
	case watch.Added, watch.Modified:
		changed, err = putIfChanged(s.deps.Store.Pods(), stripPod(pod), resume)
		if errors.Is(err, store.ErrSourceConflict) {
			s.log.Warn("api pod not stored: a pod of another source has its name", "pod", pod.Namespace+"/"+pod.Name, "err", err)
			return false, nil
		}
	case watch.Deleted:
		changed, err = deleteIfAPI(s.deps.Store.Pods(), pod.Namespace, pod.Name, pod.UID, resume)
	}
	if err != nil {
		return false, fmt.Errorf("store pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if changed && resume.Version != "" {
		p.persisted, p.persistedAt = resume.Version, s.deps.Clock.Now()
	}
	s.log.Debug("pod event", "event", string(typ), "pod", pod.Namespace+"/"+pod.Name,
		"resourceVersion", pod.ResourceVersion, "changed", changed)
	return changed, nil
}

// progress records the resourceVersion the watch reached and persists it
// when a stored pod changed or the last write is rvPersistPeriod old.
func (p *podSync) progress(rv string, changed bool) {
	p.rv = rv
	if changed || p.s.deps.Clock.Since(p.persistedAt) >= rvPersistPeriod {
		p.persist()
	}
}

// persist writes the newest resourceVersion seen, unless it is the one
// already stored.
func (p *podSync) persist() {
	if p.rv == "" || p.rv == p.persisted {
		return
	}
	if err := p.s.deps.Store.SetResumeVersion(podsResource, p.rv); err != nil {
		p.s.log.Warn("persist pods resume version", "resourceVersion", p.rv, "err", err)
		return
	}
	p.persisted, p.persistedAt = p.rv, p.s.deps.Clock.Now()
}

// isMirrorPod reports whether pod is a mirror pod (a static pod's copy in the
// API server).
func isMirrorPod(pod *corev1.Pod) bool {
	_, ok := pod.Annotations[corev1.MirrorPodAnnotationKey]
	return ok
}

// stripPod returns the pod as it is stored: without status (but for its
// readiness gates' conditions, store.DesiredPodStatus), type meta,
// resourceVersion and managedFields, which change without the desired
// state changing.
func stripPod(pod *corev1.Pod) *corev1.Pod {
	out := pod.DeepCopy()
	out.TypeMeta = metav1.TypeMeta{}
	out.ResourceVersion = ""
	out.ManagedFields = nil
	out.Status = store.DesiredPodStatus(pod)
	return out
}

// storedObject is what the API watches store.
type storedObject[T any] interface {
	*T
	store.Object
	GetUID() types.UID
}

// putIfChanged stores obj as SourceAPI, with resume (zero: none) in the
// same commit, unless the store already holds it
// as such, and reports whether it wrote. Looking first costs a read; a
// write that changes nothing would still commit a transaction and fsync.
func putIfChanged[T any, P storedObject[T]](c store.Collection[T, P], obj P, resume store.Resume) (bool, error) {
	rec, found, err := c.Get(obj.GetNamespace(), obj.GetName())
	if err == nil && found && rec.Source == store.SourceAPI {
		if same, err := sameEncoding(rec.Object, obj); err == nil && same {
			return false, nil
		}
	}
	if err := c.PutResumed(store.SourceAPI, obj, resume); err != nil {
		return false, err
	}
	return true, nil
}

// sameEncoding reports whether a and b encode to the same bytes.
func sameEncoding(a, b store.Object) (bool, error) {
	ab, err := a.Marshal()
	if err != nil {
		return false, err
	}
	bb, err := b.Marshal()
	if err != nil {
		return false, err
	}
	return bytes.Equal(ab, bb), nil
}

// deleteIfAPI deletes namespace/name when the store holds it from the API
// server (with uid, unless uid is empty), and reports whether it did. An
// object of another source of the same name is never removed.
func deleteIfAPI[T any, P storedObject[T]](c store.Collection[T, P], namespace, name string, uid types.UID, resume store.Resume) (bool, error) {
	rec, found, err := c.Get(namespace, name)
	if err != nil || !found || rec.Source != store.SourceAPI || (uid != "" && rec.Object.GetUID() != uid) {
		return false, err
	}
	return c.DeleteResumed(namespace, name, resume)
}

// splitConflicts separates the source conflicts a Replace reports from
// its other errors.
func splitConflicts(err error) (conflicts []error, rest error) {
	if err == nil {
		return nil, nil
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	var others []error
	for _, e := range errs {
		if errors.Is(e, store.ErrSourceConflict) {
			conflicts = append(conflicts, e)
		} else {
			others = append(others, e)
		}
	}
	return conflicts, errors.Join(others...)
}

// listWatch describes one list+watch of a resource into the store.
type listWatch struct {
	what      string // for logs: "pods of node n1", "configmap ns/name"
	client    rest.Interface
	resource  string
	namespace string
	// selector is the field selector, labels the label selector.
	selector string
	labels   string
	// list lists the resource, reconciles the store with the result and
	// returns the list's resourceVersion.
	list func(ctx context.Context) (string, error)
	// event applies an ADDED, MODIFIED or DELETED event and reports
	// whether the store changed.
	event func(watch.EventType, runtime.Object) (bool, error)
	// progress, when set, is told every resourceVersion the watch
	// reaches (from events and bookmarks) and whether the store changed.
	progress func(rv string, changed bool)
}

// errWatchClosed is a watch that ended at once with no event.
var errWatchClosed = errors.New("watch closed at once")

// errForgotten ends a watch when the API server forgot the Node
// (noteForgotten): its resourceVersion may mean nothing there.
var errForgotten = errors.New("the api server forgot the node")

// listWatch lists (unless rv is set) and watches lw until ctx ends. A
// broken watch is resumed from the last resourceVersion after a jittered
// backoff; a 410 Gone, a resourceVersion the server has not reached, or
// the Node found missing (noteForgotten) relists. An unreachable server
// only delays: the store keeps what it has.
func (s *Syncer) listWatch(ctx context.Context, lw *listWatch, rv string) {
	bo := newReconnectBackoff()
	gen, _ := s.forgottenCount()
	for ctx.Err() == nil {
		if g, _ := s.forgottenCount(); g != gen {
			s.log.Info("the api server forgot the node; relisting", "watch", lw.what, "resourceVersion", rv)
			gen, rv = g, ""
		}
		if rv == "" {
			var err error
			if rv, err = lw.list(ctx); err != nil {
				s.retryLater(ctx, &bo, lw.what, err)
				continue
			}
		}
		err := s.watchOnce(ctx, lw, &rv, gen)
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, errForgotten):
		case isExpired(err):
			s.log.Info("watch resourceVersion expired; relisting", "watch", lw.what, "resourceVersion", rv, "err", err)
			rv = ""
		case err != nil:
			s.retryLater(ctx, &bo, lw.what, err)
		default:
			bo.Reset()
		}
	}
}

// retryLater records err and waits the next backoff delay. The first
// failure after a healthy watch is logged at Info, the retries that
// follow at Debug: an outage is reported once (and by the Lease), not
// once per retry of every watch.
func (s *Syncer) retryLater(ctx context.Context, bo *backoff.Backoff, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	s.noteErr(err)
	level := slog.LevelDebug
	if bo.Fresh() {
		level = slog.LevelInfo
	}
	d := bo.Next()
	s.log.Log(ctx, level, "watch failed; retrying", "watch", what, "in", d, "err", err)
	_ = s.sleep(ctx, d)
}

// isExpired reports whether err says a resourceVersion is too old, or
// newer than any the server has (an API server rebuilt from an empty
// etcd, whose versions start again from low): either way only a list
// gives one to watch from.
func isExpired(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err) ||
		apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge)
}

// watchOnce runs one watch from *rv until the server ends it, advancing
// *rv past every event applied. It returns nil when the watch ended
// normally (its timeout), errForgotten when the API server forgot the
// Node since forgottenCount was gen, another error otherwise.
func (s *Syncer) watchOnce(ctx context.Context, lw *listWatch, rv *string, gen uint64) error {
	timeout := int64((watchTimeout + rand.N(watchTimeoutJitter)) / time.Second)
	opts := &metav1.ListOptions{
		FieldSelector:       lw.selector,
		LabelSelector:       lw.labels,
		ResourceVersion:     *rv,
		AllowWatchBookmarks: true,
		TimeoutSeconds:      &timeout,
		Watch:               true,
	}
	start := s.deps.Clock.Now()
	w, err := lw.client.Get().Namespace(lw.namespace).Resource(lw.resource).
		VersionedParams(opts, metav1.ParameterCodec).Watch(ctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", lw.what, err)
	}
	defer w.Stop()
	events := 0
	for {
		g, changed := s.forgottenCount()
		if g != gen {
			return fmt.Errorf("watch %s: %w", lw.what, errForgotten)
		}
		var ev watch.Event
		var ok bool
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
			continue
		case ev, ok = <-w.ResultChan():
		}
		if !ok {
			if events == 0 && s.deps.Clock.Since(start) < minWatchLife {
				return fmt.Errorf("watch %s: %w", lw.what, errWatchClosed)
			}
			return nil
		}
		events++
		switch ev.Type {
		case watch.Error:
			return fmt.Errorf("watch %s: %w", lw.what, apierrors.FromObject(ev.Object))
		case watch.Bookmark:
			if m, err := meta.Accessor(ev.Object); err == nil && m.GetResourceVersion() != "" {
				*rv = m.GetResourceVersion()
				if lw.progress != nil {
					lw.progress(*rv, false)
				}
			}
		case watch.Added, watch.Modified, watch.Deleted:
			changed, err := lw.event(ev.Type, ev.Object)
			if err != nil {
				return err // *rv stays before this event: it is seen again
			}
			if m, err := meta.Accessor(ev.Object); err == nil && m.GetResourceVersion() != "" {
				*rv = m.GetResourceVersion()
				if lw.progress != nil {
					lw.progress(*rv, changed)
				}
			}
		}
	}
}
