package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/rest"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// sinkFake is a podAPI that behaves like the API server for the requests
// the status sink makes: UID preconditions give 409, missing pods 404,
// names taken 409 AlreadyExists. Failures can be queued per operation.
type sinkFake struct {
	mu      sync.Mutex
	pods    map[string]*corev1.Pod // by namespace/name
	calls   []string
	fail    map[string][]error // by op: patch, delete, create, list, node, event
	events  []*corev1.Event
	nextUID int
	// onPatch runs (without the lock) before a patch is applied.
	onPatch func(namespace, name string)
	// check runs at every request; a sink must never call while it
	// returns an error.
	check      func() error
	violations []string
}

func newSinkFake() *sinkFake {
	return &sinkFake{pods: map[string]*corev1.Pod{}, fail: map[string][]error{}}
}

var podsGR = schema.GroupResource{Resource: "pods"}

// begin records a call and returns its queued failure, if any.
func (f *sinkFake) begin(op, call string) error {
	if f.check != nil {
		if err := f.check(); err != nil {
			f.violations = append(f.violations, call+": "+err.Error())
		}
	}
	f.calls = append(f.calls, call)
	if q := f.fail[op]; len(q) > 0 {
		f.fail[op] = q[1:]
		return q[0]
	}
	return nil
}

func (f *sinkFake) failNext(op string, errs ...error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[op] = append(f.fail[op], errs...)
}

func (f *sinkFake) patchStatus(_ context.Context, ns, name string, patch []byte) (*corev1.Pod, error) {
	var doc struct {
		Metadata struct {
			UID types.UID `json:"uid"`
		} `json:"metadata"`
		Status corev1.PodStatus `json:"status"`
	}
	if err := json.Unmarshal(patch, &doc); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	if f.onPatch != nil {
		f.onPatch(ns, name)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("patch", fmt.Sprintf("patch %s/%s uid=%s phase=%s", ns, name, doc.Metadata.UID, doc.Status.Phase)); err != nil {
		return nil, err
	}
	p := f.pods[ns+"/"+name]
	if p == nil {
		return nil, apierrors.NewNotFound(podsGR, name)
	}
	if p.UID != doc.Metadata.UID {
		// What the real server answers (TestStatusAgainstAPIServer).
		return nil, apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, name, field.ErrorList{
			field.Invalid(field.NewPath("metadata", "uid"), doc.Metadata.UID, "field is immutable")})
	}
	doc.Status.QOSClass = p.Status.QOSClass
	p.Status = doc.Status
	return p.DeepCopy(), nil
}

func (f *sinkFake) deletePod(_ context.Context, ns, name string, uid types.UID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("delete", fmt.Sprintf("delete %s/%s uid=%s", ns, name, uid)); err != nil {
		return err
	}
	p := f.pods[ns+"/"+name]
	if p == nil {
		return apierrors.NewNotFound(podsGR, name)
	}
	if p.UID != uid {
		return apierrors.NewConflict(podsGR, name, errors.New("precondition failed: uid"))
	}
	delete(f.pods, ns+"/"+name)
	return nil
}

func (f *sinkFake) createPod(_ context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("create", "create "+pod.Namespace+"/"+pod.Name); err != nil {
		return nil, err
	}
	if f.pods[pod.Namespace+"/"+pod.Name] != nil {
		return nil, apierrors.NewAlreadyExists(podsGR, pod.Name)
	}
	f.nextUID++
	p := pod.DeepCopy()
	p.UID = types.UID(fmt.Sprintf("srv-%d", f.nextUID))
	f.pods[p.Namespace+"/"+p.Name] = p
	return p.DeepCopy(), nil
}

func (f *sinkFake) listNodePods(context.Context) ([]corev1.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("list", "list"); err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range f.pods {
		if p.Spec.NodeName == "n1" {
			out = append(out, *p.DeepCopy())
		}
	}
	return out, nil
}

func (f *sinkFake) getNodeUID(context.Context) (types.UID, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("node", "node"); err != nil {
		return "", err
	}
	return "node-uid-1", nil
}

func (f *sinkFake) createEvent(_ context.Context, ev *corev1.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("event", "event "+ev.Reason); err != nil {
		return err
	}
	f.events = append(f.events, ev.DeepCopy())
	return nil
}

// put stores a pod on the fake server.
func (f *sinkFake) put(p *corev1.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods[p.Namespace+"/"+p.Name] = p.DeepCopy()
}

func (f *sinkFake) pod(key string) *corev1.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.pods[key]; p != nil {
		return p.DeepCopy()
	}
	return nil
}

