package kube

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/internal/promtext"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// ---- unit tests ----

// stripPod drops what changes without the desired state changing, keeps
// what the agent acts on, and leaves its argument alone.
func TestPodsStrip(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	grace := int64(30)
	in := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: "web", UID: "u1", ResourceVersion: "42", Generation: 3,
			Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"a": "b"},
			DeletionTimestamp: &now, DeletionGracePeriodSeconds: &grace,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-1", UID: "rs"}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}},
		},
		Spec:   corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.5"},
	}
	orig := in.DeepCopy()
	got := stripPod(in)
	if !reflect.DeepEqual(in, orig) {
		t.Fatal("stripPod changed its argument")
	}
	want := orig.DeepCopy()
	want.TypeMeta, want.ResourceVersion, want.ManagedFields, want.Status = metav1.TypeMeta{}, "", nil, corev1.PodStatus{}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("stripPod =\n%+v\nwant\n%+v", got, want)
	}

	cm := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cm", UID: "u2", ResourceVersion: "7", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}},
		Data:       map[string]string{"k": "v"},
	}
	gotCM := stripMeta(cm).(*corev1.ConfigMap)
	wantCM := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cm", UID: "u2"}, Data: map[string]string{"k": "v"}}
	if !reflect.DeepEqual(gotCM, wantCM) || cm.ResourceVersion != "7" {
		t.Fatalf("stripMeta = %+v, want %+v (argument untouched)", gotCM, wantCM)
	}
}

func TestPodsMirrorDetection(t *testing.T) {
	for _, tt := range []struct {
		ann  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"kubernetes.io/config.source": "file"}, false},
		{map[string]string{"kubernetes.io/config.mirror": "abc"}, true},
		{map[string]string{"kubernetes.io/config.mirror": ""}, true},
	} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: tt.ann}}
		if got := isMirrorPod(p); got != tt.want {
			t.Errorf("isMirrorPod(%v) = %v, want %v", tt.ann, got, tt.want)
		}
	}
}

// pwUnitSyncer is a Syncer over a fresh store and a fake clock, with no
// reachable API server.
func pwUnitSyncer(t *testing.T) (*Syncer, *store.Store, *clocktest.Fake) {
	t.Helper()
	st := pwStore(t, "n1")
	clk := clocktest.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	// Nothing listens on port 1: every request fails at once.
	client, err := NewClient(&rest.Config{Host: "https://127.0.0.1:1"}, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{NodeName: "n1"}, Deps{Client: client, Store: st, Clock: clk, Log: pwLog(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	return s, st, clk
}

func pwStore(t *testing.T, node string) *store.Store {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{NodeName: node})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func pwPod(name, uid, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(uid), ResourceVersion: "1"},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}}},
	}
}

// Watch events reach the store as the rules say: mirror pods never, a
// status-only change writes nothing, a static pod of the same name is
// neither replaced nor deleted, and a DELETED of another UID removes
// nothing.
func TestPodsEventsIntoStore(t *testing.T) {
	s, st, _ := pwUnitSyncer(t)
	p := &podSync{s: s}
	static := pwPod("clash", "static-uid", "n1")
	static.ResourceVersion = ""
	if err := st.Pods().Put(store.SourceStatic, static); err != nil {
		t.Fatal(err)
	}
	ev := func(typ watch.EventType, pod *corev1.Pod, wantChanged bool) {
		t.Helper()
		changed, err := p.event(typ, pod)
		if err != nil || changed != wantChanged {
			t.Fatalf("%s %s: changed %v, %v; want changed %v", typ, pod.Name, changed, err, wantChanged)
		}
	}
	mirror := pwPod("kube-proxy-n1", "m", "n1")
	mirror.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "hash"}
	ev(watch.Added, mirror, false)
	if _, found, _ := st.Pods().Get("default", "kube-proxy-n1"); found {
		t.Fatal("mirror pod stored")
	}

	a := pwPod("a", "ua", "n1")
	ev(watch.Added, a, true)
	rec, found, err := st.Pods().Get("default", "a")
	if err != nil || !found || rec.Source != store.SourceAPI || rec.Object.ResourceVersion != "" {
		t.Fatalf("stored a: %+v %v %v", rec, found, err)
	}
	echo := a.DeepCopy()
	echo.ResourceVersion = "2"
	echo.Status = corev1.PodStatus{Phase: corev1.PodRunning}
	echo.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "outpost", Subresource: "status"}}
	ev(watch.Modified, echo, false)
	relabeled := echo.DeepCopy()
	relabeled.Labels = map[string]string{"x": "y"}
	ev(watch.Modified, relabeled, true)

	ev(watch.Added, pwPod("clash", "api-uid", "n1"), false)
	ev(watch.Deleted, pwPod("clash", "api-uid", "n1"), false)
	ev(watch.Deleted, pwPod("clash", "static-uid", "n1"), false)
	if rec, found, _ := st.Pods().Get("default", "clash"); !found || rec.Source != store.SourceStatic || rec.Object.UID != "static-uid" {
		t.Fatalf("static pod touched: %+v %v", rec, found)
	}

	ev(watch.Deleted, pwPod("a", "other-uid", "n1"), false)
	ev(watch.Deleted, pwPod("a", "ua", "n1"), true)
	if _, found, _ := st.Pods().Get("default", "a"); found {
		t.Fatal("deleted pod still stored")
	}
}

