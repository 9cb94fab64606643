package kube

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outpost-edge/outpost/store"
)

// The status sink's pacing.
const (
	// statusBatch is how many journal entries one read of the store takes.
	statusBatch = 64
	// statusRecheck is how often the sink looks again with nothing to
	// wake it: a mirror pod whose creation the server refused is tried
	// again after mirrorRetry, and a journal entry left for later is
	// picked up.
	statusRecheck = time.Minute
	// mirrorRetry is how long a static pod whose mirror pod the server
	// refused waits before the sink asks again.
	mirrorRetry = 10 * time.Minute
	// eventBufferSize bounds the events waiting to be sent; the oldest
	// is dropped first.
	eventBufferSize = 64
	// maxLogged bounds the memory of which drops were already logged.
	maxLogged = 1024
)

// podAPI is what the status sink asks of the API server. restPods is the
// real one; the unit tests use a fake.
type podAPI interface {
	// patchStatus sends a strategic merge patch to pods/NAME/status.
	patchStatus(ctx context.Context, namespace, name string, patch []byte) (*corev1.Pod, error)
	// deletePod deletes a pod at once (grace period 0) if it still has
	// the given UID.
	deletePod(ctx context.Context, namespace, name string, uid types.UID) error
	createPod(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error)
	// listNodePods lists the pods bound to this node.
	listNodePods(ctx context.Context) ([]corev1.Pod, error)
	// getNodeUID returns the UID of this node's Node object.
	getNodeUID(ctx context.Context) (types.UID, error)
	createEvent(ctx context.Context, ev *corev1.Event) error
}

// runStatus drains the store's status journal into the API server until
// ctx ends: pod status patches, the final delete of a pod whose deletion
// has finished on the node, mirror pods for static pods, and events.
func (s *Syncer) runStatus(ctx context.Context) {
	for s.cfg.StatusAfterPodsListed {
		if rv, err := s.deps.Store.ResumeVersion(podsResource); err == nil && rv != "" {
			break
		}
		if s.sleep(ctx, 100*time.Millisecond) != nil {
			return
		}
	}
	s.drainStatus(ctx, restPods{s})
}

// drainStatus is runStatus over any podAPI.
func (s *Syncer) drainStatus(ctx context.Context, api podAPI) {
	journal, cancelJournal := s.deps.Store.Subscribe(store.KindJournal)
	defer cancelJournal()
	pods, cancelPods := s.deps.Store.Subscribe(store.KindPod)
	defer cancelPods()
	d := newDrainer(s, api)
	d.forgotten, _ = s.forgottenCount()
	bo := newReconnectBackoff()
	recheck := s.deps.Clock.NewTimer(statusRecheck)
	defer recheck.Stop()
	// events fires when the events left for want of a token may go.
	events := s.deps.Clock.NewTimer(time.Hour)
	events.Stop()
	defer events.Stop()
	for {
		// The node's status and Lease go first after every (re)connect,
		// and nothing is sent while the link is down.
		if err := s.waitNodeSynced(ctx); err != nil {
			return
		}
		forgotten, changed := s.forgottenCount()
		if forgotten != d.forgotten {
			d.forgetKnown()
			d.forgotten = forgotten
		}
		var again bool
		var err error
		s.offload(func() { again, err = d.pass(ctx) })
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.noteErr(err)
			wait := bo.Next()
			s.log.Debug("status sink: retrying", "in", wait, "err", err)
			if s.sleep(ctx, wait) != nil {
				return
			}
			continue
		}
		bo.Reset()
		if again {
			continue
		}
		// Reset on an armed timer moves it (Go 1.23's timers deliver no
		// stale tick after it), so the events' timer is never off while
		// some wait.
		recheck.Reset(statusRecheck)
		if d.eventsLater > 0 {
			events.Reset(d.eventsLater)
		} else {
			events.Stop()
		}
		select {
		case <-ctx.Done():
			return
		case <-events.C():
		case <-journal:
		case <-pods:
			d.mirrorsDirty = true
		case <-s.sink.wakeup():
		case <-recheck.C():
			d.mirrorsDirty = true
		case <-changed:
			// The link, or what the API server knows of the node.
		}
	}
}