// takeCalls returns the calls since the last takeCalls.
func (f *sinkFake) takeCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.calls
	f.calls = nil
	return out
}

// sinkUnit is a Syncer over a real store, a fake clock and sinkFake.
type sinkUnit struct {
	t   *testing.T
	s   *Syncer
	st  *store.Store
	clk *clocktest.Fake
	api *sinkFake
	d   *drainer
}

var sinkEpoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newSinkUnit(t *testing.T) *sinkUnit {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clocktest.New(sinkEpoch)
	s, err := New(Config{NodeName: "n1", WriteQPS: 1000, WriteBurst: 1000, EventQPS: 1000, EventBurst: 1000}, Deps{
		Client: &Client{Config: &rest.Config{Host: "https://api.invalid"}},
		Store:  st, Clock: clk, Log: slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	u := &sinkUnit{t: t, s: s, st: st, clk: clk, api: newSinkFake()}
	u.d = newDrainer(s, u.api)
	return u
}

func sinkPod(name string, uid types.UID) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: uid},
		Spec:       corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "app", Image: "busybox:1"}}},
	}
}

// desire stores p as desired from src (and, for the API, on the fake
// server too).
func (u *sinkUnit) desire(src store.Source, p *corev1.Pod) {
	u.t.Helper()
	if err := u.st.Pods().Put(src, p); err != nil {
		u.t.Fatal(err)
	}
	if src == store.SourceAPI {
		u.api.put(p)
	}
}

// journal appends a status of p, as the agent does.
func (u *sinkUnit) journal(p *corev1.Pod, st corev1.PodStatus) uint64 {
	u.t.Helper()
	e := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID}, Status: st}
	b, err := e.Marshal()
	if err != nil {
		u.t.Fatal(err)
	}
	seq, err := u.st.Append("pod/"+p.Namespace+"/"+p.Name, b)
	if err != nil {
		u.t.Fatal(err)
	}
	return seq
}

func (u *sinkUnit) backlog() int {
	u.t.Helper()
	n, err := u.st.Backlog()
	if err != nil {
		u.t.Fatal(err)
	}
	return n
}

// runLoop runs the status sink's loop until the test ends.
func (u *sinkUnit) runLoop() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { u.s.drainStatus(ctx, u.api); close(done) }()
	u.t.Cleanup(func() { cancel(); <-done })
}

func (u *sinkUnit) pass() error {
	u.t.Helper()
	_, err := u.d.pass(context.Background())
	return err
}

func (u *sinkUnit) mustPass() {
	u.t.Helper()
	if err := u.pass(); err != nil {
		u.t.Fatal(err)
	}
}