// The resume version is written after a change of a stored pod, and
// otherwise at most every rvPersistPeriod, and when the loop stops.
func TestPodsResumeVersionWrites(t *testing.T) {
	s, st, clk := pwUnitSyncer(t)
	p := &podSync{s: s, persistedAt: clk.Now()}
	stored := func() string {
		t.Helper()
		rv, err := st.ResumeVersion(podsResource)
		if err != nil {
			t.Fatal(err)
		}
		return rv
	}
	steps := []struct {
		advance time.Duration
		rv      string
		changed bool
		want    string
	}{
		{0, "10", false, ""},
		{time.Minute, "11", false, ""},
		{0, "12", true, "12"},
		{time.Minute, "13", false, "12"},
		{rvPersistPeriod - time.Minute - time.Second, "14", false, "12"},
		{time.Second, "15", false, "15"},
		{0, "16", false, "15"},
	}
	for i, st := range steps {
		clk.Advance(st.advance)
		p.progress(st.rv, st.changed)
		if got := stored(); got != st.want {
			t.Fatalf("step %d (rv %s, changed %v): stored %q, want %q", i, st.rv, st.changed, got, st.want)
		}
	}
	p.persist()
	if got := stored(); got != "16" {
		t.Fatalf("after persist: stored %q, want 16", got)
	}
}

func TestPodsSplitConflicts(t *testing.T) {
	c1 := errors.Join(errors.New("x"), store.ErrSourceConflict)
	other := errors.New("disk full")
	conf, rest := splitConflicts(errors.Join(c1, other))
	if len(conf) != 1 || !errors.Is(rest, other) || errors.Is(rest, store.ErrSourceConflict) {
		t.Fatalf("conflicts %v, rest %v", conf, rest)
	}
	if conf, rest := splitConflicts(nil); conf != nil || rest != nil {
		t.Fatalf("nil: %v %v", conf, rest)
	}
}

// ---- helpers of the tests against a real API server ----
//
// Test helpers are prefixed pw (pod watch): the package's other test
// files are written at the same time.

// pwRecorder keeps every record (message and attributes as strings) and
// also writes it to the test's output.
type pwRecorder struct {
	mu   sync.Mutex
	recs []map[string]string
	next slog.Handler
}

func (l *pwRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (l *pwRecorder) Handle(ctx context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	l.recs = append(l.recs, m)
	l.mu.Unlock()
	return l.next.Handle(ctx, r)
}

func (l *pwRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *pwRecorder) WithGroup(string) slog.Handler      { return l }

// find reports whether a record has every key/value of want.
func (l *pwRecorder) find(want map[string]string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
next:
	for _, r := range l.recs {
		for k, v := range want {
			if r[k] != v {
				continue next
			}
		}
		return true
	}
	return false
}

func pwLog(t *testing.T, rec *pwRecorder) *slog.Logger {
	h := slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})
	if rec == nil {
		return slog.New(h)
	}
	rec.next = h
	return slog.New(rec)
}

// pwEnv is a real API server with an admin client.
type pwEnv struct {
	t     *testing.T
	api   *env.APIServer
	admin rest.Interface
}

