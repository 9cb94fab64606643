package kube

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// tokenClaims are the claims of a bound service account token that the
// tests look at.
type tokenClaims struct {
	Subject  string   `json:"sub"`
	Audience []string `json:"aud"`
	Issued   int64    `json:"iat"`
	Expires  int64    `json:"exp"`
	Kube     struct {
		Namespace string `json:"namespace"`
		Pod       struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"pod"`
		ServiceAccount struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"serviceaccount"`
	} `json:"kubernetes.io"`
}

// decodeClaims decodes a JWT's payload (base64url JSON) without checking
// its signature.
func decodeClaims(t *testing.T, jwt string) tokenClaims {
	t.Helper()
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		t.Fatalf("token has %d parts, want a JWT's 3", len(parts))
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatalf("token payload: %v", err)
	}
	var c tokenClaims
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatalf("token payload %s: %v", raw, err)
	}
	return c
}

// TestTokenAgainstAPIServer requests bound tokens with the node identity
// from a real API server under the Node authorizer and NodeRestriction:
// a token for the service account of a pod bound to the node names the
// pod and the account; one for a pod on another node, or with a UID that
// is not the pod's, is refused.
func TestTokenAgainstAPIServer(t *testing.T) {
	api := env.StartAPIServer(t)
	admin, err := NewClient(api.Config, "outpost-test-admin")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	accounts := map[string]*corev1.ServiceAccount{}
	for _, name := range []string{"robot", "other"} {
		sa := &corev1.ServiceAccount{}
		if err := admin.Core.Post().Namespace("default").Resource("serviceaccounts").
			Body(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}).Do(ctx).Into(sa); err != nil {
			t.Fatalf("create service account %s: %v", name, err)
		}
		accounts[name] = sa
	}
	// createPod creates a pod bound to node as admin; the ServiceAccount
	// admission adds its kube-api-access volume. The admission's cache of
	// service accounts may lag behind the create above, hence the retry.
	createPod := func(name, node, sa string, vols ...corev1.Volume) *corev1.Pod {
		t.Helper()
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.PodSpec{
				NodeName: node, ServiceAccountName: sa, Volumes: vols,
				Containers: []corev1.Container{{Name: "app", Image: "busybox:1"}},
			},
		}
		out := &corev1.Pod{}
		var err error
		apiWait.Until(t, "pod "+name+" created", func() bool {
			err = admin.Core.Post().Namespace("default").Resource("pods").Body(p).Do(ctx).Into(out)
			return err == nil
		})
		return out
	}
	vault := corev1.Volume{Name: "vault", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
		{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "vault", ExpirationSeconds: new(int64(7200)), Path: "vault-token"}},
	}}}}
	mine := createPod("p1", "n1", "robot", vault)
	theirs := createPod("p2", "n2", "other")

	nodeCfg, err := LoadKubeconfig(api.NodeKubeconfig(t, "n1"))
	if err != nil {
		t.Fatal(err)
	}
	client, err := NewClient(nodeCfg, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := New(Config{NodeName: "n1"}, Deps{Client: client, Store: st, Clock: clock.Real{}})
	if err != nil {
		t.Fatal(err)
	}

	// The Node authorizer learns of the pod from a watch: retry until it has.
	var token string
	var expires time.Time
	before := time.Now()
	apiWait.Until(t, "token for robot bound to p1", func() bool {
		token, expires, err = s.Token(ctx, "default", "robot", nil, 3607, "p1", mine.UID)
		return err == nil
	})
	c := decodeClaims(t, token)
	if c.Subject != "system:serviceaccount:default:robot" {
		t.Errorf("sub %q, want system:serviceaccount:default:robot", c.Subject)
	}
	if c.Kube.Namespace != "default" || c.Kube.Pod.Name != "p1" || c.Kube.Pod.UID != string(mine.UID) {
		t.Errorf("token bound to %s/%s (%s), want default/p1 (%s)", c.Kube.Namespace, c.Kube.Pod.Name, c.Kube.Pod.UID, mine.UID)
	}
	if c.Kube.ServiceAccount.Name != "robot" || c.Kube.ServiceAccount.UID != string(accounts["robot"].UID) {
		t.Errorf("token of service account %s (%s), want robot (%s)", c.Kube.ServiceAccount.Name, c.Kube.ServiceAccount.UID, accounts["robot"].UID)
	}
	// The status says 3607 s even when the server extends the JWT itself.
	if lo, hi := before.Add(3607*time.Second-time.Minute), time.Now().Add(3607*time.Second+time.Minute); expires.Before(lo) || expires.After(hi) {
		t.Errorf("expires %v, want about 3607 s from now (%v..%v)", expires, lo, hi)
	}
	if c.Expires < c.Issued+3607 {
		t.Errorf("JWT exp %d is less than 3607 s after iat %d", c.Expires, c.Issued)
	}

	// PodToken asks as the projected volume source says: its audience
	// (allowed because the pod mounts a token for it) and lifetime.
	tok, exp, err := s.PodToken(ctx, mine, vault.Projected.Sources[0].ServiceAccountToken)
	if err != nil {
		t.Fatalf("PodToken: %v", err)
	}
	if c := decodeClaims(t, tok); len(c.Audience) != 1 || c.Audience[0] != "vault" || c.Kube.Pod.Name != "p1" || c.Expires-c.Issued != 7200 {
		t.Errorf("PodToken claims aud %q pod %q lifetime %d s, want [vault] p1 7200 s", c.Audience, c.Kube.Pod.Name, c.Expires-c.Issued)
	}
	if d := time.Until(exp); d < 7200*time.Second-2*time.Minute || d > 7200*time.Second+time.Minute {
		t.Errorf("PodToken expires in %v, want about 2 h", d)
	}

	// Refused: a pod of another node, whether for its own service account
	// (the Node authorizer) or for ours (NodeRestriction), and a UID that
	// is not the pod's.
	for _, tc := range []struct {
		name, sa, pod string
		uid           types.UID
	}{
		{"service account of a pod on another node", "other", "p2", theirs.UID},
		{"pod on another node", "robot", "p2", theirs.UID},
		{"pod UID not the pod's", "robot", "p1", "00000000-0000-0000-0000-000000000000"},
	} {
		_, _, err := s.Token(ctx, "default", tc.sa, nil, 3607, tc.pod, tc.uid)
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: err %v, want 403 Forbidden", tc.name, err)
		}
	}
	if _, _, err := s.Token(ctx, "default", "", nil, 3607, "p1", mine.UID); err == nil || !strings.Contains(err.Error(), "serviceAccountName") {
		t.Errorf("no service account: err %v, want one naming spec.serviceAccountName", err)
	}
}