func (u *sinkUnit) wantCalls(want ...string) {
	u.t.Helper()
	if got := u.api.takeCalls(); !slices.Equal(got, want) {
		u.t.Fatalf("calls:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func phase(p corev1.PodPhase) corev1.PodStatus { return corev1.PodStatus{Phase: p} }

var connRefused = &url.Error{Op: "Patch", URL: "https://api.invalid", Err: syscall.ECONNREFUSED}

func TestStatusNewestOfSeveralIsOnePatch(t *testing.T) {
	u := newSinkUnit(t)
	web := sinkPod("web", "u1")
	u.desire(store.SourceAPI, web)
	u.journal(web, phase(corev1.PodPending))
	u.journal(web, phase(corev1.PodRunning))
	u.journal(web, corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.88.0.5", PodIPs: []corev1.PodIP{{IP: "10.88.0.5"}}})
	u.mustPass()
	u.wantCalls("list", "patch default/web uid=u1 phase=Running")
	if got := u.api.pod("default/web").Status.PodIP; got != "10.88.0.5" {
		t.Errorf("server has podIP %q, want the newest status's", got)
	}
	if u.backlog() != 0 {
		t.Errorf("backlog %d after a pass, want 0", u.backlog())
	}
	u.mustPass()
	u.wantCalls() // nothing twice
}

func TestStatusSupersededWhileSendingIsNeverSent(t *testing.T) {
	u := newSinkUnit(t)
	a, b := sinkPod("a", "ua"), sinkPod("b", "ub")
	u.desire(store.SourceAPI, a)
	u.desire(store.SourceAPI, b)
	u.journal(a, phase(corev1.PodPending))
	u.journal(b, phase(corev1.PodPending))
	// While a's status is being sent, b's is superseded: the pass has
	// already read b's old entry and must not send it.
	u.api.onPatch = func(_, name string) {
		if name == "a" {
			u.api.onPatch = nil
			u.journal(b, phase(corev1.PodFailed))
		}
	}
	u.mustPass()
	u.wantCalls("list", "patch default/a uid=ua phase=Pending", "patch default/b uid=ub phase=Failed")
	if u.backlog() != 0 {
		t.Errorf("backlog %d, want 0", u.backlog())
	}
}

func TestStatusOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		dropped bool // acknowledged without success
	}{
		{"not found: pod deleted", apierrors.NewNotFound(podsGR, "web"), true},
		{"conflict: pod replaced", apierrors.NewConflict(podsGR, "web", errors.New("uid")), true},
		{"uid immutable: pod replaced", apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "web", field.ErrorList{field.Invalid(field.NewPath("metadata", "uid"), "u1", "field is immutable")}), true},
		{"forbidden: not bound here", apierrors.NewForbidden(podsGR, "web", errors.New("node n1 can only update pod status for pods with spec.nodeName set to itself")), true},
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "web", field.ErrorList{field.Invalid(field.NewPath("status", "podIP"), "x", "bad")}), true},
		{"server error", apierrors.NewInternalError(errors.New("etcd")), false},
		{"too many requests", apierrors.NewTooManyRequests("slow down", 1), false},
		{"connection refused", connRefused, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newSinkUnit(t)
			web := sinkPod("web", "u1")
			u.desire(store.SourceAPI, web)
			u.journal(web, phase(corev1.PodRunning))
			u.api.failNext("patch", tc.err)
			err := u.pass()
			if tc.dropped {
				if err != nil || u.backlog() != 0 {
					t.Fatalf("pass = %v, backlog %d; want the status dropped", err, u.backlog())
				}
				u.wantCalls("list", "patch default/web uid=u1 phase=Running")
				return
			}
			if err == nil || !strings.Contains(err.Error(), "patch status of pod default/web") || u.backlog() != 1 {
				t.Fatalf("pass = %v, backlog %d; want an error naming the pod and the status kept", err, u.backlog())
			}
			// The same entry goes again on the next pass.
			u.mustPass()
			u.wantCalls("list", "patch default/web uid=u1 phase=Running", "patch default/web uid=u1 phase=Running")
			if u.backlog() != 0 {
				t.Errorf("backlog %d after the retry", u.backlog())
			}
		})
	}
}

func TestStatusDroppedWithoutRequest(t *testing.T) {
	u := newSinkUnit(t)
	gone := sinkPod("gone", "u-gone") // not in the store
	u.journal(gone, phase(corev1.PodRunning))
	old := sinkPod("web", "u-old") // the store has a newer pod of that name
	u.desire(store.SourceAPI, sinkPod("web", "u-new"))
	u.journal(old, phase(corev1.PodRunning))
	mq := sinkPod("mq", "u-mq")
	u.desire(store.SourceMQTT, mq)
	u.journal(mq, phase(corev1.PodRunning))
	if _, err := u.st.Append("pod/default/bad", []byte("not protobuf")); err != nil {
		t.Fatal(err)
	}
	// Not a pod status: left for whoever owns it.
	if _, err := u.st.Append("other/thing", []byte("x")); err != nil {
		t.Fatal(err)
	}
	u.mustPass()
	u.wantCalls("list")
	if es, _ := u.st.Pending(0, 0); len(es) != 1 || es[0].Key != "other/thing" {
		t.Errorf("journal left %v, want only other/thing", es)
	}
}

func TestStatusFinalDeleteOfTerminatedPod(t *testing.T) {
	u := newSinkUnit(t)
	web := sinkPod("web", "u1")
	now := metav1.NewTime(sinkEpoch)
	grace := int64(30)
	web.DeletionTimestamp, web.DeletionGracePeriodSeconds = &now, &grace
	u.desire(store.SourceAPI, web)

	// Still stopping: the status goes, the pod stays.
	u.journal(web, corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{
		{Name: "app", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
	}})
	u.mustPass()
	u.wantCalls("list", "patch default/web uid=u1 phase=Running")

	// Stopped: the terminal status goes, then the delete, with grace 0
	// (the fake's deletePod is the grace-0 call) and the UID.
	u.journal(web, corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{
		{Name: "app", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}}},
	}})
	u.api.failNext("delete", connRefused)
	if err := u.pass(); err == nil || !strings.Contains(err.Error(), "delete pod default/web") {
		t.Fatalf("pass = %v, want the delete's error", err)
	}
	u.wantCalls("patch default/web uid=u1 phase=Failed", "delete default/web uid=u1")
	// The retry deletes without patching the same status again.
	u.mustPass()
	u.wantCalls("delete default/web uid=u1")
	if u.api.pod("default/web") != nil || u.backlog() != 0 {
		t.Errorf("pod still on the server or status still journaled")
	}
}