// drainer is the status sink's state, owned by its one goroutine.
type drainer struct {
	s   *Syncer
	api podAPI

	// mirrorsDirty says the static pods may have changed since the mirror
	// pods were last made to match them.
	mirrorsDirty bool
	// known are the pods of this node in the API by namespace/name:
	// the mirror pods, and the other pods whose names static pods take.
	// Listed once, then kept by this sink's own writes; listed is false
	// until then.
	known  map[string]*knownPod
	listed bool
	// problems are the static pods that have no mirror pod, and why.
	problems map[string]mirrorProblem
	// node is the Node's UID, for mirror pods' owner reference.
	node types.UID
	// patched maps a journal key to the sequence number whose status
	// patch succeeded before the entry could be acknowledged (a final
	// delete or the store failed), so a retry does not patch it again.
	patched map[string]uint64
	// logged maps a pod to the reason its last status was dropped, so
	// a drop is logged once, not on every status.
	logged map[string]string
	// again asks for another pass at once (a mirror pod to recreate).
	again bool
	// eventsLater is how long until the events left buffered for want
	// of a token may go, or 0 when none was left.
	eventsLater time.Duration
	// forgotten is the Syncer's forgottenCount as the sink last saw it.
	forgotten uint64
	// sentStatic is the status last patched onto each static pod's
	// mirror pod, by namespace/name, and restore the mirror pods made
	// again that are to get it back (forgetKnown).
	sentStatic map[string]sentStatus
	restore    map[string]bool
}

// sentStatus is a static pod's status as last sent, with the static
// pod's UID.
type sentStatus struct {
	uid    types.UID
	status corev1.PodStatus
}

// forgetKnown drops what the sink knows of the API server's pods, once
// the server forgot the Node (rebuilt from an empty etcd, or the Node
// deleted and with it, by the garbage collector, its mirror pods): the
// next pass lists them again, makes the missing mirror pods and gives
// them back the statuses last sent, which no journal entry holds any
// more.
func (d *drainer) forgetKnown() {
	d.listed = false
	d.mirrorsDirty = true
	d.node = ""
	for key := range d.sentStatic {
		d.restore[key] = true
	}
}

func newDrainer(s *Syncer, api podAPI) *drainer {
	return &drainer{
		s: s, api: api, mirrorsDirty: true,
		known: map[string]*knownPod{}, problems: map[string]mirrorProblem{},
		patched: map[string]uint64{}, logged: map[string]string{},
		sentStatic: map[string]sentStatus{}, restore: map[string]bool{},
	}
}

// pass makes the mirror pods match the static pods when they may have
// changed, sends every pending status, then the buffered events their
// rate limit lets go now (d.eventsLater says when the rest may). An
// error means a request could not reach the server (or the store could
// not be read): the caller backs off and the next pass starts again
// where this one stopped, since nothing unsent was acknowledged.
func (d *drainer) pass(ctx context.Context) (again bool, err error) {
	d.again = false
	if d.mirrorsDirty {
		if err := d.syncMirrors(ctx); err != nil {
			return false, err
		}
		d.mirrorsDirty = false
	}
	if err := d.drainJournal(ctx); err != nil {
		return false, err
	}
	if d.eventsLater, err = d.sendEvents(ctx); err != nil {
		return false, err
	}
	if d.again {
		d.mirrorsDirty = true
	}
	return d.again, nil
}

// drainJournal sends the pending statuses, oldest first.
func (d *drainer) drainJournal(ctx context.Context) error {
	after := uint64(0)
	for {
		es, err := d.s.deps.Store.Pending(after, statusBatch)
		if err != nil {
			return fmt.Errorf("read status journal: %w", err)
		}
		if len(es) == 0 {
			return nil
		}
		for _, e := range es {
			if err := d.send(ctx, e); err != nil {
				return err
			}
			after = e.Seq
		}
	}
}