func pwStartAPI(t *testing.T) *pwEnv {
	t.Helper()
	api := env.StartAPIServer(t)
	c, err := NewClient(api.Config, "outpost-test-admin")
	if err != nil {
		t.Fatal(err)
	}
	e := &pwEnv{t: t, api: api, admin: c.Core}
	// The ServiceAccount admission plugin wants the namespace's default
	// service account, and there is no controller to create it.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	apiWait.Until(e.t, "default service account", func() bool {
		err := c.Core.Post().Namespace("default").Resource("serviceaccounts").Body(sa).Do(context.Background()).Error()
		return err == nil || apierrors.IsAlreadyExists(err)
	})
	return e
}

func (e *pwEnv) do(what string, req *rest.Request, into runtime.Object) {
	e.t.Helper()
	res := req.Do(context.Background())
	var err error
	if into != nil {
		err = res.Into(into)
	} else {
		err = res.Error()
	}
	if err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
}

// createPod creates default/name bound to node, changed by mut.
func (e *pwEnv) createPod(name, node string, mut ...func(*corev1.Pod)) *corev1.Pod {
	e.t.Helper()
	f := false
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName: node, AutomountServiceAccountToken: &f,
			Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}},
		},
	}
	for _, m := range mut {
		m(p)
	}
	out := &corev1.Pod{}
	e.do("create pod "+name, e.admin.Post().Namespace("default").Resource("pods").Body(p), out)
	return out
}

func (e *pwEnv) deletePod(name string, grace int64) {
	e.t.Helper()
	e.do("delete pod "+name, e.admin.Delete().Namespace("default").Resource("pods").Name(name).
		Body(&metav1.DeleteOptions{GracePeriodSeconds: &grace}), nil)
}

// pwCounter counts the requests a syncer's client makes.
type pwCounter struct {
	mu       sync.Mutex
	podLists int
	watchRVs []string // resourceVersion of every pods watch
}

func (c *pwCounter) lists() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.podLists
}

func (c *pwCounter) watches() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.watchRVs...)
}

type pwTransport struct {
	c    *pwCounter
	next http.RoundTripper
}

func (t pwTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodGet && req.URL.Path == "/api/v1/pods" {
		q := req.URL.Query()
		t.c.mu.Lock()
		if q.Get("watch") == "true" || q.Get("watch") == "1" {
			t.c.watchRVs = append(t.c.watchRVs, q.Get("resourceVersion"))
		} else {
			t.c.podLists++
		}
		t.c.mu.Unlock()
	}
	return t.next.RoundTrip(req)
}

// nodeSyncer returns a Syncer for node with the node's own identity,
// counting its requests; via, when set, is the host:port it connects to
// instead of the API server's.
func (e *pwEnv) nodeSyncer(node string, st *store.Store, log *slog.Logger, via ...string) (*Syncer, *pwCounter) {
	e.t.Helper()
	cfg, err := LoadKubeconfig(e.api.NodeKubeconfig(e.t, node))
	if err != nil {
		e.t.Fatal(err)
	}
	if len(via) > 0 {
		cfg.Host = "https://" + via[0]
	}
	rc := &pwCounter{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return pwTransport{c: rc, next: rt} })
	client, err := NewClient(cfg, "outpost-test")
	if err != nil {
		e.t.Fatal(err)
	}
	s, err := New(Config{NodeName: node}, Deps{Client: client, Store: st, Clock: clock.Real{}, Log: log})
	if err != nil {
		e.t.Fatal(err)
	}
	return s, rc
}