func TestStatusFinalDeleteNeedsTheSameUID(t *testing.T) {
	u := newSinkUnit(t)
	web := sinkPod("web", "u1")
	now := metav1.NewTime(sinkEpoch)
	web.DeletionTimestamp = &now
	u.desire(store.SourceAPI, web)
	// The server's pod of that name was replaced after the status was
	// journaled: the patch fails on the UID, and nothing is deleted.
	u.api.put(sinkPod("web", "u2"))
	u.journal(web, phase(corev1.PodSucceeded))
	u.mustPass()
	u.wantCalls("list", "patch default/web uid=u1 phase=Succeeded")
	if p := u.api.pod("default/web"); p == nil || p.UID != "u2" {
		t.Errorf("the new pod was deleted")
	}
}

// TestStatusLoopWaitsForNodeThenBacksOff runs the loop: nothing is sent
// before the node is synced; a network error is noted and the same
// status is retried after the reconnect backoff.
func TestStatusLoopWaitsForNodeThenBacksOff(t *testing.T) {
	u := newSinkUnit(t)
	web := sinkPod("web", "u1")
	u.desire(store.SourceAPI, web)
	u.journal(web, phase(corev1.PodRunning))
	u.api.check = func() error {
		u.s.mu.Lock()
		defer u.s.mu.Unlock()
		if !u.s.link.Connected || !u.s.nodeSynced {
			return errors.New("request before the node was synced")
		}
		return nil
	}
	u.api.failNext("patch", connRefused)
	u.runLoop()

	u.s.setConnected(true)
	u.s.setNodeSynced()
	reactWait.Until(t, "the failed patch noted", func() bool { return strings.Contains(u.s.Link().LastError, "connection refused") })
	// Backing off: the recheck timer and the backoff's.
	reactWait.Until(t, "backoff armed", func() bool { return u.clk.Waiters() >= 2 })
	if u.backlog() != 1 {
		t.Fatal("status acknowledged after a failed patch")
	}
	u.clk.Advance(newReconnectBackoff().Max)
	reactWait.Until(t, "status sent on retry", func() bool { return u.backlog() == 0 })
	u.wantCalls("list", "patch default/web uid=u1 phase=Running", "patch default/web uid=u1 phase=Running")
	u.api.mu.Lock()
	defer u.api.mu.Unlock()
	if len(u.api.violations) > 0 {
		t.Errorf("requests before the node was synced: %q", u.api.violations)
	}
}

func TestStatusEventsBufferedAndSent(t *testing.T) {
	u := newSinkUnit(t)
	web := sinkPod("web", "u1")
	u.desire(store.SourceAPI, web)
	mq := sinkPod("mq", "u-mq")
	u.desire(store.SourceMQTT, mq)
	at := sinkEpoch
	u.s.Event(mq, "Normal", "Started", "Started container app", at)
	for i := range eventBufferSize + 5 {
		u.s.Event(web, "Normal", "Pulled", fmt.Sprintf("pull %d", i), at.Add(time.Duration(i)*time.Second))
	}
	u.s.Event(web, "Warning", "BackOff", "Back-off restarting failed container app", at)
	u.s.Event(web, "Warning", "BackOff", "Back-off restarting failed container app", at.Add(time.Minute))
	u.mustPass()
	calls := u.api.takeCalls()
	if len(calls) != 1+eventBufferSize || calls[0] != "list" {
		t.Fatalf("%d calls, want a list and %d events (the buffer's bound): %q", len(calls), eventBufferSize, calls)
	}
	evs := u.api.events
	if first := evs[0].Message; first != "pull 6" {
		t.Errorf("oldest event kept is %q, want the 7th (the first six, and the MQTT pod's, dropped)", first)
	}
	last := evs[len(evs)-1]
	if last.Reason != "BackOff" || last.Count != 2 || !last.LastTimestamp.Time.Equal(at.Add(time.Minute)) ||
		last.InvolvedObject.UID != "u1" || last.InvolvedObject.Kind != "Pod" || last.Namespace != "default" || last.Source.Host != "n1" {
		t.Errorf("aggregated event = %+v", last)
	}
	// An event that cannot reach the server waits for the next pass.
	u.s.Event(web, "Normal", "Killing", "Stopping container app", at)
	u.api.failNext("event", connRefused)
	if err := u.pass(); err == nil {
		t.Fatal("pass succeeded with the event unsent")
	}
	u.mustPass()
	u.wantCalls("event Killing", "event Killing")
}

