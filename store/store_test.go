package store

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func openTemp(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), FileName), Options{NodeName: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Check(); err != nil {
			t.Errorf("consistency check: %v", err)
		}
		s.Close()
	})
	return s
}

func pod(ns, name, image string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}},
	}
}

func TestPodsPutGetListDelete(t *testing.T) {
	s := openTemp(t)
	if err := s.Pods().Put(SourceStatic, pod("default", "web", "busybox")); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := s.Pods().Get("default", "web")
	if err != nil || !ok {
		t.Fatalf("get: ok=%v err=%v", ok, err)
	}
	if rec.Source != SourceStatic || rec.Object.Spec.Containers[0].Image != "busybox" {
		t.Fatalf("got %v %+v", rec.Source, rec.Object.Spec)
	}
	if err := s.Pods().Put(SourceAPI, pod("default", "db", "postgres")); err != nil {
		t.Fatal(err)
	}
	list, err := s.Pods().List()
	if err != nil || len(list) != 2 || list[0].Object.Name != "db" || list[1].Object.Name != "web" {
		t.Fatalf("list = %v, %v", list, err)
	}
	if found, err := s.Pods().Delete("default", "web"); !found || err != nil {
		t.Fatalf("delete: %v %v", found, err)
	}
	if _, ok, _ := s.Pods().Get("default", "web"); ok {
		t.Fatal("deleted pod still there")
	}
}

func TestPutRefusesAnotherSourcesObject(t *testing.T) {
	s := openTemp(t)
	if err := s.Pods().Put(SourceStatic, pod("kube-system", "dns", "a")); err != nil {
		t.Fatal(err)
	}
	err := s.Pods().Put(SourceAPI, pod("kube-system", "dns", "b"))
	if !errors.Is(err, ErrSourceConflict) || !strings.Contains(err.Error(), "kube-system/dns") {
		t.Fatalf("err = %v, want source conflict naming the pod", err)
	}
	rec, _, _ := s.Pods().Get("kube-system", "dns")
	if rec.Object.Spec.Containers[0].Image != "a" {
		t.Fatal("conflicting put replaced the stored pod")
	}
}

func TestReplaceTouchesOnlyItsSource(t *testing.T) {
	s := openTemp(t)
	must(t, s.Pods().Put(SourceStatic, pod("default", "old", "x")))
	must(t, s.Pods().Put(SourceStatic, pod("default", "keep", "x")))
	must(t, s.Pods().Put(SourceAPI, pod("default", "api", "x")))
	n, err := s.Pods().Replace(SourceStatic, []*corev1.Pod{pod("default", "keep", "x"), pod("default", "new", "y")})
	if err != nil || n != 2 {
		t.Fatalf("replace changed %d, err %v; want 2 (delete old, add new)", n, err)
	}
	var names []string
	list, _ := s.Pods().List()
	for _, r := range list {
		names = append(names, r.Source.String()+":"+r.Object.Name)
	}
	if got, want := strings.Join(names, ","), "api:api,static:keep,static:new"; got != want {
		t.Fatalf("after replace: %s, want %s", got, want)
	}
	// The same set again changes nothing and commits no transaction.
	before := lastTxID(t, s)
	if n, err := s.Pods().Replace(SourceStatic, []*corev1.Pod{pod("default", "keep", "x"), pod("default", "new", "y")}); n != 0 || err != nil {
		t.Fatalf("idempotent replace changed %d, err %v", n, err)
	}
	if after := lastTxID(t, s); after != before {
		t.Fatalf("idempotent replace committed a transaction (txid %d -> %d)", before, after)
	}
	// A name owned by another source is skipped, also when nothing else
	// changes, and the rest still written.
	if _, err := s.Pods().Replace(SourceStatic, []*corev1.Pod{pod("default", "api", "z"), pod("default", "keep", "x"), pod("default", "new", "y")}); !errors.Is(err, ErrSourceConflict) {
		t.Fatalf("replace with only a conflict: err %v, want ErrSourceConflict", err)
	}
	n, err = s.Pods().Replace(SourceStatic, []*corev1.Pod{pod("default", "api", "z"), pod("default", "keep", "x")})
	if !errors.Is(err, ErrSourceConflict) || n != 1 {
		t.Fatalf("replace with conflict: changed %d, err %v", n, err)
	}
}

