package kube

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/store"
)

// Test helpers are prefixed sv (services watch); the pw helpers are the
// pods watch tests'.

// ---- unit tests ----

func svService(ns, name, uid string) *corev1.Service {
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name, UID: types.UID(uid), ResourceVersion: "5",
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}},
		},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.0.0.10", ClusterIPs: []string{"10.0.0.10"},
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30080}},
		},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "198.51.100.7"}}}},
	}
}

func svServices(s *Syncer) *clusterSync[corev1.Service, *corev1.Service] {
	return newClusterSync(s, s.deps.Store.Services(), clusterKind{resource: servicesResource, noun: "service", logKey: "service"})
}

// Watch events reach the store whole but for type meta, resourceVersion
// and managedFields; a change of those alone writes nothing; a static
// Service of the same name is neither replaced nor deleted; a DELETED of
// another UID removes nothing.
func TestServicesEventsIntoStore(t *testing.T) {
	s, st, _ := pwUnitSyncer(t)
	w := svServices(s)
	static := svService("default", "clash", "static-uid")
	if err := st.Services().Put(store.SourceStatic, stripMeta(static).(*corev1.Service)); err != nil {
		t.Fatal(err)
	}
	ev := func(typ watch.EventType, svc *corev1.Service, wantChanged bool) {
		t.Helper()
		changed, err := w.event(typ, svc)
		if err != nil || changed != wantChanged {
			t.Fatalf("%s %s: changed %v, %v; want changed %v", typ, svc.Name, changed, err, wantChanged)
		}
	}
	web := svService("default", "web", "u1")
	orig := web.DeepCopy()
	ev(watch.Added, web, true)
	if !reflect.DeepEqual(web, orig) {
		t.Fatal("event changed the watch's object (watchOnce reads its resourceVersion after)")
	}
	rec, found, err := st.Services().Get("default", "web")
	want := orig.DeepCopy()
	want.TypeMeta, want.ResourceVersion, want.ManagedFields = metav1.TypeMeta{}, "", nil
	if err != nil || !found || rec.Source != store.SourceAPI || !reflect.DeepEqual(rec.Object, want) {
		t.Fatalf("stored web = %+v, %v, %v; want %+v", rec, found, err, want)
	}

	echo := web.DeepCopy()
	echo.ResourceVersion = "6"
	echo.ManagedFields = append(echo.ManagedFields, metav1.ManagedFieldsEntry{Manager: "other", Operation: metav1.ManagedFieldsOperationApply})
	ev(watch.Modified, echo, false)
	lb := echo.DeepCopy()
	lb.ResourceVersion = "7"
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.8"}}
	ev(watch.Modified, lb, true)
	if rec, _, _ := st.Services().Get("default", "web"); rec.Object.Status.LoadBalancer.Ingress[0].IP != "198.51.100.8" {
		t.Fatalf("status not stored: %+v", rec.Object.Status)
	}

	ev(watch.Added, svService("default", "clash", "api-uid"), false)
	ev(watch.Deleted, svService("default", "clash", "api-uid"), false)
	ev(watch.Deleted, svService("default", "clash", "static-uid"), false)
	if rec, found, _ := st.Services().Get("default", "clash"); !found || rec.Source != store.SourceStatic || rec.Object.UID != "static-uid" {
		t.Fatalf("static service touched: %+v %v", rec, found)
	}

	ev(watch.Deleted, svService("default", "web", "other-uid"), false)
	ev(watch.Deleted, svService("default", "web", "u1"), true)
	if _, found, _ := st.Services().Get("default", "web"); found {
		t.Fatal("deleted service still stored")
	}
	if _, err := w.event(watch.Added, &corev1.Pod{}); err == nil {
		t.Fatal("a pod in the services watch is not an error")
	}
}