// TestStatusEventsNeverHoldUpStatuses runs the loop with events beyond
// their bucket's burst: the events the bucket allows go at once, a
// status journaled while the rest wait is patched with no wait, and the
// rest go when the bucket refills, with nothing else to wake the loop.
func TestStatusEventsNeverHoldUpStatuses(t *testing.T) {
	u := newSinkUnit(t)
	u.s.events = newLimiter(u.clk, 2, 3) // a token every 500 ms
	web := sinkPod("web", "u1")
	u.desire(store.SourceAPI, web)
	for i := range 5 {
		u.s.Event(web, "Normal", fmt.Sprintf("E%d", i), "m", sinkEpoch)
	}
	u.runLoop()
	u.s.setConnected(true)
	u.s.setNodeSynced()

	calls := func() int { u.api.mu.Lock(); defer u.api.mu.Unlock(); return len(u.api.calls) }
	reactWait.Until(t, "the burst of events sent", func() bool { return calls() == 4 })
	// Idle: the recheck, the events' and the journal's waits armed.
	reactWait.Until(t, "the loop idle", func() bool { return u.clk.Waiters() >= 2 })
	u.wantCalls("list", "event E0", "event E1", "event E2")

	u.journal(web, phase(corev1.PodRunning))
	reactWait.Until(t, "the status patched", func() bool { return u.backlog() == 0 })
	u.wantCalls("patch default/web uid=u1 phase=Running")

	// Each advance waits for the events' timer, armed for the next token:
	// the loop arms it after it sends what the bucket allows, and an
	// advance before that would pass with nothing due.
	tick := 500 * time.Millisecond
	reactWait.Until(t, "the events' timer armed", func() bool { return u.clk.Armed(tick) })
	u.clk.Advance(tick)
	reactWait.Until(t, "one more event once a token came", func() bool { return calls() == 1 })
	reactWait.Until(t, "the events' timer armed again", func() bool { return u.clk.Armed(tick) })
	u.clk.Advance(tick)
	reactWait.Until(t, "the last event", func() bool { return calls() == 2 })
	u.wantCalls("event E3", "event E4")
}

// sinkTransport counts the requests that reach the API server, and can
// play an outage: while down, every request fails as a refused
// connection without leaving the node.
type sinkTransport struct {
	next http.RoundTripper
	mu   sync.Mutex
	down bool
	reqs []string // "METHOD PATH CODE"
}

func (t *sinkTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.mu.Lock()
	down := t.down
	t.mu.Unlock()
	if down {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	resp, err := t.next.RoundTrip(r)
	code := 0
	if resp != nil {
		code = resp.StatusCode
	}
	t.mu.Lock()
	t.reqs = append(t.reqs, fmt.Sprintf("%s %s %d", r.Method, r.URL.Path, code))
	t.mu.Unlock()
	return resp, err
}

func (t *sinkTransport) setDown(down bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.down = down
}

// requests returns the requests that reached the server whose
// "METHOD PATH" starts with prefix.
func (t *sinkTransport) requests(prefix string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, r := range t.reqs {
		if strings.HasPrefix(r, prefix) {
			out = append(out, r)
		}
	}
	return out
}

// sinkServer is a real API server, its admin, and a status sink running
// with the node identity of n1 (the Node exists, created by the admin).
type sinkServer struct {
	t     *testing.T
	admin *Client
	st    *store.Store
	s     *Syncer
	rt    *sinkTransport
	node  *corev1.Node
}

func startSinkServer(t *testing.T) *sinkServer {
	t.Helper()
	api := env.StartAPIServer(t)
	admin, err := NewClient(api.Config, "outpost-test-admin")
	if err != nil {
		t.Fatal(err)
	}
	e := &sinkServer{t: t, admin: admin}
	ctx := t.Context()
	if err := admin.Core.Post().Namespace("default").Resource("serviceaccounts").
		Body(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "default"}}).Do(ctx).Error(); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	e.node = &corev1.Node{}
	if err := admin.Core.Post().Resource("nodes").Body(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}).Do(ctx).Into(e.node); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadKubeconfig(api.NodeKubeconfig(t, "n1"))
	if err != nil {
		t.Fatal(err)
	}
	e.rt = &sinkTransport{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { e.rt.next = rt; return e.rt })
	client, err := NewClient(cfg, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	e.st, err = store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.st.Close() })
	e.s, err = New(Config{NodeName: "n1"}, Deps{
		Client: client, Store: e.st, Clock: clock.Real{}, Log: slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	// runNode is not under test here: the link is up and the node synced.
	e.s.setConnected(true)
	e.s.setNodeSynced()
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.s.runStatus(runCtx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

// createPod creates a pod with the admin identity, bound to node.
func (e *sinkServer) createPod(name, node string) *corev1.Pod {
	e.t.Helper()
	no := false
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{
			NodeName: node, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "app", Image: "busybox:1"}},
		},
	}
	out := &corev1.Pod{}
	if err := e.admin.Core.Post().Namespace("default").Resource("pods").Body(p).Do(e.t.Context()).Into(out); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// get reads a pod with the admin identity; nil when there is none.
func (e *sinkServer) get(name string) *corev1.Pod {
	e.t.Helper()
	out := &corev1.Pod{}
	err := e.admin.Core.Get().Namespace("default").Resource("pods").Name(name).Do(e.t.Context()).Into(out)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// desire puts p into the store as the watch or the manifests would.
func (e *sinkServer) desire(src store.Source, p *corev1.Pod) {
	e.t.Helper()
	p = p.DeepCopy()
	p.ResourceVersion, p.ManagedFields, p.Status = "", nil, corev1.PodStatus{}
	if err := e.st.Pods().Put(src, p); err != nil {
		e.t.Fatal(err)
	}
}

// journal appends a status of p as the agent does.
func (e *sinkServer) journal(p *corev1.Pod, st corev1.PodStatus) {
	e.t.Helper()
	v := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID}, Status: st}
	b, err := v.Marshal()
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.st.Append("pod/"+p.Namespace+"/"+p.Name, b); err != nil {
		e.t.Fatal(err)
	}
}

