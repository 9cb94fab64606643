package kube

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
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

	certsv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/internal/report"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// ---- unit tests ----

// The renewal deadline is 70 to 90 % into the certificate's lifetime,
// measured from NotBefore.
func TestBootstrapRenewalDeadline(t *testing.T) {
	nb := ndEpoch
	leaf := &x509.Certificate{NotBefore: nb, NotAfter: nb.Add(100 * time.Hour)}
	for _, tt := range []struct {
		jitter float64
		want   time.Duration
	}{{0, 70 * time.Hour}, {0.5, 80 * time.Hour}, {0.999999, 90*time.Hour - 72*time.Millisecond}} {
		if got := renewalDeadline(leaf, tt.jitter); !got.Equal(nb.Add(tt.want)) {
			t.Errorf("jitter %g: deadline %s after NotBefore, want %s", tt.jitter, got.Sub(nb), tt.want)
		}
	}
}

// A kubeconfig whose certificate has not expired is used as it is: no
// request is made, and the certificate is ready at once.
func TestBootstrapValidCertMakesNoCSR(t *testing.T) {
	f := newBSFake(t)
	clk := clocktest.New(ndEpoch)
	dir := t.TempDir()
	kc := f.nodeKubeconfig(t, dir, "n1", ndEpoch.Add(-time.Hour), ndEpoch.Add(99*time.Hour))
	b, log := f.bootstrapper(t, dir, kc, clk)
	select {
	case <-b.Ready():
	default:
		t.Fatal("not ready with a valid certificate in the kubeconfig")
	}
	st := b.State()
	if st.Phase != report.CertValid || !st.Usable || st.Subject != "CN=system:node:n1,O=system:nodes" {
		t.Errorf("state %+v", st)
	}
	if want := ndEpoch.Add(-time.Hour).Add(80 * time.Hour); !st.RenewAt.Equal(want) {
		t.Errorf("renewAt %s, want %s", st.RenewAt, want)
	}
	done := runUntilDone(t, b.Run)
	bsAsleep(t, clk)
	clk.Advance(time.Hour)
	bsAsleep(t, clk)
	if reqs := f.requests(); len(reqs) != 0 {
		t.Errorf("requests with a valid certificate: %+v", reqs)
	}
	if _, err := os.Stat(filepath.Join(dir, "pki")); !os.IsNotExist(err) {
		t.Errorf("certificate directory written: %v", err)
	}
	if got := log.matching("client certificate in use"); len(got) != 1 {
		t.Errorf("logs %q", log.matching(""))
	}
	done()
}