// send delivers one journal entry and acknowledges it, or returns why it
// could not reach the server.
func (d *drainer) send(ctx context.Context, e store.Entry) error {
	if !strings.HasPrefix(e.Key, "pod/") {
		return nil // not a pod status: another sink's
	}
	p, err := journalPod(e)
	if err != nil {
		d.s.log.Warn("dropping undecodable pod status", "key", e.Key, "err", err)
		return d.ack(e)
	}
	key := p.Namespace + "/" + p.Name
	rec, ok, err := d.s.deps.Store.Pods().Get(p.Namespace, p.Name)
	switch {
	case err != nil:
		d.dropped(key, "pod unreadable", err)
		return d.ack(e)
	case !ok || rec.Object.UID != p.UID:
		// The pod is gone, or replaced by another of the same name: its
		// status means nothing to anyone.
		d.dropped(key, "pod no longer desired", nil)
		return d.ack(e)
	}
	switch rec.Source {
	case store.SourceAPI:
		return d.sendAPI(ctx, e, rec.Object, p)
	case store.SourceStatic:
		return d.sendStatic(ctx, e, rec.Object, p)
	default:
		return d.ack(e) // MQTT pods report over MQTT
	}
}

// sendAPI patches the status of a pod from the API server and, when the
// pod is being deleted and the status says it is over, deletes it for
// good, as kubelet's status manager does: grace period 0 and the pod's
// UID as precondition, so a new pod of the same name is never deleted.
func (d *drainer) sendAPI(ctx context.Context, e store.Entry, desired, p *corev1.Pod) error {
	key := p.Namespace + "/" + p.Name
	if d.patched[e.Key] != e.Seq {
		patch, err := statusPatch(p.UID, &p.Status)
		if err != nil {
			d.dropped(key, "status not encodable", err)
			return d.ack(e)
		}
		if ok, err := d.beforeWrite(ctx, e); !ok {
			return err
		}
		_, err = d.api.patchStatus(ctx, p.Namespace, p.Name, patch)
		switch outcomeOf(err) {
		case outcomeDone:
		case outcomeRetry:
			return fmt.Errorf("patch status of pod %s: %w", key, err)
		default:
			d.dropped(key, dropReason(err), err)
			return d.ack(e)
		}
		d.patched[e.Key] = e.Seq
		delete(d.logged, key)
	}
	if desired.DeletionTimestamp != nil && terminalStatus(&p.Status) {
		if ok, err := d.beforeWrite(ctx, e); !ok {
			return err
		}
		err := d.api.deletePod(ctx, p.Namespace, p.Name, p.UID)
		switch outcomeOf(err) {
		case outcomeDone:
			d.s.log.Info("pod terminated; deleted from the api server", "pod", key, "uid", string(p.UID), "phase", string(p.Status.Phase))
		case outcomeRetry:
			return fmt.Errorf("delete pod %s: %w", key, err)
		default:
			d.s.log.Info("final delete of pod not needed", "pod", key, "uid", string(p.UID), "err", err)
		}
	}
	return d.ack(e)
}

