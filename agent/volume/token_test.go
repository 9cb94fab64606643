package volume

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/store"
	corev1 "k8s.io/api/core/v1"
)

// fakeTokens is a TokenFunc that hands out "token-1", "token-2", … each
// living life from the clock's now, or fails with err.
type fakeTokens struct {
	e    *env
	mu   sync.Mutex
	life time.Duration
	err  error
	reqs []string // "<pod uid> <path> <audience> <expirationSeconds>"
}

func (f *fakeTokens) get(_ context.Context, pod *corev1.Pod, src *corev1.ServiceAccountTokenProjection) (string, time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	exp := "nil"
	if src.ExpirationSeconds != nil {
		exp = fmt.Sprint(*src.ExpirationSeconds)
	}
	f.reqs = append(f.reqs, fmt.Sprintf("%s %s %s %s", pod.UID, src.Path, src.Audience, exp))
	if f.err != nil {
		return "", time.Time{}, f.err
	}
	return fmt.Sprintf("token-%d", len(f.reqs)), f.e.clock.Now().Add(f.life), nil
}

func (f *fakeTokens) requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.reqs)
}

func (f *fakeTokens) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

// recLog records log messages by level.
type recLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *recLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *recLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *recLog) WithGroup(string) slog.Handler            { return l }
func (l *recLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Level.String()+" "+r.Message)
	return nil
}

// count returns how many messages start with prefix ("WARN service …").
func (l *recLog) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// withTokens replaces e's manager with one (on the same pods directory and
// store, as after a restart of the agent) whose Tokens is tokens, and
// returns its log.
func (e *env) withTokens(t *testing.T, tokens TokenFunc) *recLog {
	t.Helper()
	log := &recLog{}
	m, err := New(Config{PodsDir: e.podsDir}, Deps{Store: e.st, Clock: e.clock, Log: slog.New(log), Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	return log
}

const apiAccess = "kube-api-access-x7k2p"

// apiAccessPod is a pod as the ServiceAccount admission leaves it: a
// projected volume with a token, the cluster's CA and the namespace,
// stored as coming from source.
func apiAccessPod(t *testing.T, e *env, source store.Source) *corev1.Pod {
	t.Helper()
	pod := testPod(corev1.Volume{Name: apiAccess, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr(int32(0o644)),
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{ExpirationSeconds: ptr(int64(3607)), Path: "token"}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		},
	}}})
	pod.Spec.ServiceAccountName = "default"
	if err := e.st.Pods().Put(source, pod); err != nil {
		t.Fatal(err)
	}
	e.putConfigMap(t, "kube-root-ca.crt", map[string]string{"ca.crt": "-----BEGIN CERTIFICATE-----\ncluster CA\n-----END CERTIFICATE-----\n"})
	return pod
}

func (e *env) apiAccessDir(pod *corev1.Pod) string {
	return filepath.Join(e.podsDir, string(pod.UID), "volumes", KindProjected, apiAccess)
}