// TestReplaceFindsItsSourceWithoutReadingAll: Replace for a source other
// than the API server's finds that source's stale records from the keys
// the store keeps of it, also those from before a reopen and those
// deleted and put again, and keeps no keys of the API server's.
func TestReplaceFindsItsSourceWithoutReadingAll(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s, err := Open(path, Options{NodeName: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	must(t, s.Pods().Put(SourceStatic, pod("default", "a", "x")))
	must(t, s.Pods().Put(SourceStatic, pod("default", "b", "x")))
	for i := range 50 {
		must(t, s.Pods().Put(SourceAPI, pod("default", "api"+strconv.Itoa(i), "x")))
	}
	s.Close()
	if s, err = Open(path, Options{NodeName: "node-a"}); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	names := func() string {
		t.Helper()
		var out []string
		list, err := s.Pods().List()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range list {
			if r.Source == SourceStatic {
				out = append(out, r.Object.Name)
			}
		}
		return strings.Join(out, ",")
	}
	if n, err := s.Pods().Replace(SourceStatic, []*corev1.Pod{pod("default", "b", "x")}); err != nil || n != 1 || names() != "b" {
		t.Fatalf("after a reopen, Replace([b]) changed %d (err %v), static pods %q; want a deleted", n, err, names())
	}
	if _, err := s.Pods().Delete("default", "b"); err != nil {
		t.Fatal(err)
	}
	must(t, s.Pods().Put(SourceStatic, pod("default", "b", "y")))
	must(t, s.Pods().Put(SourceStatic, pod("default", "c", "y")))
	if n, err := s.Pods().Replace(SourceStatic, nil); err != nil || n != 2 || names() != "" {
		t.Fatalf("Replace(none) changed %d (err %v), static pods %q; want b and c deleted", n, err, names())
	}
	// The keys of deleted records go at the next write that finds them
	// gone.
	if n, err := s.Pods().Replace(SourceStatic, []*corev1.Pod{pod("default", "d", "y")}); err != nil || n != 1 || names() != "d" {
		t.Fatalf("Replace([d]) changed %d (err %v), static pods %q", n, err, names())
	}
	if keys, _ := s.Pods().KeysFrom(SourceStatic); !slices.Equal(keys, []string{"default/d"}) {
		t.Errorf("keys kept of static pods: %q, want default/d", keys)
	}
	if keys, ok := s.Pods().KeysFrom(SourceAPI); ok || keys != nil {
		t.Errorf("KeysFrom(SourceAPI) = %q, %v; the API server's keys are not kept apart", keys, ok)
	}
	if len(s.srcKeys[KindPod][SourceAPI]) != 0 {
		t.Errorf("keys kept of the API server's pods: %d", len(s.srcKeys[KindPod][SourceAPI]))
	}
}

// lastTxID is the id of the store's last committed write transaction.
func lastTxID(t *testing.T, s *Store) int {
	t.Helper()
	var id int
	if err := s.db.View(func(tx *bolt.Tx) error { id = tx.ID(); return nil }); err != nil {
		t.Fatal(err)
	}
	return id
}

func TestNotificationsCoalescePerKind(t *testing.T) {
	s := openTemp(t)
	pods, cancel := s.Subscribe(KindPod)
	defer cancel()
	svcs, cancel2 := s.Subscribe(KindService)
	defer cancel2()
	for i := range 5 {
		must(t, s.Pods().Put(SourceAPI, pod("default", "p"+strconv.Itoa(i), "x")))
	}
	select {
	case <-pods:
	default:
		t.Fatal("no pod notification")
	}
	select {
	case <-pods:
		t.Fatal("five writes gave more than one pending notification")
	default:
	}
	select {
	case <-svcs:
		t.Fatal("service subscriber notified of pod writes")
	default:
	}
	// An identical write is not a change.
	must(t, s.Pods().Put(SourceAPI, pod("default", "p0", "x")))
	select {
	case <-pods:
		t.Fatal("notified of a write that changed nothing")
	default:
	}
}

func TestJournalLastValueWins(t *testing.T) {
	s := openTemp(t)
	_, err := s.Append("pod/default/web", []byte("Pending"))
	must(t, err)
	seq2, err := s.Append("pod/default/web", []byte("Running"))
	must(t, err)
	_, err = s.Append("node/node-a", []byte("Ready"))
	must(t, err)
	pend, err := s.Pending(0, 0)
	must(t, err)
	if len(pend) != 2 || pend[0].Key != "pod/default/web" || string(pend[0].Value) != "Running" || pend[0].Seq != seq2 {
		t.Fatalf("pending = %+v; the superseded Pending must never be offered", pend)
	}
	// A sink read Running; before it acks, a newer status arrives.
	_, err = s.Append("pod/default/web", []byte("Failed"))
	must(t, err)
	if removed, err := s.Ack(pend[0]); removed || err != nil {
		t.Fatalf("ack of superseded entry removed=%v err=%v; the newer one must stay", removed, err)
	}
	if removed, err := s.Ack(pend[1]); !removed || err != nil {
		t.Fatalf("ack of current entry removed=%v err=%v", removed, err)
	}
	pend, _ = s.Pending(0, 0)
	if len(pend) != 1 || string(pend[0].Value) != "Failed" {
		t.Fatalf("pending after acks = %+v", pend)
	}
	if n, _ := s.Backlog(); n != 1 {
		t.Fatalf("backlog = %d", n)
	}
	if more, _ := s.Pending(pend[0].Seq, 0); len(more) != 0 {
		t.Fatalf("pending after last seq = %+v", more)
	}
}

func TestIPAMAndRestartState(t *testing.T) {
	s := openTemp(t)
	must(t, s.Reserve("10.42.0.2", "uid-a"))
	must(t, s.Reserve("10.42.0.2", "uid-a"))
	if err := s.Reserve("10.42.0.2", "uid-b"); err == nil || !strings.Contains(err.Error(), "held by uid-a") {
		t.Fatalf("double allocation: %v", err)
	}
	freed, err := s.Release("uid-a")
	if err != nil || len(freed) != 1 {
		t.Fatalf("release: %v %v", freed, err)
	}
	st := RestartState{Count: 3, LastExitCode: 1, BackoffUntil: time.Unix(100, 0).UTC()}
	must(t, s.PutRestart("uid-a", "web", st))
	must(t, s.PutRestart("uid-a", "side", st))
	got, ok, err := s.Restart("uid-a", "web")
	if err != nil || !ok || got.Count != 3 || !got.BackoffUntil.Equal(st.BackoffUntil) {
		t.Fatalf("restart state = %+v %v %v", got, ok, err)
	}
	must(t, s.DeleteRestarts("uid-a"))
	if _, ok, _ := s.Restart("uid-a", "side"); ok {
		t.Fatal("restart state survived DeleteRestarts")
	}
}

func TestResumeVersionsAndMeta(t *testing.T) {
	s := openTemp(t)
	must(t, s.SetResumeVersion("pods", "1234"))
	m, err := s.Meta()
	must(t, err)
	if m.Schema != SchemaVersion || m.NodeName != "node-a" || m.ResumeVersions["pods"] != "1234" {
		t.Fatalf("meta = %+v", m)
	}
}

func TestOpenLockedNamesHolderWithinTimeout(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s, err := Open(path, Options{})
	must(t, err)
	defer s.Close()
	start := time.Now()
	_, err = Open(path, Options{LockTimeout: 200 * time.Millisecond})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("err = %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) || !strings.Contains(err.Error(), path) {
		t.Fatalf("error does not name the file and the holder: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("locked open took %v", d)
	}
}

func TestOpenCorruptRefusesAndKeepsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	garbage := []byte(strings.Repeat("not a bolt file ", 2048))
	must(t, os.WriteFile(path, garbage, 0o600))
	_, err := Open(path, Options{})
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "mv ") {
		t.Fatalf("err = %v, want ErrCorrupt naming the file and how to recover", err)
	}
	after, _ := os.ReadFile(path)
	if string(after) != string(garbage) {
		t.Fatal("corrupt file was modified")
	}
}

func TestOpenNewerSchemaRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s, err := Open(path, Options{})
	must(t, err)
	must(t, s.Pods().Put(SourceStatic, pod("default", "web", "x")))
	must(t, s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keySchema, []byte(strconv.Itoa(SchemaVersion+1)))
	}))
	s.Close()
	_, err = Open(path, Options{})
	if !errors.Is(err, ErrSchemaTooNew) || !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v, want ErrSchemaTooNew naming the file", err)
	}
	// Nothing was lost: a read-only open with the check still sees the pod.
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	must(t, err)
	defer db.Close()
	must(t, db.View(func(tx *bolt.Tx) error {
		if tx.Bucket([]byte(KindPod)).Get([]byte("default/web")) == nil {
			t.Error("pod lost after refused open")
		}
		return nil
	}))
}