// sendStatic patches a static pod's status onto its mirror pod, with the
// mirror pod's UID as precondition.
func (d *drainer) sendStatic(ctx context.Context, e store.Entry, static, p *corev1.Pod) error {
	key := p.Namespace + "/" + p.Name
	m, err := d.ensureMirror(ctx, static)
	if err != nil {
		return err
	}
	if m == nil {
		return d.ack(e) // no mirror pod can show it (see MirrorErrors)
	}
	patch, err := statusPatch(m.uid, &p.Status)
	if err != nil {
		d.dropped(key, "status not encodable", err)
		return d.ack(e)
	}
	if ok, err := d.beforeWrite(ctx, e); !ok {
		return err
	}
	got, err := d.api.patchStatus(ctx, p.Namespace, p.Name, patch)
	switch outcomeOf(err) {
	case outcomeDone:
	case outcomeGone:
		// Someone deleted the mirror pod, or replaced it: make it again
		// on the next pass and send this status to it then.
		d.s.log.Info("mirror pod gone; recreating it", "pod", key)
		delete(d.known, key)
		d.again = true
		return nil
	case outcomeRetry:
		return fmt.Errorf("patch status of mirror pod %s: %w", key, err)
	default:
		d.dropped(key, "mirror pod: "+dropReason(err), err)
		return d.ack(e)
	}
	d.sentStatic[key] = sentStatus{uid: static.UID, status: p.Status}
	delete(d.restore, key)
	if got != nil && got.DeletionTimestamp != nil {
		// Someone deleted the mirror pod: a mirror pod is not stopped by
		// its deletion, it is made again (kubelet does the same).
		if err := d.deleteMirror(ctx, key, m); err != nil {
			return err
		}
		d.again = true
		return nil
	}
	delete(d.logged, key)
	return d.ack(e)
}

// beforeWrite takes a token of the write rate limit, then reports whether
// e is still its pod's newest status: one superseded while waiting is
// never sent (the newer one comes later in the same pass).
func (d *drainer) beforeWrite(ctx context.Context, e store.Entry) (bool, error) {
	if err := d.s.writes.wait(ctx); err != nil {
		return false, err
	}
	es, err := d.s.deps.Store.Pending(e.Seq-1, 1)
	if err != nil {
		return false, fmt.Errorf("read status journal: %w", err)
	}
	return len(es) == 1 && es[0].Seq == e.Seq && es[0].Key == e.Key, nil
}

// ack removes e from the journal unless a newer status replaced it.
func (d *drainer) ack(e store.Entry) error {
	if _, err := d.s.deps.Store.Ack(e); err != nil {
		return fmt.Errorf("acknowledge status %s: %w", e.Key, err)
	}
	delete(d.patched, e.Key)
	return nil
}

// dropped logs, once per pod and reason, that a status was not sent.
func (d *drainer) dropped(key, reason string, err error) {
	if d.logged[key] == reason {
		return
	}
	if len(d.logged) >= maxLogged {
		clear(d.logged)
	}
	d.logged[key] = reason
	if err != nil {
		d.s.log.Info("pod status not sent", "pod", key, "reason", reason, "err", err)
	} else {
		d.s.log.Debug("pod status not sent", "pod", key, "reason", reason)
	}
}

// outcome is what a failed request means for the sink.
type outcome int

const (
	outcomeDone      outcome = iota // it succeeded
	outcomeGone                     // 404, 409, 410, 422 on metadata.uid: the object was deleted or replaced
	outcomeForbidden                // 403: not this node's to write
	outcomeRejected                 // any other 4xx: this request can never succeed
	outcomeRetry                    // no answer, 401, 408, 429 or 5xx: try again later
)

func outcomeOf(err error) outcome {
	if err == nil {
		return outcomeDone
	}
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return outcomeRetry // the network, TLS, a timeout
	}
	if uidMismatch(st.Status()) {
		return outcomeGone
	}
	switch code := int(st.Status().Code); {
	case code == http.StatusNotFound, code == http.StatusConflict, code == http.StatusGone:
		return outcomeGone
	case code == http.StatusForbidden:
		return outcomeForbidden
	case code == http.StatusUnauthorized, code == http.StatusRequestTimeout, code == http.StatusTooManyRequests,
		code >= 500, code == 0:
		return outcomeRetry
	case code >= 400:
		return outcomeRejected
	}
	return outcomeRetry
}

// dropReason says why a status the server refused is dropped.
func dropReason(err error) string {
	switch outcomeOf(err) {
	case outcomeGone:
		return "pod deleted or replaced in the api server"
	case outcomeForbidden:
		return "not this node's pod"
	}
	return "status refused"
}