// runPodsLoop runs s.runPods until the returned stop is called (or the
// test ends); stop returns after runPods did.
func pwRun(t *testing.T, s *Syncer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.runPods(ctx)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

func pwStored(t *testing.T, st *store.Store, name string) (store.Record[*corev1.Pod], bool) {
	t.Helper()
	rec, found, err := st.Pods().Get("default", name)
	if err != nil {
		t.Fatal(err)
	}
	return rec, found
}

func pwResumeVersion(t *testing.T, st *store.Store) string {
	t.Helper()
	rv, err := st.ResumeVersion(podsResource)
	if err != nil {
		t.Fatal(err)
	}
	return rv
}

// ---- tests against a real API server, with the node identity ----

// Pods bound to the node reach the store (without status, RV and
// managedFields), pods of other nodes and mirror pods never do, a
// graceful delete is stored as a deletionTimestamp and the final delete
// removes the pod, a static pod of the same name as an API pod is never
// touched, and an echo of a status change writes nothing to the file.
func TestPodsWatchIntoStore(t *testing.T) {
	e := pwStartAPI(t)
	st := pwStore(t, "n1")
	static := pwPod("clash", "static-uid", "n1")
	static.ResourceVersion = ""
	if err := st.Pods().Put(store.SourceStatic, static); err != nil {
		t.Fatal(err)
	}
	rec := &pwRecorder{}
	s, rc := e.nodeSyncer("n1", st, pwLog(t, rec))
	pwRun(t, s)

	e.createPod("elsewhere", "n2")
	e.createPod("mirror-n1", "n1", func(p *corev1.Pod) {
		p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "abc"}
	})
	e.createPod("clash", "n1")
	a := e.createPod("a", "n1")
	apiWait.Until(e.t, "pod a stored", func() bool { _, ok := pwStored(t, st, "a"); return ok })
	got, _ := pwStored(t, st, "a")
	if got.Source != store.SourceAPI || got.Object.UID != a.UID || got.Object.ResourceVersion != "" ||
		got.Object.ManagedFields != nil || got.Object.Labels["app"] != "a" || !reflect.DeepEqual(got.Object.Status, corev1.PodStatus{}) {
		t.Fatalf("stored pod a = %+v", got)
	}
	for _, name := range []string{"elsewhere", "mirror-n1"} {
		if _, ok := pwStored(t, st, name); ok {
			t.Fatalf("pod %s stored", name)
		}
	}
	if r, _ := pwStored(t, st, "clash"); r.Source != store.SourceStatic || r.Object.UID != "static-uid" {
		t.Fatalf("static pod replaced by the API's: %+v", r)
	}
	if n := rc.lists(); n != 1 {
		t.Fatalf("%d pod lists, want 1", n)
	}

	// A status-only change (our own patches look like this) is seen and
	// writes nothing: same stored bytes, file untouched.
	apiWait.Until(e.t, "resume version of pod a persisted", func() bool { return pwResumeVersion(t, st) == a.ResourceVersion })
	before, _ := pwStored(t, st, "a")
	fi0, err := os.Stat(st.Path())
	if err != nil {
		t.Fatal(err)
	}
	patched := &corev1.Pod{}
	e.do("patch status of a", e.admin.Patch(types.MergePatchType).Namespace("default").Resource("pods").Name("a").SubResource("status").
		Body([]byte(`{"status":{"phase":"Running","podIP":"10.1.2.3","conditions":[{"type":"Ready","status":"True"}]}}`)), patched)
	apiWait.Until(e.t, "status echo seen", func() bool {
		return rec.find(map[string]string{"msg": "pod event", "pod": "default/a", "resourceVersion": patched.ResourceVersion, "changed": "false"})
	})
	after, _ := pwStored(t, st, "a")
	if ok, err := sameEncoding(before.Object, after.Object); err != nil || !ok {
		t.Fatalf("stored pod changed by a status patch: %+v -> %+v", before.Object, after.Object)
	}
	fi1, err := os.Stat(st.Path())
	if err != nil {
		t.Fatal(err)
	}
	if !fi1.ModTime().Equal(fi0.ModTime()) || fi1.Size() != fi0.Size() {
		t.Fatalf("store file written by a status echo: %v %d -> %v %d", fi0.ModTime(), fi0.Size(), fi1.ModTime(), fi1.Size())
	}

	// Graceful delete: kept, with its deletionTimestamp, for the agent
	// to stop; final delete: gone. The static pod stays through the API
	// pod's delete.
	e.deletePod("a", 30)
	apiWait.Until(e.t, "deletionTimestamp stored", func() bool {
		r, ok := pwStored(t, st, "a")
		return ok && r.Object.DeletionTimestamp != nil && r.Object.DeletionGracePeriodSeconds != nil && *r.Object.DeletionGracePeriodSeconds == 30
	})
	e.deletePod("a", 0)
	e.deletePod("clash", 0)
	apiWait.Until(e.t, "pod a removed", func() bool { _, ok := pwStored(t, st, "a"); return !ok })
	b := e.createPod("b", "n1")
	apiWait.Until(e.t, "pod b stored", func() bool { _, ok := pwStored(t, st, "b"); return ok })
	if r, ok := pwStored(t, st, "clash"); !ok || r.Source != store.SourceStatic || r.Object.UID != "static-uid" {
		t.Fatalf("static pod touched by the API pod's delete: %+v %v", r, ok)
	}
	for _, name := range []string{"elsewhere", "mirror-n1"} {
		if _, ok := pwStored(t, st, name); ok {
			t.Fatalf("pod %s stored", name)
		}
	}
	if n := rc.lists(); n != 1 {
		t.Fatalf("%d pod lists, want 1", n)
	}
	_ = b
}