// TestTokenWrittenAndRefreshed: the kube-api-access volume gets the token,
// ca.crt from kube-root-ca.crt and the namespace; the token is requested
// once, served from memory, and replaced once 80% of its lifetime passed.
func TestTokenWrittenAndRefreshed(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	f := &fakeTokens{e: e, life: 3607 * time.Second}
	e.withTokens(t, f.get)
	pod := apiAccessPod(t, e, store.SourceAPI)
	ctx := context.Background()
	start := e.clock.Now()

	if _, err := e.m.Setup(ctx, pod, PodInfo{}); err != nil {
		t.Fatal(err)
	}
	dir := e.apiAccessDir(pod)
	checkVisible(t, dir, "token", "token-1")
	checkVisible(t, dir, "ca.crt", "-----BEGIN CERTIFICATE-----\ncluster CA\n-----END CERTIFICATE-----\n")
	checkVisible(t, dir, "namespace", "default")
	if f.reqs[0] != string(pod.UID)+" token  3607" {
		t.Errorf("request %q, want the pod's uid, path token, no audience, 3607 s", f.reqs[0])
	}
	if m := mode(t, filepath.Join(dir, "token")); m.Perm() != 0o644 {
		t.Errorf("token mode %v, want the defaultMode 0644", m)
	}

	// 80% of 3607 s is 2885.6 s: until then the token is served from memory.
	for _, at := range []time.Duration{time.Second, 30 * time.Minute, 2885 * time.Second} {
		e.clock.Advance(start.Add(at).Sub(e.clock.Now()))
		if _, err := e.m.Setup(ctx, pod, PodInfo{}); err != nil {
			t.Fatal(err)
		}
		if n := f.requests(); n != 1 {
			t.Fatalf("after %v: %d requests, want 1", at, n)
		}
	}
	e.clock.Advance(time.Second)
	if _, err := e.m.Setup(ctx, pod, PodInfo{}); err != nil {
		t.Fatal(err)
	}
	if n := f.requests(); n != 2 {
		t.Fatalf("after 2886 s: %d requests, want 2", n)
	}
	checkVisible(t, dir, "token", "token-2")

	// It is kept on disk, for root only.
	kept := filepath.Join(e.podsDir, string(pod.UID), tokensDirName, apiAccess+".0")
	if m := mode(t, kept); m.Perm() != 0o600 {
		t.Errorf("%s mode %v, want 0600", kept, m)
	}
	if b := readFile(t, kept); !strings.Contains(b, `"token-2"`) {
		t.Errorf("%s = %s, want token-2", kept, b)
	}

	// Teardown forgets it: the same pod set up again asks again.
	if err := e.m.Teardown(string(pod.UID)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Setup(ctx, pod, PodInfo{}); err != nil {
		t.Fatal(err)
	}
	if n := f.requests(); n != 3 {
		t.Errorf("after teardown: %d requests, want 3", n)
	}
}

// TestTokenRefreshDue is kubelet's requiresRefresh: 80% of the lifetime,
// a day, or a clock gone back before the token was issued.
func TestTokenRefreshDue(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		life time.Duration
		at   time.Duration // after issue
		want bool
	}{
		{"fresh", time.Hour, time.Minute, false},
		{"just before 80%", time.Hour, 48*time.Minute - time.Nanosecond, false},
		{"at 80%", time.Hour, 48 * time.Minute, true},
		{"expired", time.Hour, 2 * time.Hour, true},
		{"year-long token before a day", 365 * 24 * time.Hour, 24*time.Hour - time.Second, false},
		{"year-long token at a day", 365 * 24 * time.Hour, 24 * time.Hour, true},
		{"clock went back", time.Hour, -time.Second, true},
		{"expiry before issue on our clock: an hour assumed", -time.Minute, 47 * time.Minute, false},
		{"expiry before issue on our clock: refreshed after 48 min", -time.Minute, 48 * time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := &podToken{Token: "x", Issued: t0, Expires: t0.Add(tc.life)}
			if got := tok.refreshDue(t0.Add(tc.at)); got != tc.want {
				t.Errorf("refreshDue = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestTokenOfflineKeepsOld: a refresh that fails leaves the pod its token,
// logged once; retries wait a minute; the next success replaces it.
func TestTokenOfflineKeepsOld(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	f := &fakeTokens{e: e, life: time.Hour}
	log := e.withTokens(t, f.get)
	pod := apiAccessPod(t, e, store.SourceAPI)
	ctx := context.Background()
	if _, err := e.m.Setup(ctx, pod, PodInfo{}); err != nil {
		t.Fatal(err)
	}
	dir := e.apiAccessDir(pod)

	f.fail(errors.New("dial tcp 10.0.0.1:6443: connect: network is unreachable"))
	e.clock.Advance(50 * time.Minute)
	for range 3 {
		vols, err := e.m.Setup(ctx, pod, PodInfo{})
		if err != nil {
			t.Fatalf("offline refresh: %v", err)
		}
		if _, ok := vols[apiAccess]; !ok {
			t.Fatal("volume not set up offline")
		}
		checkVisible(t, dir, "token", "token-1")
	}
	if n := f.requests(); n != 2 {
		t.Errorf("%d requests, want 2: one refresh, then none before tokenRetry", n)
	}
	e.clock.Advance(tokenRetry)
	if _, err := e.m.Setup(ctx, pod, PodInfo{}); err != nil {
		t.Fatal(err)
	}
	if n := f.requests(); n != 3 {
		t.Errorf("%d requests, want 3 after tokenRetry", n)
	}
	// Past its expiry too: whoever checks the token decides.
	e.clock.Advance(time.Hour)
	if _, err := e.m.Setup(ctx, pod, PodInfo{}); err != nil {
		t.Fatal(err)
	}
	checkVisible(t, dir, "token", "token-1")
	if n := log.count("WARN service account token not refreshed"); n != 1 {
		t.Errorf("%d warnings, want 1: %q", n, log.msgs)
	}

	f.fail(nil)
	e.clock.Advance(tokenRetry)
	if _, err := e.m.Setup(ctx, pod, PodInfo{}); err != nil {
		t.Fatal(err)
	}
	checkVisible(t, dir, "token", fmt.Sprintf("token-%d", f.requests()))
	if n := log.count("INFO service account token refreshed"); n != 1 {
		t.Errorf("%d refresh infos, want 1: %q", n, log.msgs)
	}
}

// TestTokenSurvivesRestartAndReboot: a new agent without the API server
// (Tokens failing, or nil) gives the pod the token the last one received,
// both when the volume is still mounted (a restart) and when the tmpfs is
// gone (a reboot).
func TestTokenSurvivesRestartAndReboot(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	f := &fakeTokens{e: e, life: time.Hour}
	e.withTokens(t, f.get)
	pod := apiAccessPod(t, e, store.SourceAPI)
	ctx := context.Background()
	if _, err := e.m.Setup(ctx, pod, PodInfo{}); err != nil {
		t.Fatal(err)
	}
	dir := e.apiAccessDir(pod)

	// Restart, not connected to an API server, the token still fresh: no
	// request, no warning.
	log := e.withTokens(t, nil)
	if _, err := e.m.Setup(ctx, pod, PodInfo{}); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	checkVisible(t, dir, "token", "token-1")
	if len(log.msgs) != 0 {
		t.Errorf("log %q, want nothing", log.msgs)
	}

	// Reboot: the tmpfs is gone, the API server unreachable, the token due.
	real, err := filepath.EvalSymlinks(e.podsDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := unmountBelow(real); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(e.podsDir, string(pod.UID), "volumes")); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(55 * time.Minute)
	broken := &fakeTokens{e: e, err: errors.New("connection refused")}
	log = e.withTokens(t, broken.get)
	if _, err := e.m.Setup(ctx, pod, PodInfo{}); err != nil {
		t.Fatalf("after a reboot: %v", err)
	}
	checkVisible(t, dir, "token", "token-1")
	checkVisible(t, dir, "namespace", "default")
	if broken.requests() != 1 || log.count("WARN service account token not refreshed") != 1 {
		t.Errorf("%d requests, log %q: want one refresh tried and one warning", broken.requests(), log.msgs)
	}
}

// TestTokenNone: a pod that never had a token does not get the volume,
// with an error naming the volume and the source; its other volumes are
// set up. A static pod has no service account in the API server.
func TestTokenNone(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name   string
		source store.Source
		tokens func(e *env) TokenFunc
		want   string
	}{
		{"API server unreachable", store.SourceAPI,
			func(e *env) TokenFunc {
				return (&fakeTokens{e: e, err: errors.New("dial tcp: connection refused")}).get
			},
			`: no token: dial tcp: connection refused`},
		{"not connected", store.SourceAPI, func(*env) TokenFunc { return nil },
			`: no token: the agent is not connected to an API server`},
		{"static pod", store.SourceStatic,
			func(e *env) TokenFunc { return (&fakeTokens{e: e, life: time.Hour}).get },
			`: no token: a pod from source static has no service account in the API server`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.withTokens(t, tc.tokens(e))
			pod := apiAccessPod(t, e, tc.source)
			pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
			vols, err := e.m.Setup(context.Background(), pod, PodInfo{})
			want := `pod default/web: volume "` + apiAccess + `": projected.sources[0].serviceAccountToken` + tc.want
			if err == nil || err.Error() != want {
				t.Fatalf("err %v, want %s", err, want)
			}
			if _, ok := vols[apiAccess]; ok {
				t.Error("the volume was set up without a token")
			}
			if _, ok := vols["scratch"]; !ok {
				t.Error("the other volume was not set up")
			}
		})
	}
}

// TestTokenFileModes follows kubelet's projected volume: the defaultMode,
// or 0600 when an fsGroup (then group-readable) or a common runAsUser
// (then owned by it) is set; the other files keep the defaultMode.
func TestTokenFileModes(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name        string
		defaultMode *int32
		podSC       *corev1.PodSecurityContext
		containerSC *corev1.SecurityContext
		tokenMode   fs.FileMode
		otherMode   fs.FileMode
		uid, gid    uint32
	}{
		{name: "defaults", tokenMode: 0o644, otherMode: 0o644},
		{name: "defaultMode", defaultMode: ptr(int32(0o440)), tokenMode: 0o440, otherMode: 0o440},
		{name: "fsGroup", podSC: &corev1.PodSecurityContext{FSGroup: ptr(int64(2345))}, tokenMode: 0o640, otherMode: 0o644, gid: 2345},
		{name: "runAsUser of the pod", podSC: &corev1.PodSecurityContext{RunAsUser: ptr(int64(1000))}, tokenMode: 0o600, otherMode: 0o644, uid: 1000},
		{name: "runAsUser and fsGroup", podSC: &corev1.PodSecurityContext{RunAsUser: ptr(int64(1000)), FSGroup: ptr(int64(2345))},
			tokenMode: 0o640, otherMode: 0o644, uid: 1000, gid: 2345},
		{name: "containers run as another user than the init container", podSC: &corev1.PodSecurityContext{RunAsUser: ptr(int64(1000))},
			containerSC: &corev1.SecurityContext{RunAsUser: ptr(int64(1001))}, tokenMode: 0o644, otherMode: 0o644},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			f := &fakeTokens{e: e, life: time.Hour}
			e.withTokens(t, f.get)
			pod := apiAccessPod(t, e, store.SourceAPI)
			pod.Spec.Volumes[0].Projected.DefaultMode = tc.defaultMode
			pod.Spec.SecurityContext = tc.podSC
			pod.Spec.InitContainers = []corev1.Container{{Name: "init"}}
			pod.Spec.Containers[0].SecurityContext = tc.containerSC
			if _, err := e.m.Setup(context.Background(), pod, PodInfo{}); err != nil {
				t.Fatal(err)
			}
			dir := e.apiAccessDir(pod)
			fi, err := os.Stat(filepath.Join(dir, "token"))
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if fi.Mode().Perm() != tc.tokenMode || st.Uid != tc.uid || st.Gid != tc.gid {
				t.Errorf("token %v %d:%d, want %v %d:%d", fi.Mode().Perm(), st.Uid, st.Gid, tc.tokenMode, tc.uid, tc.gid)
			}
			if m := mode(t, filepath.Join(dir, "ca.crt")).Perm(); m != tc.otherMode {
				t.Errorf("ca.crt mode %v, want %v", m, tc.otherMode)
			}
			// Set up again: nothing to rewrite.
			before, err := os.Readlink(filepath.Join(dir, "..data"))
			if err != nil {
				t.Fatal(err)
			}
			e.clock.Advance(time.Minute)
			if _, err := e.m.Setup(context.Background(), pod, PodInfo{}); err != nil {
				t.Fatal(err)
			}
			if after, _ := os.Readlink(filepath.Join(dir, "..data")); after != before {
				t.Errorf("unchanged volume rewritten: ..data %s -> %s", before, after)
			}
		})
	}
}