// The resume version of each watch is written under its own key: after a
// change of a stored object, otherwise at most every rvPersistPeriod, and
// when the loop stops.
func TestServicesResumeVersionWrites(t *testing.T) {
	s, st, clk := pwUnitSyncer(t)
	svc := svServices(s)
	eps := newClusterSync(s, st.EndpointSlices(), clusterKind{resource: endpointSlicesResource, noun: "endpoint slice", logKey: "endpointSlice"})
	stored := func(resource string) string {
		t.Helper()
		rv, err := st.ResumeVersion(resource)
		if err != nil {
			t.Fatal(err)
		}
		return rv
	}
	steps := []struct {
		advance          time.Duration
		w                interface{ progress(string, bool) }
		rv               string
		changed          bool
		wantSvc, wantEPS string
	}{
		{0, svc, "10", false, "", ""},
		{0, svc, "11", true, "11", ""},
		{0, eps, "12", true, "11", "12"},
		{time.Minute, svc, "13", false, "11", "12"},
		{rvPersistPeriod - time.Minute - time.Second, svc, "14", false, "11", "12"},
		{time.Second, svc, "15", false, "15", "12"},
		{0, eps, "16", false, "15", "16"}, // its own period: last written at step 2
		{0, eps, "18", false, "15", "16"},
		{0, svc, "17", false, "15", "16"},
	}
	for i, step := range steps {
		clk.Advance(step.advance)
		step.w.progress(step.rv, step.changed)
		if gs, ge := stored(servicesResource), stored(endpointSlicesResource); gs != step.wantSvc || ge != step.wantEPS {
			t.Fatalf("step %d: stored services %q, endpointslices %q; want %q, %q", i, gs, ge, step.wantSvc, step.wantEPS)
		}
	}
	svc.persist()
	eps.persist()
	if gs, ge := stored(servicesResource), stored(endpointSlicesResource); gs != "17" || ge != "18" {
		t.Fatalf("after persist: stored %q, %q; want 17, 18", gs, ge)
	}
	if rv := stored(podsResource); rv != "" {
		t.Fatalf("pods resume version written: %q", rv)
	}
}

// Run starts the services and endpoint slices watches (the latter with
// its label selector) beside the others, and returns after they stopped.
func TestServicesWatchesStartedByRun(t *testing.T) {
	var mu sync.Mutex
	var reqs []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		reqs = append(reqs, r.URL.Path+"?labelSelector="+r.URL.Query().Get("labelSelector"))
		mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	client, err := NewClient(&rest.Config{Host: srv.URL}, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{NodeName: "n1"}, Deps{Client: client, Store: pwStore(t, "n1"), Clock: clocktest.New(time.Unix(0, 0)), Log: pwLog(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	want := []string{"/api/v1/services?labelSelector=", "/apis/discovery.k8s.io/v1/endpointslices?labelSelector=kubernetes.io/service-name"}
	apiWait.For(t, "both watches' lists", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(reqs, want[0]) && slices.Contains(reqs, want[1]), fmt.Sprintf("requests %q, want both of %q", reqs, want)
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// ---- helpers of the tests against a real API server ----

// svEnv is a real API server with an admin client of every group.
type svEnv struct {
	*pwEnv
	adm *Client
}

// svCounter counts the lists and watches of services and endpoint slices
// a syncer's client makes.
type svCounter struct {
	mu      sync.Mutex
	lists   map[string]int
	watches map[string][]string // resourceVersion of every watch
}

// svPaths maps the request paths of the watches to their resources.
var svPaths = map[string]string{
	"/api/v1/services":                         servicesResource,
	"/apis/discovery.k8s.io/v1/endpointslices": endpointSlicesResource,
}

func (c *svCounter) listsOf(resource string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lists[resource]
}

func (c *svCounter) watchesOf(resource string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.watches[resource])
}

type svTransport struct {
	c    *svCounter
	next http.RoundTripper
}

func (t svTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if res, ok := svPaths[req.URL.Path]; ok && req.Method == http.MethodGet {
		q := req.URL.Query()
		t.c.mu.Lock()
		if q.Get("watch") == "true" || q.Get("watch") == "1" {
			t.c.watches[res] = append(t.c.watches[res], q.Get("resourceVersion"))
		} else {
			t.c.lists[res]++
		}
		t.c.mu.Unlock()
	}
	return t.next.RoundTrip(req)
}

// nodeClient returns a client with node's identity, counting its
// requests.
func (e *svEnv) nodeClient(node string) (*Client, *svCounter) {
	e.t.Helper()
	cfg, err := LoadKubeconfig(e.api.NodeKubeconfig(e.t, node))
	if err != nil {
		e.t.Fatal(err)
	}
	rc := &svCounter{lists: map[string]int{}, watches: map[string][]string{}}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return svTransport{c: rc, next: rt} })
	c, err := NewClient(cfg, "outpost-test")
	if err != nil {
		e.t.Fatal(err)
	}
	return c, rc
}

// syncer returns a Syncer for node n1 with the node's identity.
func (e *svEnv) syncer(st *store.Store, log *slog.Logger) (*Syncer, *svCounter) {
	e.t.Helper()
	c, rc := e.nodeClient("n1")
	s, err := New(Config{NodeName: "n1"}, Deps{Client: c, Store: st, Clock: clock.Real{}, Log: log})
	if err != nil {
		e.t.Fatal(err)
	}
	return s, rc
}

// svRun runs the services and endpoint slices watches of s until the
// returned stop is called (or the test ends); stop returns after both
// did.
func svRun(t *testing.T, s *Syncer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.runServices(ctx) })
	wg.Go(func() { s.runEndpointSlices(ctx) })
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

func (e *svEnv) createNamespace(ns string) {
	e.t.Helper()
	e.do("create namespace "+ns, e.adm.Core.Post().Resource("namespaces").Body(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}), nil)
}