// A restarted syncer watches from the stored resourceVersion without
// listing, and still sees what happened while it was stopped: a pod
// created and one deleted meanwhile.
func TestPodsResumeWithoutRelist(t *testing.T) {
	e := pwStartAPI(t)
	st := pwStore(t, "n1")
	s1, rc1 := e.nodeSyncer("n1", st, pwLog(t, nil))
	stop := pwRun(t, s1)
	e.createPod("old", "n1")
	apiWait.Until(e.t, "pod old stored", func() bool { _, ok := pwStored(t, st, "old"); return ok })
	stop()
	if rc1.lists() != 1 {
		t.Fatalf("first syncer: %d lists, want 1", rc1.lists())
	}
	rv := pwResumeVersion(t, st)
	if rv == "" {
		t.Fatal("no resume version stored")
	}

	e.createPod("new", "n1")
	e.deletePod("old", 0)

	s2, rc2 := e.nodeSyncer("n1", st, pwLog(t, nil))
	pwRun(t, s2)
	apiWait.Until(e.t, "pod new stored and old removed", func() bool {
		_, okNew := pwStored(t, st, "new")
		_, okOld := pwStored(t, st, "old")
		return okNew && !okOld
	})
	if n := rc2.lists(); n != 0 {
		t.Fatalf("restarted syncer listed pods %d times, want 0", n)
	}
	if w := rc2.watches(); len(w) == 0 || w[0] != rv {
		t.Fatalf("restarted syncer's watches from %q, want the first from %q", w, rv)
	}
}

// A stored resourceVersion the server no longer has (410 Gone) makes the
// syncer relist once and reconcile: API pods gone from the server leave
// the store, the others are stored, static pods are untouched.
func TestPodsExpiredVersionRelists(t *testing.T) {
	e := pwStartAPI(t)
	st := pwStore(t, "n1")
	ghost := pwPod("ghost", "ghost-uid", "n1")
	ghost.ResourceVersion = ""
	static := pwPod("clash", "static-uid", "n1")
	static.ResourceVersion = ""
	if err := st.Pods().Put(store.SourceAPI, ghost); err != nil {
		t.Fatal(err)
	}
	if err := st.Pods().Put(store.SourceStatic, static); err != nil {
		t.Fatal(err)
	}
	if err := st.SetResumeVersion(podsResource, "1"); err != nil {
		t.Fatal(err)
	}
	e.createPod("real", "n1")
	e.createPod("clash", "n1")
	// A fresh API server's watch cache starts at the current revision:
	// older versions are then answered with 410 Gone, as after etcd
	// compacted them.
	e.api.Stop()
	e.api.Start(t)

	rec := &pwRecorder{}
	s, rc := e.nodeSyncer("n1", st, pwLog(t, rec))
	pwRun(t, s)
	apiWait.Until(e.t, "ghost removed and real stored", func() bool {
		_, okGhost := pwStored(t, st, "ghost")
		_, okReal := pwStored(t, st, "real")
		return okReal && !okGhost
	})
	if !rec.find(map[string]string{"msg": "watch resourceVersion expired; relisting", "resourceVersion": "1"}) {
		t.Fatal("no 410 relist logged")
	}
	if w := rc.watches(); len(w) == 0 || w[0] != "1" {
		t.Fatalf("watches from %q, want the first from the stored 1", w)
	}
	if n := rc.lists(); n != 1 {
		t.Fatalf("%d pod lists, want 1", n)
	}
	if r, ok := pwStored(t, st, "clash"); !ok || r.Source != store.SourceStatic || r.Object.UID != "static-uid" {
		t.Fatalf("static pod touched by the relist: %+v %v", r, ok)
	}
	apiWait.Until(e.t, "new resume version stored", func() bool { rv := pwResumeVersion(t, st); return rv != "" && rv != "1" })
}