// TestTokenRequest checks the request Token sends (path, protobuf body
// with the pod binding, audiences and lifetime) and what it makes of the
// answer, against a fake API server; a failure names the service account
// and the pod and is noted for `outpost status`.
func TestTokenRequest(t *testing.T) {
	expires := time.Date(2026, 3, 1, 13, 0, 0, 0, time.UTC)
	var (
		mu      sync.Mutex
		got     []*authnv1.TokenRequest
		methods []string
		fail    bool
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		methods = append(methods, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
		body, _ := io.ReadAll(r.Body)
		obj, err := runtime.Decode(codecs.UniversalDeserializer(), body)
		if err != nil {
			t.Errorf("decode request body: %v", err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		tr, ok := obj.(*authnv1.TokenRequest)
		if !ok {
			t.Errorf("request body is a %T, want a TokenRequest", obj)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		got = append(got, tr)
		w.Header().Set("Content-Type", "application/json")
		if fail {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"etcd is down","code":500}`))
			return
		}
		out := tr.DeepCopy()
		out.APIVersion, out.Kind = "authentication.k8s.io/v1", "TokenRequest"
		out.Status = authnv1.TokenRequestStatus{Token: "header.payload.sig", ExpirationTimestamp: metav1.NewTime(expires)}
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(srv.Close)
	client, err := NewClient(&rest.Config{Host: srv.URL}, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := New(Config{NodeName: "n1"}, Deps{Client: client, Store: st, Clock: clocktest.New(expires.Add(-time.Hour))})
	if err != nil {
		t.Fatal(err)
	}

	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p1", UID: "uid-1"}, Spec: corev1.PodSpec{ServiceAccountName: "robot"}}
	tok, exp, err := s.PodToken(t.Context(), pod, &corev1.ServiceAccountTokenProjection{Audience: "vault", ExpirationSeconds: new(int64(3607)), Path: "token"})
	if err != nil {
		t.Fatal(err)
	}
	if tok != "header.payload.sig" || !exp.Equal(expires) {
		t.Errorf("got %q expiring %v, want header.payload.sig expiring %v", tok, exp, expires)
	}
	// No audience and no lifetime: the server's defaults.
	if _, _, err := s.PodToken(t.Context(), pod, &corev1.ServiceAccountTokenProjection{Path: "token"}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	fail = true
	mu.Unlock()
	_, _, err = s.Token(t.Context(), "default", "robot", nil, 0, "p1", "uid-1")
	if err == nil || !strings.Contains(err.Error(), "request token for service account default/robot for pod default/p1") || !strings.Contains(err.Error(), "etcd is down") {
		t.Errorf("err %v, want one naming the service account, the pod and the cause", err)
	}
	if s.Link().LastError == "" {
		t.Error("the failure is not noted in the link state")
	}

	mu.Lock()
	defer mu.Unlock()
	want := "POST /api/v1/namespaces/default/serviceaccounts/robot/token " + contentProtobuf
	for i, m := range methods {
		if m != want {
			t.Errorf("request %d: %q, want %q", i, m, want)
		}
	}
	if len(got) != 3 {
		t.Fatalf("%d requests, want 3", len(got))
	}
	ref := authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: "p1", UID: "uid-1"}
	for i, tr := range got {
		if tr.Spec.BoundObjectRef == nil || *tr.Spec.BoundObjectRef != ref {
			t.Errorf("request %d: boundObjectRef %+v, want %+v", i, tr.Spec.BoundObjectRef, ref)
		}
	}
	if a, e := got[0].Spec.Audiences, got[0].Spec.ExpirationSeconds; len(a) != 1 || a[0] != "vault" || e == nil || *e != 3607 {
		t.Errorf("request 0: audiences %q expirationSeconds %v, want [vault] 3607", a, e)
	}
	if a, e := got[1].Spec.Audiences, got[1].Spec.ExpirationSeconds; a != nil || e != nil {
		t.Errorf("request 1: audiences %q expirationSeconds %v, want none (server defaults)", a, e)
	}
}