func (e *sinkServer) backlog() int {
	e.t.Helper()
	n, err := e.st.Backlog()
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

func runningWithIP(ip string) corev1.PodStatus {
	started := true
	return corev1.PodStatus{
		Phase: corev1.PodRunning, HostIP: "192.0.2.10", HostIPs: []corev1.HostIP{{IP: "192.0.2.10"}},
		PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, StartTime: &metav1.Time{Time: sinkEpoch},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Time{Time: sinkEpoch}}},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "app", Image: "busybox:1", ImageID: "docker.io/library/busybox@sha256:1", ContainerID: "containerd://c1",
			Ready: true, Started: &started, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Time{Time: sinkEpoch}}},
		}},
	}
}

// TestStatusAgainstAPIServer drains journaled statuses into a real API
// server with the node identity (Node authorizer, NodeRestriction).
func TestStatusAgainstAPIServer(t *testing.T) {
	e := startSinkServer(t)

	t.Run("one patch per status", func(t *testing.T) {
		p := e.createPod("web", "n1")
		e.desire(store.SourceAPI, p)
		e.journal(p, runningWithIP("10.88.0.5"))
		reactWait.Until(t, "status on the server", func() bool {
			return e.get("web").Status.PodIP == "10.88.0.5" && e.backlog() == 0
		})
		got := e.get("web").Status
		if got.Phase != corev1.PodRunning || len(got.ContainerStatuses) != 1 || !got.ContainerStatuses[0].Ready || got.QOSClass != corev1.PodQOSBestEffort {
			t.Errorf("server status = %+v", got)
		}
		if reqs := e.rt.requests("PATCH /api/v1/namespaces/default/pods/web/status"); len(reqs) != 1 || !strings.HasSuffix(reqs[0], " 200") {
			t.Errorf("status requests %q, want one PATCH answered 200", reqs)
		}

		// A newer status without an IP clears the server's (explicit nulls).
		e.journal(p, corev1.PodStatus{Phase: corev1.PodPending})
		reactWait.Until(t, "cleared status on the server", func() bool { return e.backlog() == 0 && e.get("web").Status.Phase == corev1.PodPending })
		if got := e.get("web").Status; got.PodIP != "" || len(got.PodIPs) != 0 || got.StartTime != nil || len(got.ContainerStatuses) != 0 || got.HostIP != "" {
			t.Errorf("stale status fields kept: %+v", got)
		}
	})

	t.Run("conditions others set are kept", func(t *testing.T) {
		p := e.createPod("evicted", "n1")
		e.desire(store.SourceAPI, p)
		e.journal(p, runningWithIP("10.88.0.10"))
		reactWait.Until(t, "status on the server", func() bool { return e.backlog() == 0 && e.get("evicted").Status.PodIP == "10.88.0.10" })
		// The control plane marks the pod for eviction (as the taint
		// manager does), then the node reports a newer status.
		dt := []byte(`{"status":{"conditions":[{"type":"DisruptionTarget","status":"True","reason":"DeletionByTaintManager"}]}}`)
		if err := e.admin.Core.Patch(types.StrategicMergePatchType).Namespace("default").Resource("pods").Name("evicted").SubResource("status").Body(dt).Do(t.Context()).Error(); err != nil {
			t.Fatal(err)
		}
		e.journal(p, runningWithIP("10.88.0.11"))
		reactWait.Until(t, "second status on the server", func() bool { return e.backlog() == 0 && e.get("evicted").Status.PodIP == "10.88.0.11" })
		if got := e.get("evicted").Status; len(got.ContainerStatuses) != 1 || got.ContainerStatuses[0].Name != "app" || len(got.PodIPs) != 1 {
			t.Errorf("after a second full status: containerStatuses %s, podIPs %v; want exactly the status's", asJSONForTest(got.ContainerStatuses), got.PodIPs)
		}
		e.journal(p, corev1.PodStatus{Phase: corev1.PodPending})
		reactWait.Until(t, "newer status on the server", func() bool { return e.backlog() == 0 && e.get("evicted").Status.Phase == corev1.PodPending })
		var have []corev1.PodConditionType
		for _, c := range e.get("evicted").Status.Conditions {
			have = append(have, c.Type)
		}
		if !slices.Contains(have, corev1.DisruptionTarget) {
			t.Errorf("conditions after the node's patch = %v, want DisruptionTarget kept", have)
		}
		if slices.Contains(have, corev1.PodReady) {
			t.Errorf("conditions after the node's patch = %v, want the node's Ready, absent from its status, deleted", have)
		}
	})

	t.Run("a condition that becomes True loses its reason", func(t *testing.T) {
		p := e.createPod("ready-later", "n1")
		e.desire(store.SourceAPI, p)
		notReady := runningWithIP("10.88.0.20")
		notReady.Conditions[0].Status = corev1.ConditionFalse
		notReady.Conditions[0].Reason, notReady.Conditions[0].Message = "ContainersNotReady", "containers with unready status: [app]"
		e.journal(p, notReady)
		reactWait.Until(t, "not ready on the server", func() bool { return e.backlog() == 0 && e.get("ready-later").Status.PodIP == "10.88.0.20" })
		e.journal(p, runningWithIP("10.88.0.21"))
		reactWait.Until(t, "ready on the server", func() bool { return e.backlog() == 0 && e.get("ready-later").Status.PodIP == "10.88.0.21" })
		for _, c := range e.get("ready-later").Status.Conditions {
			if c.Type == corev1.PodReady && (c.Status != corev1.ConditionTrue || c.Reason != "" || c.Message != "") {
				t.Errorf("Ready on the server = %+v, want True with no reason or message", c)
			}
		}
	})

	t.Run("outage coalesces to one patch", func(t *testing.T) {
		p := e.createPod("coalesce", "n1")
		e.desire(store.SourceAPI, p)
		e.rt.setDown(true)
		e.journal(p, corev1.PodStatus{Phase: corev1.PodPending})
		// The first try fails; the sink backs off.
		reactWait.Until(t, "a failed try", func() bool { return strings.Contains(e.s.Link().LastError, "refused") })
		e.journal(p, runningWithIP("10.88.0.6"))
		e.journal(p, runningWithIP("10.88.0.7"))
		e.rt.setDown(false)
		reactWait.Until(t, "newest status on the server", func() bool { return e.get("coalesce").Status.PodIP == "10.88.0.7" && e.backlog() == 0 })
		if reqs := e.rt.requests("PATCH /api/v1/namespaces/default/pods/coalesce/status"); len(reqs) != 1 {
			t.Errorf("status requests %q, want exactly one after the outage", reqs)
		}
	})

	t.Run("uid mismatch is dropped", func(t *testing.T) {
		p := e.createPod("replaced", "n1")
		old := p.DeepCopy()
		old.UID = "00000000-0000-0000-0000-000000000001" // the pod the node knew, since replaced
		e.desire(store.SourceAPI, old)
		e.journal(old, runningWithIP("10.88.0.8"))
		reactWait.Until(t, "status dropped", func() bool { return e.backlog() == 0 })
		reqs := e.rt.requests("PATCH /api/v1/namespaces/default/pods/replaced/status")
		// The uid in a patch is no registry precondition: the server
		// refuses the changed uid in validation, 422 Invalid on
		// metadata.uid (not the 409 Conflict of a DELETE's precondition).
		if len(reqs) != 1 || !strings.HasSuffix(reqs[0], " 422") {
			t.Errorf("status requests %q, want one PATCH answered 422 (metadata.uid is immutable)", reqs)
		}
		if e.get("replaced").Status.PodIP != "" {
			t.Error("status of the old pod written onto the new one")
		}
	})

	t.Run("missing pod is dropped", func(t *testing.T) {
		p := sinkPod("never", "00000000-0000-0000-0000-000000000002")
		e.desire(store.SourceAPI, p)
		e.journal(p, runningWithIP("10.88.0.9"))
		reactWait.Until(t, "status dropped", func() bool { return e.backlog() == 0 })
		if reqs := e.rt.requests("PATCH /api/v1/namespaces/default/pods/never/status"); len(reqs) != 1 || !strings.HasSuffix(reqs[0], " 404") {
			t.Errorf("status requests %q, want one PATCH answered 404", reqs)
		}
	})

	t.Run("pod of another node is dropped", func(t *testing.T) {
		p := e.createPod("elsewhere", "n2")
		e.desire(store.SourceAPI, p)
		e.journal(p, runningWithIP("10.88.0.10"))
		reactWait.Until(t, "status dropped", func() bool { return e.backlog() == 0 })
		if reqs := e.rt.requests("PATCH /api/v1/namespaces/default/pods/elsewhere/status"); len(reqs) != 1 || !strings.HasSuffix(reqs[0], " 403") {
			t.Errorf("status requests %q, want one PATCH answered 403", reqs)
		}
	})

	t.Run("event reaches the server", func(t *testing.T) {
		p := e.createPod("evented", "n1")
		e.desire(store.SourceAPI, p)
		e.s.Event(p, corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container app", sinkEpoch)
		var evs corev1.EventList
		reactWait.Until(t, "event listed", func() bool {
			if err := e.admin.Core.Get().Namespace("default").Resource("events").Do(t.Context()).Into(&evs); err != nil {
				t.Fatal(err)
			}
			return slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool {
				return ev.InvolvedObject.UID == p.UID && ev.Reason == "BackOff" && ev.Type == corev1.EventTypeWarning && ev.Source.Host == "n1"
			})
		})
	})

	t.Run("terminated pod is deleted", func(t *testing.T) {
		p := e.createPod("bye", "n1")
		// The user deletes it: the API server marks it and waits for the node.
		if err := e.admin.Core.Delete().Namespace("default").Resource("pods").Name("bye").Do(t.Context()).Error(); err != nil {
			t.Fatal(err)
		}
		marked := e.get("bye")
		if marked == nil || marked.DeletionTimestamp == nil {
			t.Fatalf("pod not marked for deletion: %+v", marked)
		}
		e.desire(store.SourceAPI, marked)
		// The agent stopped its containers and reports the terminal status.
		e.journal(p, corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "app", Image: "busybox:1", ContainerID: "containerd://c2",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error", FinishedAt: metav1.Time{Time: sinkEpoch}}},
		}}})
		reactWait.Until(t, "pod deleted", func() bool { return e.get("bye") == nil && e.backlog() == 0 })
		reqs := append(e.rt.requests("PATCH /api/v1/namespaces/default/pods/bye"), e.rt.requests("DELETE /api/v1/namespaces/default/pods/bye")...)
		if len(reqs) != 2 || !strings.HasSuffix(reqs[0], " 200") || !strings.HasSuffix(reqs[1], " 200") {
			t.Errorf("requests %q, want the status PATCH then the DELETE", reqs)
		}
	})
}