func TestReadOnlyOpenSeesData(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s, err := Open(path, Options{NodeName: "n"})
	must(t, err)
	must(t, s.Pods().Put(SourceStatic, pod("default", "web", "x")))
	s.Close()
	ro, err := Open(path, Options{ReadOnly: true})
	must(t, err)
	defer ro.Close()
	list, err := ro.Pods().List()
	if err != nil || len(list) != 1 {
		t.Fatalf("read-only list: %v %v", list, err)
	}
	if err := ro.Pods().Put(SourceStatic, pod("default", "x", "x")); err == nil {
		t.Fatal("write to read-only store succeeded")
	}
}

func TestReadOnlyOpenOfMissingFileFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	if _, err := Open(path, Options{ReadOnly: true}); err == nil {
		t.Fatal("read-only open created a file")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("file exists after failed read-only open")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestListNamespaceReadsOnlyThatNamespace(t *testing.T) {
	s := openTemp(t)
	for _, p := range []*corev1.Pod{pod("a", "x", "i"), pod("a", "y", "i"), pod("ab", "x", "i"), pod("b", "x", "i"), pod("", "z", "i")} {
		if err := s.Pods().Put(SourceAPI, p); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := s.Pods().ListNamespace("a")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, r.Object.Namespace+"/"+r.Object.Name)
	}
	if want := []string{"a/x", "a/y"}; !slices.Equal(got, want) {
		t.Errorf("ListNamespace(a) = %q, want %q", got, want)
	}
	if recs, err := s.Pods().ListNamespace("c"); err != nil || len(recs) != 0 {
		t.Errorf("ListNamespace(c) = %v, %v; want nothing", recs, err)
	}
}