// A broken link is noted and retried with backoff; when it is back, the
// watch resumes from where it got, without a list, and shows what
// changed meanwhile. The store keeps its pods throughout.
func TestPodsReconnectResumes(t *testing.T) {
	e := pwStartAPI(t)
	u, err := url.Parse(e.api.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, u.Host)
	st := pwStore(t, "n1")
	s, rc := e.nodeSyncer("n1", st, pwLog(t, nil), proxy.addr)
	pwRun(t, s)
	before := e.createPod("before", "n1")
	apiWait.Until(e.t, "pod before stored", func() bool { _, ok := pwStored(t, st, "before"); return ok })

	proxy.cut()
	e.createPod("during", "n1")
	apiWait.Until(e.t, "a refused reconnect noted", func() bool { return strings.Contains(s.Link().LastError, "connection refused") })
	if _, ok := pwStored(t, st, "before"); !ok {
		t.Fatal("pod lost from the store while the server is unreachable")
	}
	watchesBefore := len(rc.watches())
	proxy.resume()
	apiWait.Until(e.t, "pod during stored", func() bool { _, ok := pwStored(t, st, "during"); return ok })
	if n := rc.lists(); n != 1 {
		t.Fatalf("%d pod lists, want 1 (resumed, not relisted)", n)
	}
	w := rc.watches()
	if len(w) <= watchesBefore {
		t.Fatalf("no new watch after the link came back: %q", w)
	}
	// Every watch after the outage resumed from a version at or after
	// pod before's, never from scratch.
	for _, rv := range w[watchesBefore:] {
		n, err := strconv.ParseUint(rv, 10, 64)
		if min, _ := strconv.ParseUint(before.ResourceVersion, 10, 64); err != nil || n < min {
			t.Fatalf("a watch after the outage started from %q, before pod before's %s: %q", rv, before.ResourceVersion, w)
		}
	}
}

// A 410 answered to the watch request itself (not as an ERROR event) is
// handled like one: the syncer relists and reconciles the store. The
// server here is a fake speaking JSON; the tests above use a real one.
func TestPodsWatchGoneAtStartRelists(t *testing.T) {
	var mu sync.Mutex
	var reqs []string
	var watchOnce sync.Once
	watching := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		mu.Lock()
		reqs = append(reqs, r.URL.Path+" watch="+q.Get("watch")+" rv="+q.Get("resourceVersion"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path != "/api/v1/pods":
			w.WriteHeader(http.StatusNotFound) // config maps, secrets: none referenced
		case q.Get("watch") == "true" && q.Get("resourceVersion") == "5":
			w.WriteHeader(http.StatusGone)
			io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","message":"too old resource version: 5 (9)","code":410}`)
		case q.Get("watch") == "true":
			watchOnce.Do(func() { close(watching) })
			<-r.Context().Done() // a quiet watch, until the syncer stops
		default:
			io.WriteString(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"10"},"items":[
				{"metadata":{"name":"real","namespace":"default","uid":"r1","resourceVersion":"8"},"spec":{"nodeName":"n1","containers":[{"name":"c","image":"busybox:1"}]}}]}`)
		}
	}))
	t.Cleanup(srv.Close) // after pwRun's stop: the quiet watch ends first
	st := pwStore(t, "n1")
	ghost := pwPod("ghost", "g1", "n1")
	ghost.ResourceVersion = ""
	if err := st.Pods().Put(store.SourceAPI, ghost); err != nil {
		t.Fatal(err)
	}
	if err := st.SetResumeVersion(podsResource, "5"); err != nil {
		t.Fatal(err)
	}
	client, err := NewClient(&rest.Config{Host: srv.URL}, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{NodeName: "n1"}, Deps{Client: client, Store: st, Clock: clocktest.New(time.Unix(0, 0)), Log: pwLog(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	changed, unsub := st.Subscribe(store.KindPod)
	defer unsub()
	stop := pwRun(t, s)
	giveUp := time.NewTimer(10 * time.Second) // a safety net, not a wait
	defer giveUp.Stop()
	for {
		_, okGhost := pwStored(t, st, "ghost")
		_, okReal := pwStored(t, st, "real")
		if okReal && !okGhost {
			break
		}
		select {
		case <-changed:
		case <-giveUp.C:
			t.Fatalf("store not reconciled: ghost %v, real %v", okGhost, okReal)
		}
	}
	select {
	case <-watching:
	case <-giveUp.C:
		t.Fatal("no watch after the relist")
	}
	stop()
	if rv := pwResumeVersion(t, st); rv != "10" {
		t.Fatalf("resume version %q, want the list's 10", rv)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"/api/v1/pods watch=true rv=5", "/api/v1/pods watch= rv=", "/api/v1/pods watch=true rv=10"}
	if len(reqs) < 3 || !reflect.DeepEqual(reqs[:3], want) {
		t.Fatalf("requests %q, want %q first", reqs, want)
	}
}

// An API server rebuilt from an empty etcd counts resourceVersions from
// low again: a watch from the stored version is answered "too large
// resource version" (504 with that cause), which relists as a 410 does;
// before, the syncer retried the same version forever and kept the pods
// the new server does not have.
func TestPodsWatchTooLargeVersionRelists(t *testing.T) {
	api := pwStartFakeAPI(t, func(w http.ResponseWriter, rv string) bool {
		if rv != "5000" {
			return false
		}
		w.WriteHeader(http.StatusGatewayTimeout)
		io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Timeout: Too large resource version: 5000, current: 9","reason":"Timeout","details":{"causes":[{"reason":"ResourceVersionTooLarge","message":"Too large resource version"}],"retryAfterSeconds":1},"code":504}`)
		return true
	}, func(int) string {
		return `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"10"},"items":[
			{"metadata":{"name":"real","namespace":"default","uid":"real-uid","resourceVersion":"8"},"spec":{"nodeName":"n1","containers":[{"name":"c","image":"busybox:1"}]}}]}`
	})
	st := pwStore(t, "n1")
	ghost := pwPod("ghost", "g1", "n1")
	ghost.ResourceVersion = ""
	if err := st.Pods().Put(store.SourceAPI, ghost); err != nil {
		t.Fatal(err)
	}
	if err := st.SetResumeVersion(podsResource, "5000"); err != nil {
		t.Fatal(err)
	}
	stop := pwRun(t, api.syncer(t, st))
	api.watchFrom(t, "10")
	if _, ok := pwStored(t, st, "ghost"); ok {
		t.Fatal("ghost kept after the too-large version relisted")
	}
	if _, ok := pwStored(t, st, "real"); !ok {
		t.Fatal("real not stored by the relist")
	}

	stop()
	api.wantRequests(t, "/api/v1/pods watch=true rv=5000", "/api/v1/pods watch= rv=", "/api/v1/pods watch=true rv=10")
}