// Without a valid certificate in the kubeconfig, the bootstrap credential
// requests one; certificate, key and kubeconfig land on disk (0600), and
// the kubeconfig written names the certificate issued.
func TestBootstrapWithoutValidCert(t *testing.T) {
	for _, tt := range []struct {
		name       string
		kubeconfig func(t *testing.T, f *bsFake, dir string) string
	}{
		{"no kubeconfig", func(t *testing.T, f *bsFake, dir string) string { return filepath.Join(dir, "node", "kubeconfig") }},
		{"expired certificate", func(t *testing.T, f *bsFake, dir string) string {
			return f.nodeKubeconfig(t, dir, "n1", ndEpoch.Add(-48*time.Hour), ndEpoch.Add(-time.Second))
		}},
		{"unreadable kubeconfig", func(t *testing.T, f *bsFake, dir string) string {
			p := filepath.Join(dir, "kubeconfig")
			if err := os.WriteFile(p, []byte("clusters: [\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}},
		{"token kubeconfig", func(t *testing.T, f *bsFake, dir string) string {
			p := filepath.Join(dir, "kubeconfig")
			if err := env.WriteKubeconfig(p, f.srv.URL, f.caPEM, "someone", "a-token", nil, nil); err != nil {
				t.Fatal(err)
			}
			return p
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newBSFake(t)
			clk := clocktest.New(ndEpoch)
			dir := t.TempDir()
			kc := tt.kubeconfig(t, f, dir)
			b, _ := f.bootstrapper(t, dir, kc, clk)
			if st := b.State(); st.Phase != report.CertRequesting || st.Usable {
				t.Errorf("state before Run %+v", st)
			}
			runUntilDone(t, b.Run)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			rc, err := b.Wait(ctx)
			if err != nil {
				t.Fatalf("wait: %v (state %+v)", err, b.State())
			}
			if rc.Host != f.srv.URL {
				t.Errorf("config host %s", rc.Host)
			}
			csrs := f.created()
			if len(csrs) != 1 {
				t.Fatalf("%d requests created, want 1", len(csrs))
			}
			checkCSR(t, csrs[0], "n1", clientCSR, nil, nil)
			if u := csrs[0].Spec.Username; u != "token:bootstrap-token" {
				t.Errorf("request made by %q, want the bootstrap token", u)
			}
			issued := f.issued(csrs[0].Name)
			bsCheckFiles(t, dir, kc, issued)
			if st := b.State(); st.Phase != report.CertValid || !st.Usable || !st.NotAfter.Equal(issued.NotAfter) || st.CSR != csrs[0].Name {
				t.Errorf("state %+v", st)
			}
		})
	}
}

// The certificate is renewed at its deadline, not before, with the
// current certificate as the identity; the new one is presented on the
// connections made after the swap, without a new client.
func TestBootstrapRenewsAtDeadline(t *testing.T) {
	f := newBSFake(t)
	clk := clocktest.New(ndEpoch)
	dir := t.TempDir()
	kc := f.nodeKubeconfig(t, dir, "n1", ndEpoch, ndEpoch.Add(100*time.Hour))
	b, _ := f.bootstrapper(t, dir, kc, clk)
	client, err := NewClient(b.Config(), "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	first := f.whoami(t, client)
	runUntilDone(t, b.Run)

	bsAsleep(t, clk)
	clk.Advance(80*time.Hour - time.Minute)
	bsAsleep(t, clk)
	if n := len(f.created()); n != 0 {
		t.Fatalf("%d requests before the deadline", n)
	}
	if again := f.whoami(t, client); again != first {
		t.Fatalf("certificate %s presented before renewal, want %s", again, first)
	}
	clk.Advance(2 * time.Minute)
	spinWait.Until(t, "renewal", func() bool { return b.State().NotAfter.After(ndEpoch.Add(100 * time.Hour)) })
	csrs := f.created()
	if len(csrs) != 1 {
		t.Fatalf("%d requests, want 1", len(csrs))
	}
	checkCSR(t, csrs[0], "n1", clientCSR, nil, nil)
	if u := csrs[0].Spec.Username; u != "system:node:n1" {
		t.Errorf("renewal requested by %q, want the node's own certificate", u)
	}
	issued := f.issued(csrs[0].Name)
	if got, want := f.whoami(t, client), issued.SerialNumber.String(); got != want {
		t.Errorf("certificate %s presented after renewal, want the new one %s", got, want)
	}
	bsCheckFiles(t, dir, kc, issued)
	if st := b.State(); st.Phase != report.CertValid || !st.RenewAt.Equal(renewalDeadline(issued, 0.5)) {
		t.Errorf("state %+v", st)
	}
}

// A renewal that fails until the certificate expires keeps retrying with
// backoff, logs the failure once, and then asks with the bootstrap
// credential; the sync is never told to stop.
func TestBootstrapRenewalOutageFallsBackToBootstrap(t *testing.T) {
	f := newBSFake(t)
	clk := clocktest.New(ndEpoch)
	dir := t.TempDir()
	notAfter := ndEpoch.Add(10 * time.Hour)
	kc := f.nodeKubeconfig(t, dir, "n1", ndEpoch, notAfter)
	b, log := f.bootstrapper(t, dir, kc, clk)
	unreachableUntil := notAfter.Add(30 * time.Minute)
	f.setFail(func(bsRequest) int {
		if clk.Now().Before(unreachableUntil) {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	done := runUntilDone(t, b.Run)
	bsAsleep(t, clk)
	clk.Advance(8 * time.Hour) // the deadline
	for clk.Now().Before(unreachableUntil) {
		bsAsleep(t, clk)
		st := b.State()
		if st.Phase != report.CertFailing || !strings.Contains(st.Reason, "fake outage") {
			t.Fatalf("state during the outage %+v", st)
		}
		if st.Usable != clk.Now().Before(notAfter) {
			t.Fatalf("at %s usable %v", clk.Now().Sub(ndEpoch), st.Usable)
		}
		clk.Advance(2 * time.Minute)
	}
	spinWait.Until(t, "certificate after the outage", func() bool { return b.State().Phase == report.CertValid })
	var byNode, byToken int
	for _, r := range f.requests() {
		if r.method != http.MethodPost {
			continue
		}
		switch r.user {
		case "system:node:n1":
			byNode++
		case "token:bootstrap-token":
			byToken++
		}
	}
	if byNode < 10 || byToken < 2 {
		t.Errorf("requests: %d by the node, %d by the bootstrap token; want retries by both", byNode, byToken)
	}
	csrs := f.created()
	if len(csrs) != 1 || csrs[0].Spec.Username != "token:bootstrap-token" {
		t.Fatalf("created %+v, want one request by the bootstrap token", csrs)
	}
	if got := log.matching("client certificate request failed"); len(got) != 1 {
		t.Errorf("failure logged %d times, want once: %q", len(got), got)
	}
	if st := b.State(); !st.Usable || !st.NotAfter.Equal(f.issued(csrs[0].Name).NotAfter) {
		t.Errorf("state %+v", st)
	}
	done()
}

// A denied request is checked again with backoff, not replaced (its key
// is kept, so it has the same name); once deleted, the same request is
// made again, and approved this time.
func TestBootstrapDeniedKeepsChecking(t *testing.T) {
	f := newBSFake(t)
	f.deny = true
	clk := clocktest.New(ndEpoch)
	dir := t.TempDir()
	b, log := f.bootstrapper(t, dir, filepath.Join(dir, "kubeconfig"), clk)
	runUntilDone(t, b.Run)
	for range 5 {
		bsAsleep(t, clk)
		clk.Advance(2 * time.Minute)
	}
	bsAsleep(t, clk)
	st := b.State()
	csrs := f.created()
	if len(csrs) != 1 {
		t.Fatalf("%d requests created while denied, want 1", len(csrs))
	}
	name := csrs[0].Name
	if st.Phase != report.CertDenied || st.Usable || st.CSR != name || !strings.Contains(st.Reason, "NotThisOne") {
		t.Errorf("state %+v", st)
	}
	select {
	case <-b.Ready():
		t.Fatal("ready with a denied request")
	default:
	}
	if got := log.matching("client certificate request denied"); len(got) != 1 {
		t.Errorf("denial logged %d times, want once: %q", len(got), got)
	}
	if n := f.count(http.MethodGet, name); n < 5 {
		t.Errorf("denied request read %d times, want one per retry", n)
	}

	f.mu.Lock()
	delete(f.csrs, name)
	f.deny = false
	f.mu.Unlock()
	clk.Advance(2 * time.Minute)
	spinWait.Until(t, "certificate", func() bool { return b.State().Phase == report.CertValid })
	csrs = f.created()
	if len(csrs) != 2 || csrs[1].Name != name {
		t.Fatalf("requests %d, want the same one made again", len(csrs))
	}
	bsCheckFiles(t, dir, filepath.Join(dir, "kubeconfig"), f.issued(name))
}

// The bootstrap kubeconfig is needed only when there is no valid
// certificate. On a node that never had a kubeconfig, one that cannot be
// read is an error naming it; on a node whose certificate expired it is
// a state that Run retries, since the file may come back.
func TestBootstrapKubeconfigOnlyWhenNeeded(t *testing.T) {
	t.Run("first start", func(t *testing.T) {
		f := newBSFake(t)
		dir := t.TempDir()
		_, _, err := f.newBootstrapper(dir, filepath.Join(dir, "kubeconfig"), clocktest.New(ndEpoch))
		if want := "bootstrap kubeconfig " + filepath.Join(dir, "bootstrap.kubeconfig") + ":"; err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("err = %v, want it to start with %q", err, want)
		}
	})
	t.Run("valid certificate", func(t *testing.T) {
		f := newBSFake(t)
		dir := t.TempDir()
		kc := f.nodeKubeconfig(t, dir, "n1", ndEpoch, ndEpoch.Add(time.Hour))
		b, _, err := f.newBootstrapper(dir, kc, clocktest.New(ndEpoch))
		if err != nil {
			t.Fatal(err)
		}
		if st := b.State(); st.Phase != report.CertValid || !st.Usable {
			t.Errorf("state %+v", st)
		}
	})
	t.Run("expired certificate", func(t *testing.T) {
		f := newBSFake(t)
		clk := clocktest.New(ndEpoch)
		dir := t.TempDir()
		kc := f.nodeKubeconfig(t, dir, "n1", ndEpoch.Add(-time.Hour), ndEpoch)
		b, _, err := f.newBootstrapper(dir, kc, clk)
		if err != nil {
			t.Fatal(err)
		}
		runUntilDone(t, b.Run)
		bsAsleep(t, clk)
		if st := b.State(); st.Phase != report.CertFailing || st.Usable || !strings.Contains(st.Reason, "bootstrap kubeconfig "+filepath.Join(dir, "bootstrap.kubeconfig")) {
			t.Errorf("state %+v", st)
		}
		f.writeBootstrap(t, dir)
		clk.Advance(2 * time.Minute)
		spinWait.Until(t, "certificate", func() bool { return b.State().Phase == report.CertValid })
		if csrs := f.created(); len(csrs) != 1 || csrs[0].Spec.Username != "token:bootstrap-token" {
			t.Errorf("requests %+v", csrs)
		}
	})
}

// ---- unit test fakes ----

// bsFake is an API server of certificate signing requests over TLS that
// asks for client certificates, signs every request with its CA (or
// denies it), and records who asked what. Requests for the kubelet
// serving signer get serving certificates for their names.
type bsFake struct {
	t     *testing.T
	srv   *httptest.Server
	caPEM []byte // trusts srv
	ca    *env.CA
	clk   func() time.Time

	mu      sync.Mutex
	reqs    []bsRequest
	csrs    map[string]*certsv1.CertificateSigningRequest
	made    []*certsv1.CertificateSigningRequest
	deny    bool
	fail    func(bsRequest) int
	rv      int
	lifeFor time.Duration
}

type bsRequest struct {
	method, path, user, serial string
}

const bsCSRPath = "/apis/certificates.k8s.io/v1/certificatesigningrequests"

func newBSFake(t *testing.T) *bsFake {
	ca, err := env.NewCA("bs-ca")
	if err != nil {
		t.Fatal(err)
	}
	f := &bsFake{t: t, ca: ca, csrs: map[string]*certsv1.CertificateSigningRequest{}, lifeFor: 100 * time.Hour}
	f.srv = httptest.NewUnstartedServer(f)
	f.srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	f.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
	return f
}

func (f *bsFake) setFail(fn func(bsRequest) int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = fn
}

// bootstrapper returns a Bootstrapper of node n1 with the bootstrap token
// "bootstrap-token", its kubeconfig at kc, CertDir dir/pki and jitter 0.5.
func (f *bsFake) bootstrapper(t *testing.T, dir, kc string, clk *clocktest.Fake) (*Bootstrapper, *ndLog) {
	t.Helper()
	f.writeBootstrap(t, dir)
	b, log, err := f.newBootstrapper(dir, kc, clk)
	if err != nil {
		t.Fatal(err)
	}
	return b, log
}

// writeBootstrap writes dir/bootstrap.kubeconfig with the bootstrap token.
func (f *bsFake) writeBootstrap(t *testing.T, dir string) {
	t.Helper()
	if err := env.WriteKubeconfig(filepath.Join(dir, "bootstrap.kubeconfig"), f.srv.URL, f.caPEM, "bootstrap", "bootstrap-token", nil, nil); err != nil {
		t.Fatal(err)
	}
}

// newBootstrapper is bootstrapper without writing the bootstrap kubeconfig.
func (f *bsFake) newBootstrapper(dir, kc string, clk *clocktest.Fake) (*Bootstrapper, *ndLog, error) {
	f.clk = clk.Now
	log := &ndLog{}
	b, err := NewBootstrapper(BootstrapConfig{
		NodeName: "n1", Kubeconfig: kc, BootstrapKubeconfig: filepath.Join(dir, "bootstrap.kubeconfig"),
		CertDir: filepath.Join(dir, "pki"), UserAgent: "outpost-test",
	}, BootstrapDeps{Clock: clk, Log: slog.New(log), Jitter: func() float64 { return 0.5 }})
	return b, log, err
}

// nodeKubeconfig writes a kubeconfig with a certificate for node valid
// from nb to na.
func (f *bsFake) nodeKubeconfig(t *testing.T, dir, node string, nb, na time.Time) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := bsSign(t, f.ca, pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}, key.Public(), nb, na)
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "kubeconfig")
	if err := env.WriteKubeconfig(p, f.srv.URL, f.caPEM, "system:node:"+node, "", certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})); err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *bsFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req := bsRequest{method: r.Method, path: r.URL.Path}
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		req.user, req.serial = r.TLS.PeerCertificates[0].Subject.CommonName, r.TLS.PeerCertificates[0].SerialNumber.String()
	} else if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		req.user = "token:" + tok
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, req)
	if f.fail != nil {
		if code := f.fail(req); code != 0 {
			bsReply(w, code, &apierrors.NewServiceUnavailable("fake outage").ErrStatus)
			return
		}
	}
	gr := schema.GroupResource{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}
	switch name, _ := strings.CutPrefix(r.URL.Path, bsCSRPath+"/"); {
	case r.URL.Path == "/whoami":
		bsReply(w, http.StatusOK, &metav1.Status{Status: "Success", Message: req.serial})
	case r.Method == http.MethodPost && r.URL.Path == bsCSRPath:
		obj, _, err := codecs.UniversalDeserializer().Decode(body, nil, nil)
		csr, ok := obj.(*certsv1.CertificateSigningRequest)
		if err != nil || !ok {
			f.t.Errorf("create request: %v %T", err, obj)
			bsReply(w, http.StatusBadRequest, &apierrors.NewBadRequest("bad body").ErrStatus)
			return
		}
		if _, ok := f.csrs[csr.Name]; ok {
			bsReply(w, http.StatusConflict, &apierrors.NewAlreadyExists(gr, csr.Name).ErrStatus)
			return
		}
		f.rv++
		csr.ResourceVersion = strconv.Itoa(f.rv)
		csr.Spec.Username = req.user
		f.made = append(f.made, csr.DeepCopy())
		if f.deny {
			csr.Status.Conditions = []certsv1.CertificateSigningRequestCondition{{Type: certsv1.CertificateDenied, Status: "True", Reason: "NotThisOne", Message: "denied by the test"}}
		} else {
			block, _ := pem.Decode(csr.Spec.Request)
			cr, err := x509.ParseCertificateRequest(block.Bytes)
			if err != nil {
				f.t.Errorf("request of %s: %v", csr.Name, err)
				return
			}
			now := f.clk()
			csr.Status.Conditions = []certsv1.CertificateSigningRequestCondition{{Type: certsv1.CertificateApproved, Status: "True", Reason: "Test"}}
			if csr.Spec.SignerName == certsv1.KubeletServingSignerName {
				csr.Status.Certificate = scSign(f.t, f.ca, cr, now.Add(-5*time.Minute), now.Add(f.lifeFor))
			} else {
				csr.Status.Certificate = bsSign(f.t, f.ca, cr.Subject, cr.PublicKey, now.Add(-5*time.Minute), now.Add(f.lifeFor))
			}
		}
		f.csrs[csr.Name] = csr
		bsReply(w, http.StatusCreated, csr)
	case r.Method == http.MethodGet && name != "" && !strings.Contains(name, "/"):
		csr, ok := f.csrs[name]
		if !ok {
			bsReply(w, http.StatusNotFound, &apierrors.NewNotFound(gr, name).ErrStatus)
			return
		}
		bsReply(w, http.StatusOK, csr)
	default:
		f.t.Errorf("unexpected request %s %s", r.Method, r.URL)
		bsReply(w, http.StatusNotFound, &apierrors.NewNotFound(gr, r.URL.Path).ErrStatus)
	}
}

