package bridge

import (
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"

	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/sync/kube"
	"github.com/outpost-edge/outpost/sync/mqtt"
)

// leaseServer is the Leases of one namespace as an API server keeps
// them (resourceVersions, conflicts); every other request is refused.
type leaseServer struct {
	mu     sync.Mutex
	leases map[string]*coordv1.Lease
	rv     int
	// delay holds every answer back; lose applies the next n updates
	// but answers them with an error, as when an answer is lost.
	delay time.Duration
	lose  int
	// failList answers every list with an error.
	failList bool
}

func (ls *leaseServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	time.Sleep(ls.delay)
	const prefix = "/apis/coordination.k8s.io/v1/namespaces/outpost-system/leases"
	rest, ok := strings.CutPrefix(r.URL.Path, prefix)
	if !ok {
		http.Error(w, "not here", http.StatusNotFound)
		return
	}
	name := strings.TrimPrefix(rest, "/")
	ls.mu.Lock()
	defer ls.mu.Unlock()
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	var in coordv1.Lease
	if r.Method == http.MethodPost || r.Method == http.MethodPut {
		body, _ := io.ReadAll(r.Body)
		codecs := serializer.NewCodecFactory(kube.Scheme())
		if _, _, err := codecs.UniversalDeserializer().Decode(body, nil, &in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	var out runtime.Object
	var fail *apierrors.StatusError
	switch {
	case r.Method == http.MethodGet && name == "" && ls.failList:
		fail = apierrors.NewTimeoutError("the list took too long", 0)
	case r.Method == http.MethodGet && name == "":
		list := &coordv1.LeaseList{}
		for _, l := range ls.leases {
			list.Items = append(list.Items, *l)
		}
		out = list
	case r.Method == http.MethodGet:
		if l := ls.leases[name]; l != nil {
			out = l
		} else {
			fail = apierrors.NewNotFound(gr, name)
		}
	case r.Method == http.MethodPost:
		if ls.leases[in.Name] != nil {
			fail = apierrors.NewAlreadyExists(gr, in.Name)
			break
		}
		ls.rv++
		in.ResourceVersion = strconv.Itoa(ls.rv)
		ls.leases[in.Name] = &in
		out = &in
	case r.Method == http.MethodPut:
		cur := ls.leases[name]
		if cur == nil {
			fail = apierrors.NewNotFound(gr, name)
			break
		}
		if in.ResourceVersion != cur.ResourceVersion {
			fail = apierrors.NewConflict(gr, name, nil)
			break
		}
		ls.rv++
		in.ResourceVersion = strconv.Itoa(ls.rv)
		ls.leases[name] = &in
		out = &in
		if ls.lose > 0 {
			ls.lose--
			fail = apierrors.NewInternalError(errors.New("answer lost"))
		}
	case r.Method == http.MethodDelete:
		delete(ls.leases, name)
		out = &coordv1.Lease{}
	}
	w.Header().Set("Content-Type", "application/json")
	if fail != nil {
		w.WriteHeader(int(fail.ErrStatus.Code))
		json.NewEncoder(w).Encode(fail.ErrStatus)
		return
	}
	json.NewEncoder(w).Encode(out)
}

// handTo writes Lease name as another replica holding it, id.
func (ls *leaseServer) handTo(name, id string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.leases[name].Spec.HolderIdentity = &id
	ls.rv++
	ls.leases[name].ResourceVersion = strconv.Itoa(ls.rv)
}

// withAPI gives b an API server (h) and a scratch directory.
func withAPI(t *testing.T, b *Bridge, h http.Handler) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	client, err := kube.NewClient(&rest.Config{Host: srv.URL}, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	b.deps.Client = client
	b.cfg.Dir = t.TempDir()
	if err := os.MkdirAll(filepath.Join(b.cfg.Dir, "nodes"), 0o700); err != nil {
		t.Fatal(err)
	}
}

// shardTest is a replica's sharder over a leaseServer, its bridge
// serving no node (the API server has none).
func shardTest(t *testing.T, shards int) (*sharder, *leaseServer) {
	t.Helper()
	b, st, _ := testBridge(t)
	ls := &leaseServer{leases: map[string]*coordv1.Lease{}}
	withAPI(t, b, ls)
	b.cfg.Shards, b.cfg.Identity, b.cfg.Namespace = shards, "bridge-a", "outpost-system"
	b.cluster = &publisher{b: b, scope: mqtt.ScopeCluster, st: st, wake: make(chan struct{}, 1)}
	runFor(t, b)
	return newSharder(b), ls
}

// A round renews the shards held from the Lease as last written, with
// no list: a replica whose lists fail (an API server slowed by the
// fleet's own writes timed them out) keeps its shards as long as their
// renewals go through. It used to renew only after a list, and dropped
// every shard once lists had failed for giveUp.
func TestShardsRenewedWhenListsFail(t *testing.T) {
	s, ls := shardTest(t, 8)
	s.tick(t.Context())
	if len(s.held) != 8 {
		t.Fatalf("a lone replica holds %d of 8 shards", len(s.held))
	}
	ls.mu.Lock()
	ls.failList = true
	ls.mu.Unlock()
	clk := s.b.deps.Clock.(*clocktest.Fake)
	since := clk.Now()
	for range 4 { // 8 s, past giveUp
		clk.Advance(RenewInterval)
		s.tick(t.Context())
		if len(s.held) != 8 {
			t.Fatalf("%v after the lists began to fail, this replica holds %d of 8 shards", clk.Now().Sub(since), len(s.held))
		}
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for name, l := range ls.leases {
		if holder(l) != "bridge-a" || !l.Spec.RenewTime.Time.Equal(clk.Now()) {
			t.Errorf("lease %s: holder %q renewed %v, want bridge-a at %v", name, holder(l), l.Spec.RenewTime, clk.Now())
		}
	}
}

// A renewal the API server applied but whose answer was lost leaves the
// replica with an old resourceVersion: the next renewal conflicts, finds
// the Lease still its own, and renews it, and the shard stays held. A
// shard another replica holds is lost.
func TestLostAnswerKeepsTheShard(t *testing.T) {
	s, ls := shardTest(t, 2)
	s.tick(t.Context())
	if len(s.held) != 2 {
		t.Fatalf("a lone replica holds %d of 2 shards", len(s.held))
	}
	clk := s.b.deps.Clock.(*clocktest.Fake)
	ls.mu.Lock()
	ls.lose = 3 // both shards' and the member Lease's renewals
	ls.mu.Unlock()
	clk.Advance(RenewInterval)
	s.tick(t.Context())
	clk.Advance(RenewInterval)
	s.tick(t.Context())
	if len(s.held) != 2 {
		t.Fatalf("after lost answers this replica holds %d of 2 shards", len(s.held))
	}
	ls.mu.Lock()
	for _, l := range ls.leases {
		if !l.Spec.RenewTime.Time.Equal(clk.Now()) {
			t.Errorf("lease %s renewed at %v, want %v", l.Name, l.Spec.RenewTime, clk.Now())
		}
	}
	ls.mu.Unlock()
	ls.handTo(shardPrefix+"1", "bridge-b")
	clk.Advance(RenewInterval)
	s.tick(t.Context())
	if s.held[1] != nil || s.held[0] == nil {
		t.Errorf("held %v after shard 1 went to another replica; want only shard 0", slices.Sorted(maps.Keys(s.held)))
	}
}

// A take whose answer was lost (the write applied, the answer an error)
// leaves a Lease that names this replica: the next round takes it as its
// own, rather than waiting for it to expire. The fleet benchmark saw a
// take time out under load and the shard's thousand-odd nodes start 10 s
// later than the others.
func TestLostTakeIsTakenNextRound(t *testing.T) {
	s, ls := shardTest(t, 2)
	s.tick(t.Context())
	clk := s.b.deps.Clock.(*clocktest.Fake)
	ls.handTo(shardPrefix+"1", "bridge-b")
	clk.Advance(RenewInterval)
	s.tick(t.Context())
	if s.held[1] != nil {
		t.Fatal("shard 1 still held after another replica took it")
	}
	// bridge-b dies: its Lease expires, and this replica's take of it
	// is applied but its answer lost (after the two renewals, lost too).
	for range LeaseDuration/RenewInterval - 1 {
		clk.Advance(RenewInterval)
		s.tick(t.Context())
	}
	if s.held[1] != nil {
		t.Fatal("shard 1 taken before its Lease expired")
	}
	ls.mu.Lock()
	ls.lose = 3
	ls.mu.Unlock()
	clk.Advance(RenewInterval)
	s.tick(t.Context())
	ls.mu.Lock()
	h := holder(ls.leases[shardPrefix+"1"])
	ls.mu.Unlock()
	if s.held[1] != nil || h != "bridge-a" {
		t.Fatalf("held %v, shard 1's holder %q: want the take applied and its answer lost", slices.Sorted(maps.Keys(s.held)), h)
	}
	clk.Advance(RenewInterval)
	s.tick(t.Context())
	if s.held[1] == nil || s.held[0] == nil {
		t.Errorf("held %v a round after the lost answer; want both shards", slices.Sorted(maps.Keys(s.held)))
	}
}

// A replica that reads another's Leases knows when each expires as it
// saw it (nextExpiry, for run's timer), and takes it at that moment.
func TestShardTakenWhenItExpires(t *testing.T) {
	s, ls := shardTest(t, 2)
	clk := s.b.deps.Clock.(*clocktest.Fake)
	other := "bridge-b"
	dur := int32(LeaseDuration / time.Second)
	renewed := metav1.NewMicroTime(clk.Now())
	ls.mu.Lock()
	for _, name := range []string{shardPrefix + "0", shardPrefix + "1", memberPfx + other} {
		kind := "shard"
		if strings.HasPrefix(name, memberPfx) {
			kind = "member"
		}
		ls.rv++
		ls.leases[name] = &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "outpost-system", ResourceVersion: strconv.Itoa(ls.rv), Labels: map[string]string{leaseLabel: kind}},
			Spec:       coordv1.LeaseSpec{HolderIdentity: &other, LeaseDurationSeconds: &dur, RenewTime: &renewed},
		}
	}
	ls.mu.Unlock()
	holders := func() []string {
		ls.mu.Lock()
		defer ls.mu.Unlock()
		return []string{holder(ls.leases[shardPrefix+"0"]), holder(ls.leases[shardPrefix+"1"])}
	}

	s.tick(t.Context())
	if d, ok := s.nextExpiry(clk.Now()); !ok || d != LeaseDuration {
		t.Fatalf("next expiry %v %v just after seeing the Leases, want %v", d, ok, LeaseDuration)
	}
	// bridge-b renews nothing more (it died).
	clk.Advance(300 * time.Millisecond)
	s.tick(t.Context())
	if d, ok := s.nextExpiry(clk.Now()); !ok || d != LeaseDuration-300*time.Millisecond {
		t.Fatalf("next expiry %v %v, want %v", d, ok, LeaseDuration-300*time.Millisecond)
	}
	clk.Advance(LeaseDuration - 300*time.Millisecond - time.Millisecond)
	s.tick(t.Context())
	if h := holders(); h[0] != other || h[1] != other {
		t.Fatalf("shards taken before they expired: holders %v", h)
	}
	clk.Advance(time.Millisecond)
	s.tick(t.Context())
	if h := holders(); h[0] != "bridge-a" || h[1] != "bridge-a" {
		t.Fatalf("shards not taken when they expired: holders %v", h)
	}
	if _, ok := s.nextExpiry(clk.Now()); ok {
		t.Error("a next expiry with no Lease held by another replica")
	}
}

// The held Leases are renewed at every other tick (a tick a second),
// also when that tick starts a little earlier than two seconds after the
// renewal before; not at the ticks between.
func TestShardsRenewedEveryOtherTick(t *testing.T) {
	s, ls := shardTest(t, 2)
	clk := s.b.deps.Clock.(*clocktest.Fake)
	s.tick(t.Context())
	renewedAt := func() time.Time {
		ls.mu.Lock()
		defer ls.mu.Unlock()
		return ls.leases[shardPrefix+"0"].Spec.RenewTime.Time
	}
	if len(s.held) != 2 {
		t.Fatalf("a lone replica holds %d of 2 shards", len(s.held))
	}
	first := renewedAt()
	clk.Advance(observeEvery)
	s.tick(t.Context())
	if got := renewedAt(); !got.Equal(first) {
		t.Errorf("renewed %v after the last renewal, at the tick between", got.Sub(first))
	}
	clk.Advance(RenewInterval - observeEvery - 100*time.Millisecond)
	s.tick(t.Context())
	if got := renewedAt(); !got.Equal(clk.Now()) {
		t.Errorf("not renewed at the tick %v after the last renewal", clk.Now().Sub(first))
	}
}