// uidMismatch reports whether a refused patch says the object has
// another UID than the patch's metadata.uid. The API server answers a
// merge patch (or kubelet's strategic one) whose uid differs from the
// stored object's with 422 "metadata.uid: field is immutable", not 409:
// a patch carries no precondition the registry checks, the uid only
// fails validation. It means the same as a 409: the pod was replaced.
func uidMismatch(st metav1.Status) bool {
	if st.Code != http.StatusUnprocessableEntity || st.Details == nil {
		return false
	}
	for _, c := range st.Details.Causes {
		if c.Field == "metadata.uid" {
			return true
		}
	}
	return false
}

// sinkState is the part of the status sink other goroutines see: the
// static pods without a mirror pod, and the events waiting to be sent.
// Its zero value is ready to use.
type sinkState struct {
	mu         sync.Mutex
	mirrorless map[string]string
	events     []*queuedEvent
	eventSeq   uint64 // numbers events, so their names never collide
	wake       chan struct{}
}

// wakeup returns the channel that Event signals.
func (k *sinkState) wakeup() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.wake == nil {
		k.wake = make(chan struct{}, 1)
	}
	return k.wake
}

// MirrorErrors returns the static pods that have no mirror pod in the API
// server and why (a mirror pod may not reference secrets, config maps or
// service accounts, say), as "namespace/name: reason", sorted.
func (s *Syncer) MirrorErrors() []string {
	s.sink.mu.Lock()
	defer s.sink.mu.Unlock()
	out := make([]string, 0, len(s.sink.mirrorless))
	for k, why := range s.sink.mirrorless {
		out = append(out, k+": "+why)
	}
	sort.Strings(out)
	return out
}

// queuedEvent is an event waiting to be sent; repeats of it while it
// waits only count up, as the API's own event aggregation does.
type queuedEvent struct {
	namespace, name string
	uid             types.UID
	typ             string
	reason, message string
	first, last     time.Time
	count           int32
	seq             uint64
}

// Event queues a core/v1 Event about pod (Pulled, Started, Killing,
// BackOff, Unhealthy...), to be sent best effort once the API server is
// reachable. Events live only in a small buffer in memory, never on disk:
// when it is full the oldest is dropped. An event of a static pod is
// shown on its mirror pod; one of a pod the API server does not know of
// (from MQTT) is dropped. Event is safe to call from any goroutine and
// never blocks.
func (s *Syncer) Event(pod *corev1.Pod, typ, reason, message string, at time.Time) {
	if pod == nil || pod.UID == "" || reason == "" {
		return
	}
	if typ == "" {
		typ = corev1.EventTypeNormal
	}
	s.sink.mu.Lock()
	defer s.sink.mu.Unlock()
	for _, q := range s.sink.events {
		if q.uid == pod.UID && q.typ == typ && q.reason == reason && q.message == message {
			q.count++
			q.last = at
			return
		}
	}
	if len(s.sink.events) >= eventBufferSize {
		s.sink.events[0] = nil
		s.sink.events = s.sink.events[1:]
	}
	s.sink.eventSeq++
	s.sink.events = append(s.sink.events, &queuedEvent{
		namespace: pod.Namespace, name: pod.Name, uid: pod.UID,
		typ: typ, reason: reason, message: message, first: at, last: at, count: 1, seq: s.sink.eventSeq,
	})
	if s.sink.wake == nil {
		s.sink.wake = make(chan struct{}, 1)
	}
	select {
	case s.sink.wake <- struct{}{}:
	default:
	}
}