func TestStatusOutcomeOf(t *testing.T) {
	invalid := func(path ...string) error {
		return apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "web", field.ErrorList{field.Invalid(field.NewPath(path[0], path[1:]...), "x", "bad")})
	}
	for _, tc := range []struct {
		name string
		err  error
		want outcome
	}{
		{"nil", nil, outcomeDone},
		{"404", apierrors.NewNotFound(podsGR, "web"), outcomeGone},
		{"409", apierrors.NewConflict(podsGR, "web", errors.New("x")), outcomeGone},
		{"422 on metadata.uid", invalid("metadata", "uid"), outcomeGone},
		{"422 on status", invalid("status", "podIP"), outcomeRejected},
		{"403", apierrors.NewForbidden(podsGR, "web", errors.New("x")), outcomeForbidden},
		{"400", apierrors.NewBadRequest("x"), outcomeRejected},
		{"401", apierrors.NewUnauthorized("x"), outcomeRetry},
		{"429", apierrors.NewTooManyRequests("x", 1), outcomeRetry},
		{"500", apierrors.NewInternalError(errors.New("x")), outcomeRetry},
		{"503", apierrors.NewServiceUnavailable("x"), outcomeRetry},
		{"network", connRefused, outcomeRetry},
		{"wrapped 404", fmt.Errorf("patch: %w", apierrors.NewNotFound(podsGR, "web")), outcomeGone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := outcomeOf(tc.err); got != tc.want {
				t.Errorf("outcomeOf = %d, want %d", got, tc.want)
			}
		})
	}
}

func asJSONForTest(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