// Once the Node is found missing and created again (noteForgotten: an
// API server rebuilt from an empty etcd, or the Node deleted), an open
// watch, from a version that may mean something else to the new server,
// ends and the pods are listed again: the pods that server does not have
// leave the store. Before, the watch went on from where it was, and the
// node kept running pods the API server had never heard of.
func TestPodsOpenWatchRelistsWhenNodeForgotten(t *testing.T) {
	api := pwStartFakeAPI(t, nil, func(lists int) string {
		name, rv := "old", "10"
		if lists > 1 {
			name, rv = "fresh", "3"
		}
		return `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"` + rv + `"},"items":[
			{"metadata":{"name":"` + name + `","namespace":"default","uid":"` + name + `-uid","resourceVersion":"2"},"spec":{"nodeName":"n1","containers":[{"name":"c","image":"busybox:1"}]}}]}`
	})
	st := pwStore(t, "n1")
	s := api.syncer(t, st)
	stop := pwRun(t, s)
	api.watchFrom(t, "10")
	if _, ok := pwStored(t, st, "old"); !ok {
		t.Fatal("old not stored by the list")
	}

	s.noteForgotten()
	api.watchFrom(t, "3")
	stop()
	if _, ok := pwStored(t, st, "old"); ok {
		t.Fatal("old kept after the relist of the forgotten node")
	}
	if _, ok := pwStored(t, st, "fresh"); !ok {
		t.Fatal("fresh not stored by the relist of the forgotten node")
	}
	if rv := pwResumeVersion(t, st); rv != "3" {
		t.Fatalf("resume version %q, want the new list's 3", rv)
	}
	api.wantRequests(t, "/api/v1/pods watch= rv=", "/api/v1/pods watch=true rv=10", "/api/v1/pods watch= rv=", "/api/v1/pods watch=true rv=3")
}

// pwFakeAPI is an HTTP server that answers the pods list and watch as the
// API server would, for the tests of how the pods watch goes on: it
// records each request ("PATH watch=W rv=RV").
type pwFakeAPI struct {
	client *Client
	// watching says from which version each quiet watch was opened.
	watching chan string
	mu       sync.Mutex
	reqs     []string
	lists    int
}