// TestFsUser is kubelet's FsUserFrom.
func TestFsUser(t *testing.T) {
	user := func(u int64) *corev1.SecurityContext { return &corev1.SecurityContext{RunAsUser: &u} }
	for _, tc := range []struct {
		name string
		pod  corev1.PodSpec
		want string
	}{
		{"none", corev1.PodSpec{Containers: []corev1.Container{{}}}, "nil"},
		{"pod", corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{RunAsUser: ptr(int64(7))}, Containers: []corev1.Container{{}, {}}}, "7"},
		{"containers agree", corev1.PodSpec{Containers: []corev1.Container{{SecurityContext: user(8)}, {SecurityContext: user(8)}}}, "8"},
		{"containers differ", corev1.PodSpec{Containers: []corev1.Container{{SecurityContext: user(8)}, {SecurityContext: user(9)}}}, "nil"},
		{"one container unset", corev1.PodSpec{InitContainers: []corev1.Container{{}}, Containers: []corev1.Container{{SecurityContext: user(8)}}}, "nil"},
		{"container overrides pod", corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{RunAsUser: ptr(int64(7))},
			InitContainers: []corev1.Container{{SecurityContext: user(8)}}, Containers: []corev1.Container{{SecurityContext: user(8)}}}, "8"},
		{"ephemeral container differs", corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{RunAsUser: ptr(int64(7))},
			Containers:          []corev1.Container{{}},
			EphemeralContainers: []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{SecurityContext: user(0)}}}}, "nil"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := "nil"
			if u := fsUser(&corev1.Pod{Spec: tc.pod}); u != nil {
				got = fmt.Sprint(*u)
			}
			if got != tc.want {
				t.Errorf("fsUser = %s, want %s", got, tc.want)
			}
		})
	}
}