// createService creates ns/name, a NodePort service (with a cluster IP)
// with an external IP and ClientIP affinity, changed by mut.
func (e *svEnv) createService(ns, name string, mut ...func(*corev1.Service)) *corev1.Service {
	e.t.Helper()
	timeout := int32(600)
	local := corev1.ServiceInternalTrafficPolicyLocal
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http")},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(5353)},
			},
			ExternalIPs:           []string{"192.0.2.10"},
			SessionAffinity:       corev1.ServiceAffinityClientIP,
			SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}},
			InternalTrafficPolicy: &local,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
		},
	}
	for _, m := range mut {
		m(svc)
	}
	out := &corev1.Service{}
	e.do("create service "+ns+"/"+name, e.adm.Core.Post().Namespace(ns).Resource("services").Body(svc), out)
	return out
}

func (e *svEnv) getService(ns, name string) *corev1.Service {
	e.t.Helper()
	out := &corev1.Service{}
	e.do("get service "+ns+"/"+name, e.adm.Core.Get().Namespace(ns).Resource("services").Name(name), out)
	return out
}

func (e *svEnv) deleteService(ns, name string) {
	e.t.Helper()
	e.do("delete service "+ns+"/"+name, e.adm.Core.Delete().Namespace(ns).Resource("services").Name(name), nil)
}

// svSlice is an endpoint slice of service in ns with a ready endpoint on
// n1 and one on n2; without service it has no service-name label.
func svSlice(ns, name, service string) *discoveryv1.EndpointSlice {
	yes, no := true, false
	n1, n2 := "n1", "n2"
	port, proto, pname := int32(8080), corev1.ProtocolTCP, "http"
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{
				Addresses:  []string{"10.88.0.5"},
				Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no},
				NodeName:   &n1,
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: service + "-1", UID: "pod-uid-1"},
			},
			{
				Addresses:  []string{"10.88.1.7"},
				Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no},
				NodeName:   &n2,
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: service + "-2", UID: "pod-uid-2"},
			},
		},
		Ports: []discoveryv1.EndpointPort{{Name: &pname, Protocol: &proto, Port: &port}},
	}
	if service != "" {
		sl.Labels = map[string]string{discoveryv1.LabelServiceName: service}
	}
	return sl
}

func (e *svEnv) createSlice(sl *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	e.t.Helper()
	out := &discoveryv1.EndpointSlice{}
	e.do("create endpoint slice "+sl.Namespace+"/"+sl.Name, e.adm.Discovery.Post().Namespace(sl.Namespace).Resource("endpointslices").Body(sl), out)
	return out
}

func (e *svEnv) updateSlice(sl *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	e.t.Helper()
	out := &discoveryv1.EndpointSlice{}
	e.do("update endpoint slice "+sl.Namespace+"/"+sl.Name, e.adm.Discovery.Put().Namespace(sl.Namespace).Resource("endpointslices").Name(sl.Name).Body(sl), out)
	return out
}

func (e *svEnv) deleteSlice(ns, name string) {
	e.t.Helper()
	e.do("delete endpoint slice "+ns+"/"+name, e.adm.Discovery.Delete().Namespace(ns).Resource("endpointslices").Name(name), nil)
}

func svStoredService(t *testing.T, st *store.Store, ns, name string) (store.Record[*corev1.Service], bool) {
	t.Helper()
	rec, found, err := st.Services().Get(ns, name)
	if err != nil {
		t.Fatal(err)
	}
	return rec, found
}