func bsReply(w http.ResponseWriter, code int, obj runtime.Object) {
	switch o := obj.(type) {
	case *metav1.Status:
		o.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
		if o.Code == 0 {
			o.Code = int32(code)
		}
	case *certsv1.CertificateSigningRequest:
		o.TypeMeta = metav1.TypeMeta{Kind: "CertificateSigningRequest", APIVersion: "certificates.k8s.io/v1"}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(obj)
}

func (f *bsFake) requests() []bsRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

// created returns the requests created, as the client sent them (plus
// the requesting user).
func (f *bsFake) created() []*certsv1.CertificateSigningRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.made)
}

// count returns how many requests of method went to the request name.
func (f *bsFake) count(method, name string) int {
	n := 0
	for _, r := range f.requests() {
		if r.method == method && r.path == bsCSRPath+"/"+name {
			n++
		}
	}
	return n
}

// issued returns the certificate issued for the request name.
func (f *bsFake) issued(name string) *x509.Certificate {
	f.mu.Lock()
	defer f.mu.Unlock()
	csr := f.csrs[name]
	if csr == nil {
		f.t.Fatalf("no request %s", name)
	}
	block, _ := pem.Decode(csr.Status.Certificate)
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// whoami returns the serial number of the certificate client presents.
func (f *bsFake) whoami(t *testing.T, c *Client) string {
	t.Helper()
	var st metav1.Status
	if err := c.Core.Get().AbsPath("/whoami").Do(context.Background()).Into(&st); err != nil {
		t.Fatalf("whoami: %v", err)
	}
	return st.Message
}

// bsSign issues a client certificate for subject and pub from ca.
func bsSign(t testing.TB, ca *env.CA, subject pkix.Name, pub any, nb, na time.Time) []byte {
	t.Helper()
	return caSign(t, ca, &x509.Certificate{
		Subject: subject, NotBefore: nb, NotAfter: na,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, pub)
}

// caSign signs tmpl, with a random serial number, for pub with ca and
// returns the certificate in PEM.
func caSign(t testing.TB, ca *env.CA, tmpl *x509.Certificate, pub any) []byte {
	t.Helper()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 100))
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// bsCheckFiles checks that the certificate and key, and the kubeconfig
// naming them, are on disk with mode 0600 and hold issued, and that
// nothing else is in the certificate directory.
func bsCheckFiles(t *testing.T, dir, kc string, issued *x509.Certificate) {
	t.Helper()
	bsCheckFilesRenewing(t, dir, kc, issued, false)
}

// bsCheckFilesRenewing is bsCheckFiles while a renewal may be under way:
// its key may be there too, or being written.
func bsCheckFilesRenewing(t *testing.T, dir, kc string, issued *x509.Certificate, renewing bool) {
	t.Helper()
	pki := filepath.Join(dir, "pki")
	if fi, err := os.Stat(pki); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("certificate directory: %v %v", fi.Mode(), err)
	}
	certPath := filepath.Join(pki, "outpost-client-current.pem")
	for _, p := range []string{certPath, kc} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, err %v; want 0600", p, fi.Mode(), err)
		}
	}
	entries, _ := os.ReadDir(pki)
	for _, e := range entries {
		pending := strings.HasPrefix(strings.TrimPrefix(e.Name(), "."), "outpost-client.key.tmp")
		if e.Name() != "outpost-client-current.pem" && !(renewing && pending) {
			t.Errorf("%s left in the certificate directory", e.Name())
		}
	}
	rc, err := LoadKubeconfig(kc)
	if err != nil {
		t.Fatalf("written kubeconfig: %v", err)
	}
	if rc.CertFile != certPath || rc.KeyFile != certPath {
		t.Errorf("kubeconfig names %s and %s, want %s", rc.CertFile, rc.KeyFile, certPath)
	}
	cert, err := clientCertOf(rc)
	if err != nil {
		t.Fatalf("written certificate: %v", err)
	}
	if !cert.Leaf.Equal(issued) {
		t.Errorf("written certificate %s, want the issued %s", cert.Leaf.SerialNumber, issued.SerialNumber)
	}
}