// sendEvents sends the buffered events as far as their own rate limit
// allows without waiting: the statuses that come meanwhile are not held
// up behind them. What is left waits in the buffer, and later says when
// the next may go. An event that cannot reach the server goes back to
// the buffer (within its bound); one the server refuses is dropped.
func (d *drainer) sendEvents(ctx context.Context) (later time.Duration, err error) {
	k := &d.s.sink
	k.mu.Lock()
	evs := k.events
	k.events = nil
	k.mu.Unlock()
	putBack := func(rest []*queuedEvent) {
		k.mu.Lock()
		rest = append(rest, k.events...)
		if len(rest) > eventBufferSize {
			rest = rest[len(rest)-eventBufferSize:]
		}
		k.events = rest
		k.mu.Unlock()
	}
	for i, q := range evs {
		ev := d.eventFor(q)
		if ev == nil {
			continue
		}
		if ok, after := d.s.events.take(); !ok {
			putBack(evs[i:])
			return after, nil
		}
		err := d.api.createEvent(ctx, ev)
		if outcomeOf(err) == outcomeRetry {
			putBack(evs[i:])
			return 0, fmt.Errorf("send event %s of pod %s/%s: %w", q.reason, q.namespace, q.name, err)
		}
		if err != nil {
			d.s.log.Debug("event dropped", "pod", q.namespace+"/"+q.name, "reason", q.reason, "err", err)
		}
	}
	return 0, nil
}

// eventFor returns the Event to send for q, or nil when no object in
// the API server can show it.
func (d *drainer) eventFor(q *queuedEvent) *corev1.Event {
	rec, ok, err := d.s.deps.Store.Pods().Get(q.namespace, q.name)
	if err != nil || !ok || rec.Object.UID != q.uid {
		return nil
	}
	uid := q.uid
	switch rec.Source {
	case store.SourceAPI:
	case store.SourceStatic:
		m := d.known[q.namespace+"/"+q.name]
		if m == nil || !m.mirror || m.hash != string(q.uid) {
			return nil
		}
		uid = m.uid
	default:
		return nil
	}
	return &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: q.namespace,
			Name:      fmt.Sprintf("%s.%x.%d", q.name, q.first.UnixNano(), q.seq),
		},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: "v1", Kind: "Pod", Namespace: q.namespace, Name: q.name, UID: uid,
		},
		Reason: q.reason, Message: q.message, Type: q.typ,
		Source:         corev1.EventSource{Component: "outpost", Host: d.s.cfg.NodeName},
		FirstTimestamp: metav1.NewTime(q.first), LastTimestamp: metav1.NewTime(q.last),
		Count: q.count,
	}
}

// restPods is podAPI over the REST client.
type restPods struct{ s *Syncer }

func (r restPods) patchStatus(ctx context.Context, namespace, name string, patch []byte) (*corev1.Pod, error) {
	var out corev1.Pod
	err := r.s.deps.Client.Core.Patch(types.StrategicMergePatchType).
		Namespace(namespace).Resource("pods").Name(name).SubResource("status").
		Body(patch).Do(ctx).Into(&out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

func (r restPods) deletePod(ctx context.Context, namespace, name string, uid types.UID) error {
	grace := int64(0)
	return r.s.deps.Client.Core.Delete().
		Namespace(namespace).Resource("pods").Name(name).
		Body(&metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: metav1.NewUIDPreconditions(string(uid))}).
		Do(ctx).Error()
}

func (r restPods) createPod(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	var out corev1.Pod
	if err := r.s.deps.Client.Core.Post().Namespace(pod.Namespace).Resource("pods").Body(pod).Do(ctx).Into(&out); err != nil {
		return nil, err
	}
	return &out, nil
}

func (r restPods) listNodePods(ctx context.Context) ([]corev1.Pod, error) {
	var out corev1.PodList
	err := r.s.deps.Client.Core.Get().Resource("pods").
		VersionedParams(&metav1.ListOptions{FieldSelector: "spec.nodeName=" + r.s.cfg.NodeName}, metav1.ParameterCodec).
		Do(ctx).Into(&out)
	return out.Items, err
}

func (r restPods) getNodeUID(ctx context.Context) (types.UID, error) {
	var n corev1.Node
	if err := r.s.deps.Client.Core.Get().Resource("nodes").Name(r.s.cfg.NodeName).Do(ctx).Into(&n); err != nil {
		return "", err
	}
	return n.UID, nil
}

func (r restPods) createEvent(ctx context.Context, ev *corev1.Event) error {
	return r.s.deps.Client.Core.Post().Namespace(ev.Namespace).Resource("events").Body(ev).Do(ctx).Error()
}