func svStoredSlice(t *testing.T, st *store.Store, ns, name string) (store.Record[*discoveryv1.EndpointSlice], bool) {
	t.Helper()
	rec, found, err := st.EndpointSlices().Get(ns, name)
	if err != nil {
		t.Fatal(err)
	}
	return rec, found
}

// svStoredAs reports whether rec is api as the watch stores it: from the
// API server, with the same encoding as api without type meta,
// resourceVersion and managedFields.
func svStoredAs[P interface {
	store.Object
	runtime.Object
}](rec store.Record[P], found bool, api P) (bool, string) {
	if !found {
		return false, "not stored"
	}
	if rec.Source != store.SourceAPI {
		return false, "stored from " + rec.Source.String()
	}
	if same, err := sameEncoding(rec.Object, stripMeta(api).(P)); err != nil || !same {
		return false, fmt.Sprintf("stored\n%+v\nwant\n%+v (%v)", rec.Object, stripMeta(api), err)
	}
	return true, ""
}

func svResumeVersion(t *testing.T, st *store.Store, resource string) string {
	t.Helper()
	rv, err := st.ResumeVersion(resource)
	if err != nil {
		t.Fatal(err)
	}
	return rv
}

// ---- tests against a real API server, with the node identity ----

// One API server for the services tests, each in its own namespace; the
// 410 test restarts it, so it runs last.
func TestServicesAPIServer(t *testing.T) {
	pe := pwStartAPI(t)
	adm, err := NewClient(pe.api.Config, "outpost-test-admin")
	if err != nil {
		t.Fatal(err)
	}
	e := &svEnv{pwEnv: pe, adm: adm}

	// The node identity may read services, but not endpoint slices,
	// until the binding of packaging/rbac.yaml is applied.
	node, _ := e.nodeClient("n1")
	if err := node.Core.Get().Resource("services").Do(context.Background()).Error(); err != nil {
		t.Fatalf("node lists services without a binding: %v, want allowed", err)
	}
	err = node.Discovery.Get().Resource("endpointslices").Do(context.Background()).Error()
	if !apierrors.IsForbidden(err) {
		t.Fatalf("node lists endpoint slices without a binding: %v, want 403 Forbidden (if this changed, revisit packaging/rbac.yaml and docs/api.md)", err)
	}
	e.api.Kubectl(t, "apply", "-f", "../../packaging/rbac.yaml")
	apiWait.For(e.t, "the binding in effect", func() (bool, string) {
		err := node.Discovery.Get().Resource("endpointslices").Do(context.Background()).Error()
		return err == nil, fmt.Sprint(err)
	})

	for _, tc := range []struct {
		name string
		f    func(*testing.T, *svEnv)
	}{
		{"watch into store", svTestWatchIntoStore},
		{"resume without relist", svTestResume},
		{"expired version relists", svTestExpired},
	} {
		if !t.Run(tc.name, func(t *testing.T) { tc.f(t, &svEnv{pwEnv: &pwEnv{t: t, api: e.api, admin: e.admin}, adm: e.adm}) }) {
			return
		}
	}
}