// runUntilDone runs run until the test ends; done stops it and checks
// that run returned nil.
func runUntilDone(t *testing.T, run func(context.Context) error) (done func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- run(ctx) }()
	var once sync.Once
	done = func() {
		once.Do(func() {
			cancel()
			if err := <-ch; err != nil {
				t.Errorf("run: %v", err)
			}
		})
	}
	t.Cleanup(done)
	return done
}

// bsAsleep waits until the bootstrapper waits on the clock.
func bsAsleep(t *testing.T, clk *clocktest.Fake) {
	t.Helper()
	spinWait.Until(t, "bootstrapper waiting on the clock", func() bool { return clk.Waiters() > 0 })
}

// ---- against a real API server ----

// bsBootstrapUser is the bootstrap identity: what a bootstrap token
// authenticates as. The test API server's token file is fixed, so a client
// certificate stands in for the token.
const bsBootstrapUser = "system:bootstrap:abcdef"

// bsCluster is a real API server where the test plays the parts of
// kube-controller-manager: it approves and signs requests with the
// cluster CA.
type bsCluster struct {
	api   *env.APIServer
	admin *Client
}

// There is no kube-controller-manager: the test approves (or denies) and
// signs the requests itself, as the approver and the kubelet client
// signer would.
func TestBootstrapAPIServer(t *testing.T) {
	api := env.StartAPIServer(t)
	admin, err := NewClient(api.Config, "outpost-test-admin")
	if err != nil {
		t.Fatal(err)
	}
	c := &bsCluster{api: api, admin: admin}
	// What kubeadm binds for bootstrap tokens.
	c.raw(t, admin, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding",
		"metadata":{"name":"outpost-test-node-bootstrapper"},
		"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"system:node-bootstrapper"},
		"subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"Group","name":"system:bootstrappers"}]}`)
	t.Run("bootstraps and rotates", func(t *testing.T) { bsTestBootstrapsAndRotates(t, c) })
	t.Run("denied keeps retrying", func(t *testing.T) { bsTestDenied(t, c) })
}

// The bootstrap identity asks; once the request is approved and signed,
// the files are written and the config works as system:node:<name>. The
// short-lived certificate is renewed at once with the node identity, and
// the same client then presents the new one. A restart with the files in
// place makes no request.
func bsTestBootstrapsAndRotates(t *testing.T, c *bsCluster) {
	const name = "edge-boot"
	dir := t.TempDir()
	cfg := c.config(t, dir, name)
	log := &ndLog{}
	b, err := NewBootstrapper(cfg, BootstrapDeps{Clock: clock.Real{}, Log: slog.New(log)})
	if err != nil {
		t.Fatal(err)
	}
	done := runUntilDone(t, b.Run)

	csr := c.waitPending(t, name)
	checkCSR(t, csr, name, clientCSR, nil, nil)
	if csr.Spec.Username != bsBootstrapUser || !slices.Contains(csr.Spec.Groups, "system:bootstrappers") {
		t.Errorf("request made by %s %v, want the bootstrap identity", csr.Spec.Username, csr.Spec.Groups)
	}
	apiWait.Until(t, "requesting state", func() bool {
		st := b.State()
		return st.Phase == report.CertRequesting && st.CSR == csr.Name && strings.Contains(st.Reason, "waiting for approval")
	})
	c.approve(t, csr.Name)
	apiWait.Until(t, "approved state", func() bool { return strings.Contains(b.State().Reason, "waiting for the signer") })
	// Due for renewal at once: 91 % of its life is over.
	now := time.Now()
	first := c.sign(t, csr.Name, now.Add(-10*time.Minute), now.Add(time.Minute))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc, err := b.Wait(ctx)
	if err != nil {
		t.Fatalf("wait: %v (state %+v)", err, b.State())
	}
	// The renewal is due at once: its key may be on disk already.
	bsCheckFilesRenewing(t, dir, cfg.Kubeconfig, first, true)
	node, err := NewClient(rc, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	user, groups := c.whoami(t, node)
	if user != "system:node:"+name || !slices.Contains(groups, "system:nodes") {
		t.Errorf("config authenticates as %s %v", user, groups)
	}
	// The Node authorizer lets the node create and read its own Node.
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := node.Core.Post().Resource("nodes").Body(n).Do(ctx).Into(n); err != nil {
		t.Fatalf("create own node: %v", err)
	}
	if err := node.Core.Get().Resource("nodes").Name(name).Do(ctx).Into(n); err != nil {
		t.Fatalf("get own node: %v", err)
	}

	// Rotation: the node asks for itself.
	renewal := c.waitPending(t, name)
	if renewal.Name == csr.Name {
		t.Fatal("renewal reused the first request")
	}
	checkCSR(t, renewal, name, clientCSR, nil, nil)
	if renewal.Spec.Username != "system:node:"+name || !slices.Contains(renewal.Spec.Groups, "system:nodes") {
		t.Errorf("renewal requested by %s %v, want the node itself", renewal.Spec.Username, renewal.Spec.Groups)
	}
	c.approve(t, renewal.Name)
	// The extra group shows which certificate a request presented.
	second := c.sign(t, renewal.Name, now.Add(-time.Minute), now.Add(time.Hour), "outpost:rotated")
	apiWait.Until(t, "renewed certificate in use", func() bool { return b.State().NotAfter.Equal(second.NotAfter) })
	if _, groups := c.whoami(t, node); !slices.Contains(groups, "outpost:rotated") {
		t.Errorf("the client made before the renewal still presents the old certificate: groups %v", groups)
	}
	bsCheckFiles(t, dir, cfg.Kubeconfig, second)
	if st := b.State(); st.Phase != report.CertValid || st.CSR != renewal.Name || !st.Usable {
		t.Errorf("state %+v", st)
	}
	done()

	// Restart: the kubeconfig's certificate is valid, so no request.
	before := len(c.list(t))
	clk := clocktest.New(time.Now())
	again, err := NewBootstrapper(cfg, BootstrapDeps{Clock: clk, Log: slog.New(&ndLog{})})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-again.Ready():
	default:
		t.Fatalf("restart not ready with the stored certificate: %+v", again.State())
	}
	runUntilDone(t, again.Run)
	bsAsleep(t, clk)
	if after := len(c.list(t)); after != before {
		t.Errorf("restart made %d requests", after-before)
	}
	if st := again.State(); !st.NotAfter.Equal(second.NotAfter) {
		t.Errorf("restart uses a certificate until %s, want %s", st.NotAfter, second.NotAfter)
	}
	rc2, err := again.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node2, err := NewClient(rc2, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	if user, _ := c.whoami(t, node2); user != "system:node:"+name {
		t.Errorf("restarted config authenticates as %s", user)
	}
}

// A denied request does not end Run: the state says denied, the request
// is checked again with backoff (logged once), and after an administrator
// deletes it the node asks again and gets its certificate.
func bsTestDenied(t *testing.T, c *bsCluster) {
	const name = "edge-denied"
	dir := t.TempDir()
	cfg := c.config(t, dir, name)
	log := &ndLog{}
	b, err := NewBootstrapper(cfg, BootstrapDeps{Clock: clock.Real{}, Log: slog.New(log)})
	if err != nil {
		t.Fatal(err)
	}
	runUntilDone(t, b.Run)
	csr := c.waitPending(t, name)
	c.decide(t, csr.Name, certsv1.CertificateDenied, "NotOnOurSite")
	apiWait.Until(t, "denied state", func() bool {
		st := b.State()
		return st.Phase == report.CertDenied && st.CSR == csr.Name && strings.Contains(st.Reason, "NotOnOurSite")
	})
	apiWait.Until(t, "the denied request checked again", func() bool {
		n := 0
		for _, e := range c.api.AuditEvents(t) {
			if e.Verb == "get" && e.ObjectRef.Name == csr.Name && e.User.Username == bsBootstrapUser {
				n++
			}
		}
		return n >= 2
	})
	if got := log.matching("client certificate request denied"); len(got) != 1 {
		t.Errorf("denial logged %d times, want once: %q", len(got), got)
	}
	select {
	case <-b.Ready():
		t.Fatal("ready with a denied request")
	default:
	}
	if err := c.admin.Certificates.Delete().Resource("certificatesigningrequests").Name(csr.Name).Do(context.Background()).Error(); err != nil {
		t.Fatal(err)
	}
	again := c.waitPending(t, name)
	if again.Name != csr.Name {
		t.Errorf("asked again as %s, want the same request %s", again.Name, csr.Name)
	}
	c.approve(t, again.Name)
	now := time.Now()
	cert := c.sign(t, again.Name, now.Add(-time.Minute), now.Add(time.Hour))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := b.Wait(ctx); err != nil {
		t.Fatalf("wait: %v (state %+v)", err, b.State())
	}
	bsCheckFiles(t, dir, cfg.Kubeconfig, cert)
}

// config is a BootstrapConfig for node under dir, with a bootstrap
// kubeconfig for bsBootstrapUser.
func (c *bsCluster) config(t *testing.T, dir, node string) BootstrapConfig {
	t.Helper()
	certPEM, keyPEM, err := c.api.CA.Issue(pkix.Name{CommonName: bsBootstrapUser, Organization: []string{"system:bootstrappers"}}, nil, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		t.Fatal(err)
	}
	boot := filepath.Join(dir, "bootstrap.kubeconfig")
	if err := env.WriteKubeconfig(boot, c.api.URL, c.api.CA.CertPEM(), bsBootstrapUser, "", certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	return BootstrapConfig{NodeName: node, Kubeconfig: filepath.Join(dir, "kubeconfig"), BootstrapKubeconfig: boot, CertDir: filepath.Join(dir, "pki"), UserAgent: "outpost-test"}
}

func (c *bsCluster) list(t *testing.T) []certsv1.CertificateSigningRequest {
	t.Helper()
	var l certsv1.CertificateSigningRequestList
	if err := c.admin.Certificates.Get().Resource("certificatesigningrequests").Do(context.Background()).Into(&l); err != nil {
		t.Fatalf("list csrs: %v", err)
	}
	return l.Items
}

// waitPending returns the undecided request for node's certificate.
func (c *bsCluster) waitPending(t *testing.T, node string) *certsv1.CertificateSigningRequest {
	t.Helper()
	var found *certsv1.CertificateSigningRequest
	apiWait.Until(t, "a request for "+node, func() bool {
		for _, csr := range c.list(t) {
			if len(csr.Status.Conditions) > 0 {
				continue
			}
			block, _ := pem.Decode(csr.Spec.Request)
			if block == nil {
				continue
			}
			if cr, err := x509.ParseCertificateRequest(block.Bytes); err == nil && cr.Subject.CommonName == "system:node:"+node {
				found = &csr
				return true
			}
		}
		return false
	})
	return found
}

func (c *bsCluster) get(t *testing.T, name string) *certsv1.CertificateSigningRequest {
	t.Helper()
	var csr certsv1.CertificateSigningRequest
	if err := c.admin.Certificates.Get().Resource("certificatesigningrequests").Name(name).Do(context.Background()).Into(&csr); err != nil {
		t.Fatalf("get csr %s: %v", name, err)
	}
	return &csr
}

func (c *bsCluster) approve(t *testing.T, name string) {
	t.Helper()
	c.decide(t, name, certsv1.CertificateApproved, "OutpostTest")
}

// decide approves or denies the request, as `kubectl certificate` does.
func (c *bsCluster) decide(t *testing.T, name string, typ certsv1.RequestConditionType, reason string) {
	t.Helper()
	csr := c.get(t, name)
	csr.Status.Conditions = append(csr.Status.Conditions, certsv1.CertificateSigningRequestCondition{
		Type: typ, Status: corev1.ConditionTrue, Reason: reason, Message: "decided by the test",
	})
	if err := c.admin.Certificates.Put().Resource("certificatesigningrequests").Name(name).SubResource("approval").Body(csr).Do(context.Background()).Error(); err != nil {
		t.Fatalf("%s csr %s: %v", typ, name, err)
	}
}

// sign issues the request's certificate from the cluster CA, valid from
// nb to na, with the request's subject plus extraGroups, and returns it.
func (c *bsCluster) sign(t *testing.T, name string, nb, na time.Time, extraGroups ...string) *x509.Certificate {
	t.Helper()
	return c.signWith(t, name, func(cr *x509.CertificateRequest) []byte {
		subject := cr.Subject
		subject.Organization = append(slices.Clone(subject.Organization), extraGroups...)
		return bsSign(t, c.api.CA, subject, cr.PublicKey, nb, na)
	})
}

// signWith issues the CSR name with the certificate sign makes of its
// request, and returns that certificate.
func (c *bsCluster) signWith(t *testing.T, name string, sign func(*x509.CertificateRequest) []byte) *x509.Certificate {
	t.Helper()
	csr := c.get(t, name)
	block, _ := pem.Decode(csr.Spec.Request)
	cr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := sign(cr)
	csr.Status.Certificate = certPEM
	if err := c.admin.Certificates.Put().Resource("certificatesigningrequests").Name(name).SubResource("status").Body(csr).Do(context.Background()).Error(); err != nil {
		t.Fatalf("sign csr %s: %v", name, err)
	}
	cb, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// whoami asks the API server who client is (a SelfSubjectReview).
func (c *bsCluster) whoami(t *testing.T, client *Client) (user string, groups []string) {
	t.Helper()
	out := c.raw(t, client, "/apis/authentication.k8s.io/v1/selfsubjectreviews", `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`)
	var r struct {
		Status struct {
			UserInfo struct {
				Username string   `json:"username"`
				Groups   []string `json:"groups"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("selfsubjectreview %s: %v", out, err)
	}
	return r.Status.UserInfo.Username, r.Status.UserInfo.Groups
}

// raw POSTs a JSON body for a group outside our scheme.
func (c *bsCluster) raw(t *testing.T, client *Client, path, body string) []byte {
	t.Helper()
	out, err := client.Core.Post().AbsPath(path).SetHeader("Content-Type", "application/json").SetHeader("Accept", "application/json").
		Body([]byte(body)).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("post %s: %v: %s", path, err, out)
	}
	return out
}