// A scratch store takes writes as any store does, without syncing them.
func TestScratchStore(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), FileName), Options{NodeName: "node-a", Scratch: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.db.NoSync {
		t.Error("a scratch store syncs its writes")
	}
	for i := range 3 {
		if _, err := s.Append("pod/default/web", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	must(t, s.Pods().Put(SourceAPI, pod("default", "web", "busybox")))
	es, err := s.Pending(0, 0)
	if err != nil || len(es) != 1 || es[0].Value[0] != 2 {
		t.Fatalf("pending %+v, %v; want the last value only", es, err)
	}
	if _, ok, err := s.Pods().Get("default", "web"); !ok || err != nil {
		t.Fatalf("pod stored: %v %v", ok, err)
	}
}

// TestLoneWriteCommitsAtOnce: with no other write in flight a write
// commits at once, not after bbolt's batch delay (an hour here, so a
// write that waited for it would never return); writes that come while
// another commits gather into one commit.
func TestLoneWriteCommitsAtOnce(t *testing.T) {
	s := openTemp(t)
	s.db.MaxBatchDelay = time.Hour
	s.db.MaxBatchSize = 2
	done := make(chan error, 1)
	go func() { done <- s.Pods().Put(SourceAPI, pod("default", "web", "busybox")) }()
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("a lone write waited for the batch delay")
	}

	// One write in flight, held in its transaction; two others come.
	held, release := make(chan struct{}), make(chan struct{})
	go func() {
		done <- s.batch(func(tx *bolt.Tx) error {
			select {
			case <-held:
			default:
				close(held)
			}
			<-release
			return nil
		})
	}()
	<-held
	commits := s.writes.commits.Load()
	errs := make(chan error, 2)
	for _, name := range []string{"a", "b"} {
		go func() { errs <- s.Pods().Put(SourceAPI, pod("default", name, "busybox")) }()
	}
	for s.writers.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	must(t, <-done)
	for range 2 {
		must(t, <-errs)
	}
	if got := s.writes.commits.Load() - commits; got != 2 {
		t.Errorf("%d commits for the held write and the two that came meanwhile, want 2 (theirs shared)", got)
	}
}

// PutResumed and DeleteResumed write the object and the watch's resume
// version in one commit, and neither when the write is refused.
func TestPutAndDeleteResumedAreOneCommit(t *testing.T) {
	s := openTemp(t)
	rv := func() string {
		t.Helper()
		v, err := s.ResumeVersion("pods")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	step := func(what string, f func() error, wantRV string) {
		t.Helper()
		before := s.writes.commits.Load()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n := s.writes.commits.Load() - before; n != 1 {
			t.Fatalf("%s: %d commits, want 1", what, n)
		}
		if got := rv(); got != wantRV {
			t.Fatalf("%s: resume version %q, want %q", what, got, wantRV)
		}
	}
	p := pod("default", "web", "a")
	step("put", func() error { return s.Pods().PutResumed(SourceAPI, p, Resume{Resource: "pods", Version: "5"}) }, "5")
	step("same put", func() error { return s.Pods().PutResumed(SourceAPI, p, Resume{Resource: "pods", Version: "6"}) }, "6")
	step("delete", func() error {
		_, err := s.Pods().DeleteResumed("default", "web", Resume{Resource: "pods", Version: "7"})
		return err
	}, "7")
	if _, found, _ := s.Pods().Get("default", "web"); found {
		t.Fatal("deleted pod still stored")
	}

	static := pod("default", "static", "b")
	if err := s.Pods().Put(SourceStatic, static); err != nil {
		t.Fatal(err)
	}
	if err := s.Pods().PutResumed(SourceAPI, pod("default", "static", "c"), Resume{Resource: "pods", Version: "8"}); !errors.Is(err, ErrSourceConflict) {
		t.Fatalf("put over a static pod: %v, want ErrSourceConflict", err)
	}
	if got := rv(); got != "7" {
		t.Fatalf("refused put recorded resume version %q", got)
	}
	step("zero resume", func() error { return s.Pods().PutResumed(SourceAPI, pod("default", "other", "d"), Resume{}) }, "7")
}