// A Service (NodePort, with an external IP and ClientIP affinity), a
// LoadBalancer with its status, and an endpoint slice reach the store
// without managedFields and otherwise whole; a slice without the
// service-name label never does; a slice update (an endpoint no longer
// ready) and deletes follow; a change of managedFields alone writes
// nothing; a static Service of the same name is never replaced or
// removed, and the clash is logged. One list of each.
func svTestWatchIntoStore(t *testing.T, e *svEnv) {
	const ns = "sv-watch"
	e.createNamespace(ns)
	st := pwStore(t, "n1")
	static := svService(ns, "clash", "static-uid")
	if err := st.Services().Put(store.SourceStatic, stripMeta(static).(*corev1.Service)); err != nil {
		t.Fatal(err)
	}
	rec := &pwRecorder{}
	s, rc := e.syncer(st, pwLog(t, rec))
	svRun(t, s)

	web := e.createService(ns, "web")
	lb := e.createService(ns, "lb", func(svc *corev1.Service) {
		svc.Spec.Type, svc.Spec.ExternalIPs = corev1.ServiceTypeLoadBalancer, nil
	})
	e.do("set lb's load balancer status", e.adm.Core.Patch(types.MergePatchType).Namespace(ns).Resource("services").Name("lb").SubResource("status").
		Body([]byte(`{"status":{"loadBalancer":{"ingress":[{"ip":"198.51.100.7","ipMode":"VIP"}]}}}`)), lb)
	slice := e.createSlice(svSlice(ns, "web-abc", "web"))
	e.createSlice(svSlice(ns, "unlabelled", ""))
	e.createService(ns, "clash")

	if len(web.ManagedFields) == 0 || len(slice.ManagedFields) == 0 {
		t.Fatalf("the API server set no managedFields (service %d, slice %d): the test would prove nothing", len(web.ManagedFields), len(slice.ManagedFields))
	}
	if len(web.Spec.ClusterIPs) == 0 || web.Spec.Ports[0].NodePort == 0 || len(lb.Status.LoadBalancer.Ingress) != 1 {
		t.Fatalf("API objects lack what the test checks: %+v\n%+v", web.Spec, lb.Status)
	}
	for _, api := range []*corev1.Service{web, lb} {
		apiWait.For(e.t, "service "+api.Name+" stored", func() (bool, string) {
			r, ok := svStoredService(t, st, ns, api.Name)
			return svStoredAs(r, ok, api)
		})
	}
	apiWait.For(e.t, "slice stored", func() (bool, string) {
		r, ok := svStoredSlice(t, st, ns, "web-abc")
		return svStoredAs(r, ok, slice)
	})
	got, _ := svStoredService(t, st, ns, "web")
	if got.Object.ManagedFields != nil || got.Object.Spec.SessionAffinityConfig == nil || *got.Object.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds != 600 ||
		!reflect.DeepEqual(got.Object.Spec.ExternalIPs, []string{"192.0.2.10"}) || got.Object.Spec.Ports[0].NodePort != web.Spec.Ports[0].NodePort ||
		!reflect.DeepEqual(got.Object.Spec.ClusterIPs, web.Spec.ClusterIPs) || *got.Object.Spec.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyLocal {
		t.Fatalf("stored service web = %+v", got.Object)
	}
	gotLB, _ := svStoredService(t, st, ns, "lb")
	if ing := gotLB.Object.Status.LoadBalancer.Ingress; len(ing) != 1 || ing[0].IP != "198.51.100.7" || gotLB.Object.ManagedFields != nil {
		t.Fatalf("stored service lb = %+v", gotLB.Object)
	}
	gotSlice, _ := svStoredSlice(t, st, ns, "web-abc")
	if ep := gotSlice.Object.Endpoints; gotSlice.Object.ManagedFields != nil || gotSlice.Object.Labels[discoveryv1.LabelServiceName] != "web" ||
		len(ep) != 2 || *ep[0].NodeName != "n1" || ep[0].TargetRef.Name != "web-1" || !*ep[0].Conditions.Ready || len(gotSlice.Object.Ports) != 1 {
		t.Fatalf("stored slice = %+v", gotSlice.Object)
	}
	apiWait.For(e.t, "the name clash logged", func() (bool, string) {
		return rec.find(map[string]string{"msg": "api service not stored: a service of another source has its name", "service": ns + "/clash"}), "no log"
	})
	if r, _ := svStoredService(t, st, ns, "clash"); r.Source != store.SourceStatic || r.Object.UID != "static-uid" {
		t.Fatalf("static service replaced by the API's: %+v", r)
	}

	// managedFields alone (another manager applies the same value):
	// seen, and nothing written.
	before, _ := svStoredService(t, st, ns, "web")
	applied := &corev1.Service{}
	e.do("apply to web as another manager", e.adm.Core.Patch(types.ApplyPatchType).Namespace(ns).Resource("services").Name("web").Param("fieldManager", "other").
		Body([]byte(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"`+ns+`"},"spec":{"sessionAffinity":"ClientIP"}}`)), applied)
	if applied.ResourceVersion == web.ResourceVersion || len(applied.ManagedFields) <= len(web.ManagedFields) {
		t.Fatalf("apply changed no managedFields (rv %s -> %s): the test would prove nothing", web.ResourceVersion, applied.ResourceVersion)
	}
	apiWait.For(e.t, "managedFields change seen", func() (bool, string) {
		return rec.find(map[string]string{"msg": "service event", "service": ns + "/web", "resourceVersion": applied.ResourceVersion, "changed": "false"}), "no log"
	})
	after, _ := svStoredService(t, st, ns, "web")
	if same, err := sameEncoding(before.Object, after.Object); err != nil || !same {
		t.Fatalf("stored service changed by a managedFields change: %+v -> %+v", before.Object, after.Object)
	}

	// An endpoint stops being ready (its pod terminates).
	f, tr := false, true
	upd := slice.DeepCopy()
	upd.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: &f, Serving: &tr, Terminating: &tr}
	upd = e.updateSlice(upd)
	apiWait.For(e.t, "slice update stored", func() (bool, string) {
		r, ok := svStoredSlice(t, st, ns, "web-abc")
		return svStoredAs(r, ok, upd)
	})
	if r, _ := svStoredSlice(t, st, ns, "web-abc"); *r.Object.Endpoints[0].Conditions.Ready || !*r.Object.Endpoints[0].Conditions.Terminating {
		t.Fatalf("stored endpoint conditions %+v", r.Object.Endpoints[0].Conditions)
	}

	e.deleteSlice(ns, "web-abc")
	e.deleteService(ns, "web")
	e.deleteService(ns, "clash")
	apiWait.For(e.t, "web and its slice removed", func() (bool, string) {
		_, okSvc := svStoredService(t, st, ns, "web")
		_, okSlice := svStoredSlice(t, st, ns, "web-abc")
		return !okSvc && !okSlice, fmt.Sprintf("service stored %v, slice stored %v", okSvc, okSlice)
	})
	// A later object is seen, so the events before it were.
	e.createService(ns, "last")
	apiWait.For(e.t, "service last stored", func() (bool, string) { _, ok := svStoredService(t, st, ns, "last"); return ok, "not stored" })
	if r, ok := svStoredService(t, st, ns, "clash"); !ok || r.Source != store.SourceStatic || r.Object.UID != "static-uid" {
		t.Fatalf("static service touched by the API service's delete: %+v %v", r, ok)
	}
	if _, ok := svStoredSlice(t, st, ns, "unlabelled"); ok {
		t.Fatal("slice without the service-name label stored")
	}
	if _, ok := svStoredService(t, st, ns, "lb"); !ok {
		t.Fatal("service lb lost")
	}
	for _, res := range []string{servicesResource, endpointSlicesResource} {
		if n := rc.listsOf(res); n != 1 {
			t.Fatalf("%d lists of %s, want 1", n, res)
		}
	}
}

// A restarted syncer watches each resource from its stored
// resourceVersion without listing, and still sees what happened while it
// was stopped: objects created, changed and deleted meanwhile.
func svTestResume(t *testing.T, e *svEnv) {
	const ns = "sv-resume"
	e.createNamespace(ns)
	st := pwStore(t, "n1")
	s1, rc1 := e.syncer(st, pwLog(t, nil))
	stop := svRun(t, s1)
	e.createService(ns, "old")
	e.createSlice(svSlice(ns, "old-1", "old"))
	e.createService(ns, "keep")
	keep := e.createSlice(svSlice(ns, "keep-1", "keep"))
	apiWait.For(e.t, "first objects stored", func() (bool, string) {
		_, a := svStoredService(t, st, ns, "old")
		_, b := svStoredSlice(t, st, ns, "old-1")
		r, _ := svStoredSlice(t, st, ns, "keep-1")
		ok, why := svStoredAs(r, true, keep)
		return a && b && ok, fmt.Sprintf("old %v, old-1 %v, keep-1: %s", a, b, why)
	})
	stop()
	for _, res := range []string{servicesResource, endpointSlicesResource} {
		if n := rc1.listsOf(res); n != 1 {
			t.Fatalf("first syncer: %d lists of %s, want 1", n, res)
		}
	}
	rvSvc, rvEPS := svResumeVersion(t, st, servicesResource), svResumeVersion(t, st, endpointSlicesResource)
	if rvSvc == "" || rvEPS == "" {
		t.Fatalf("resume versions %q, %q stored, want both", rvSvc, rvEPS)
	}

	e.createService(ns, "new")
	e.createSlice(svSlice(ns, "new-1", "new"))
	e.deleteService(ns, "old")
	e.deleteSlice(ns, "old-1")
	f := false
	keep.Endpoints[1].Conditions.Ready = &f
	keep = e.updateSlice(keep)

	s2, rc2 := e.syncer(st, pwLog(t, nil))
	svRun(t, s2)
	apiWait.For(e.t, "store converged", func() (bool, string) {
		_, newSvc := svStoredService(t, st, ns, "new")
		_, newSlice := svStoredSlice(t, st, ns, "new-1")
		_, oldSvc := svStoredService(t, st, ns, "old")
		_, oldSlice := svStoredSlice(t, st, ns, "old-1")
		r, found := svStoredSlice(t, st, ns, "keep-1")
		ok, why := svStoredAs(r, found, keep)
		return newSvc && newSlice && !oldSvc && !oldSlice && ok,
			fmt.Sprintf("new %v/%v, old %v/%v, keep-1: %s", newSvc, newSlice, oldSvc, oldSlice, why)
	})
	for res, rv := range map[string]string{servicesResource: rvSvc, endpointSlicesResource: rvEPS} {
		if n := rc2.listsOf(res); n != 0 {
			t.Errorf("restarted syncer listed %s %d times, want 0", res, n)
		}
		if w := rc2.watchesOf(res); len(w) == 0 || w[0] != rv {
			t.Errorf("restarted syncer's %s watches from %q, want the first from %q", res, w, rv)
		}
	}
}

// After a restart of the API server (its watch cache starts anew, as after
// etcd compacted the stored versions) the stored resourceVersions are
// answered with 410 Gone: the syncer relists each resource once and
// reconciles, so objects deleted while it was away are removed, the
// others kept, and the static Service of the same name untouched.
func svTestExpired(t *testing.T, e *svEnv) {
	const ns = "sv-expire"
	e.createNamespace(ns)
	st := pwStore(t, "n1")
	static := svService(ns, "clash", "static-uid")
	if err := st.Services().Put(store.SourceStatic, stripMeta(static).(*corev1.Service)); err != nil {
		t.Fatal(err)
	}
	s1, _ := e.syncer(st, pwLog(t, nil))
	stop := svRun(t, s1)
	e.createService(ns, "gone")
	e.createSlice(svSlice(ns, "gone-1", "gone"))
	e.createService(ns, "stays")
	e.createSlice(svSlice(ns, "stays-1", "stays"))
	e.createService(ns, "clash")
	apiWait.For(e.t, "first objects stored", func() (bool, string) {
		_, a := svStoredService(t, st, ns, "gone")
		_, b := svStoredSlice(t, st, ns, "gone-1")
		_, c := svStoredService(t, st, ns, "stays")
		_, d := svStoredSlice(t, st, ns, "stays-1")
		return a && b && c && d, fmt.Sprint(a, b, c, d)
	})
	stop()
	rvSvc, rvEPS := svResumeVersion(t, st, servicesResource), svResumeVersion(t, st, endpointSlicesResource)

	e.deleteService(ns, "gone")
	e.deleteSlice(ns, "gone-1")
	e.api.Stop()
	e.api.Start(t)

	rec := &pwRecorder{}
	s2, rc := e.syncer(st, pwLog(t, rec))
	svRun(t, s2)
	apiWait.For(e.t, "deleted objects removed", func() (bool, string) {
		_, a := svStoredService(t, st, ns, "gone")
		_, b := svStoredSlice(t, st, ns, "gone-1")
		return !a && !b, fmt.Sprintf("service stored %v, slice stored %v", a, b)
	})
	for _, c := range []struct{ res, rv string }{{servicesResource, rvSvc}, {endpointSlicesResource, rvEPS}} {
		if !rec.find(map[string]string{"msg": "watch resourceVersion expired; relisting", "watch": c.res + " of all namespaces", "resourceVersion": c.rv}) {
			t.Errorf("no 410 relist of %s from %s logged", c.res, c.rv)
		}
		if w := rc.watchesOf(c.res); len(w) == 0 || w[0] != c.rv {
			t.Errorf("%s watches from %q, want the first from the stored %s", c.res, w, c.rv)
		}
		if n := rc.listsOf(c.res); n != 1 {
			t.Errorf("%d lists of %s, want 1", n, c.res)
		}
	}
	if _, ok := svStoredService(t, st, ns, "stays"); !ok {
		t.Error("service stays removed by the relist")
	}
	if _, ok := svStoredSlice(t, st, ns, "stays-1"); !ok {
		t.Error("slice stays-1 removed by the relist")
	}
	if r, ok := svStoredService(t, st, ns, "clash"); !ok || r.Source != store.SourceStatic || r.Object.UID != "static-uid" {
		t.Errorf("static service touched by the relist: %+v %v", r, ok)
	}
	apiWait.For(e.t, "new resume versions stored", func() (bool, string) {
		a, b := svResumeVersion(t, st, servicesResource), svResumeVersion(t, st, endpointSlicesResource)
		return a != rvSvc && b != rvEPS, a + " " + b
	})
}