// pwStartFakeAPI starts a pwFakeAPI. A watch is answered by watch when it
// returns true (nil: never), else held open and quiet until it is
// stopped; the nth list is answered with list(n)'s PodList.
func pwStartFakeAPI(t *testing.T, watch func(w http.ResponseWriter, rv string) bool, list func(n int) string) *pwFakeAPI {
	t.Helper()
	a := &pwFakeAPI{watching: make(chan string, 4)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		a.mu.Lock()
		a.reqs = append(a.reqs, r.URL.Path+" watch="+q.Get("watch")+" rv="+q.Get("resourceVersion"))
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path != "/api/v1/pods":
			w.WriteHeader(http.StatusNotFound)
		case q.Get("watch") == "true":
			if watch != nil && watch(w, q.Get("resourceVersion")) {
				return
			}
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush() // the watch is open
			a.watching <- q.Get("resourceVersion")
			<-r.Context().Done() // a quiet watch, until it is stopped
		default:
			a.mu.Lock()
			a.lists++
			n := a.lists
			a.mu.Unlock()
			io.WriteString(w, list(n))
		}
	}))
	t.Cleanup(srv.Close)
	client, err := NewClient(&rest.Config{Host: srv.URL}, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	a.client = client
	return a
}

// syncer is a Syncer of node n1 on st against the fake API server.
func (a *pwFakeAPI) syncer(t *testing.T, st *store.Store) *Syncer {
	t.Helper()
	s, err := New(Config{NodeName: "n1"}, Deps{Client: a.client, Store: st, Clock: clocktest.New(time.Unix(0, 0)), Log: pwLog(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// watchFrom waits for the next quiet watch and checks its version.
func (a *pwFakeAPI) watchFrom(t *testing.T, want string) {
	t.Helper()
	giveUp := time.NewTimer(10 * time.Second) // a safety net, not a wait
	defer giveUp.Stop()
	select {
	case rv := <-a.watching:
		if rv != want {
			t.Fatalf("watch from %q, want %q", rv, want)
		}
	case <-giveUp.C:
		t.Fatalf("no watch from %q", want)
	}
}

// wantRequests checks the requests made so far.
func (a *pwFakeAPI) wantRequests(t *testing.T, want ...string) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if !reflect.DeepEqual(a.reqs, want) {
		t.Fatalf("requests %q, want %q", a.reqs, want)
	}
}

// pwCommits returns the store's committed write transactions so far, as
// its metrics give them.
func pwCommits(t *testing.T, st *store.Store) int {
	t.Helper()
	var b bytes.Buffer
	p := promtext.New(&b)
	st.WriteMetrics(p)
	p.Flush()
	for _, line := range strings.Split(b.String(), "\n") {
		if v, ok := strings.CutPrefix(line, "outpost_store_commits_total "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no outpost_store_commits_total in %q", b.String())
	return 0
}

// A watch event that changes a stored pod costs one commit: the pod and
// the event's resourceVersion, which progress then finds persisted. An
// event that changes nothing writes nothing.
func TestPodsEventIsOneCommit(t *testing.T) {
	s, st, _ := pwUnitSyncer(t)
	p := &podSync{s: s}
	step := func(typ watch.EventType, pod *corev1.Pod, wantCommits int) {
		t.Helper()
		before := pwCommits(t, st)
		changed, err := p.event(typ, pod)
		if err != nil {
			t.Fatal(err)
		}
		p.progress(pod.ResourceVersion, changed)
		if got := pwCommits(t, st) - before; got != wantCommits {
			t.Fatalf("%s %s at %s: %d commits, want %d", typ, pod.Name, pod.ResourceVersion, got, wantCommits)
		}
		if rv, err := st.ResumeVersion(podsResource); err != nil || (wantCommits > 0 && rv != pod.ResourceVersion) {
			t.Fatalf("%s %s: resume version %q, %v; want %q", typ, pod.Name, rv, err, pod.ResourceVersion)
		}
	}
	a := pwPod("a", "ua", "n1")
	a.ResourceVersion = "20"
	step(watch.Added, a, 1)
	same := a.DeepCopy()
	same.ResourceVersion = "21"
	same.Status.Phase = corev1.PodRunning // status only: the stored pod is unchanged
	step(watch.Modified, same, 0)
	gone := a.DeepCopy()
	gone.ResourceVersion = "22"
	step(watch.Deleted, gone, 1)
	if _, found, _ := st.Pods().Get("default", "a"); found {
		t.Fatal("deleted pod still stored")
	}
}
