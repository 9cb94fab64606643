package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/promtext"
)

// fakeNode runs "commands" in memory: echo prints its arguments, exit N
// exits with N, cat copies stdin to stdout.
type fakeNode struct {
	pods []*corev1.Pod
}

func (f *fakeNode) Pods() []*corev1.Pod {
	out := make([]*corev1.Pod, len(f.pods))
	for i, p := range f.pods {
		out[i] = p.DeepCopy()
	}
	return out
}

func (f *fakeNode) Exec(ctx context.Context, uid, container string, cmd []string, s Streams) (int, error) {
	switch cmd[0] {
	case "echo":
		fmt.Fprintln(s.Stdout, strings.Join(cmd[1:], " "))
		return 0, nil
	case "exit":
		var n int
		fmt.Sscan(cmd[1], &n)
		if s.Stderr != nil {
			fmt.Fprintln(s.Stderr, "exiting")
		}
		return n, nil
	case "cat":
		io.Copy(s.Stdout, s.Stdin)
		return 0, nil
	}
	return 0, errors.New("no such command")
}

func (f *fakeNode) Attach(ctx context.Context, uid, container string, s Streams) error {
	io.Copy(s.Stdout, s.Stdin)
	return nil
}

func (f *fakeNode) PortForward(ctx context.Context, uid string, port int32, stream io.ReadWriteCloser) error {
	fmt.Fprintf(stream, "port %d\n", port)
	return nil
}

// fakeReviewer accepts token "good" as alice and allows alice only.
type fakeReviewer struct {
	mu      sync.Mutex
	down    bool
	reviews int
	asked   []string
}

func (r *fakeReviewer) ReviewToken(ctx context.Context, token string) (User, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return User{}, false, errors.New("connection refused")
	}
	r.reviews++
	if token == "good" {
		return User{Name: "alice", Groups: []string{"devs"}}, true, nil
	}
	return User{}, false, nil
}

func (r *fakeReviewer) Authorize(ctx context.Context, u User, verb, sub, node string) (bool, string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return false, "", errors.New("connection refused")
	}
	r.asked = append(r.asked, u.Name+" "+verb+" "+sub+" "+node)
	if u.Name == "alice" {
		return true, "", nil
	}
	return false, "no RBAC policy matched", nil
}

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T) *testCA {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &testCA{c, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) client(t *testing.T, cn string, groups ...string) tls.Certificate {
	return ca.clientValid(t, cn, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), groups...)
}

// clientValid is a client certificate valid from notBefore to notAfter.
func (ca *testCA) clientValid(t *testing.T, cn string, notBefore, notAfter time.Time, groups ...string) tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn, Organization: groups},
		NotBefore: notBefore, NotAfter: notAfter,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (h *harness) caPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(h.ca.cert)
	return p
}

type harness struct {
	t    *testing.T
	url  string
	ca   *testCA
	rev  *fakeReviewer
	logs string
	node *fakeNode
}

func start(t *testing.T, standalone bool) *harness {
	t.Helper()
	dir := t.TempDir()
	ca := newCA(t)
	caFile := filepath.Join(dir, "ca.crt")
	os.WriteFile(caFile, ca.pem, 0o644)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "httpd"}}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "httpd", ContainerID: "containerd://c1",
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}}
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "secret-pod", UID: "u2"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}}
	h := &harness{t: t, ca: ca, logs: filepath.Join(dir, "logs"), node: &fakeNode{pods: []*corev1.Pod{pod, other}}}
	logDir := filepath.Join(h.logs, "default_web_u1", "httpd")
	os.MkdirAll(logDir, 0o755)
	now := time.Now().UTC()
	var b bytes.Buffer
	for i := 1; i <= 5; i++ {
		fmt.Fprintf(&b, "%s stdout F line %d\n", now.Add(time.Duration(i-10)*time.Minute).Format(time.RFC3339Nano), i)
	}
	os.WriteFile(filepath.Join(logDir, "1.log"), b.Bytes(), 0o644)
	os.WriteFile(filepath.Join(logDir, "0.log"), []byte(now.Add(-time.Hour).Format(time.RFC3339Nano)+" stderr F before restart\n"), 0o644)
	deps := Deps{Node: h.node, Clock: clock.Real{}, Log: slog.New(slog.DiscardHandler),
		Metrics: func(p *promtext.Writer) { p.Family("outpost_up", "Up.", promtext.Gauge); p.Sample("outpost_up", 1) }}
	if !standalone {
		h.rev = &fakeReviewer{}
		deps.Reviewer = h.rev
	}
	s, err := New(Config{NodeName: "n1", CertDir: filepath.Join(dir, "pki"), Hosts: []string{"n1", "127.0.0.1"},
		ClientCAFile: caFile, LocalGroups: []string{"system:masters"}, LogDir: h.logs}, deps)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, s)
	h.url = "https://" + addr
	return h
}

// serve runs s on a loopback port, with its configured or self-signed
// certificate, until the test ends, and returns its address and that
// certificate.
func serve(t *testing.T, s *Server) (string, tls.Certificate) {
	t.Helper()
	cert, err := s.servingCert()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln, cert) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String(), cert
}

// get makes a request with a client certificate (cert non-nil) or a
// bearer token, and returns status and body.
func (h *harness) do(method, path string, cert *tls.Certificate, token string) (int, string) {
	h.t.Helper()
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	if cert != nil {
		tr.TLSClientConfig.Certificates = []tls.Certificate{*cert}
	}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest(method, h.url+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestAuth(t *testing.T) {
	h := start(t, false)
	admin := h.ca.client(t, "admin", "system:masters")
	bob := h.ca.client(t, "bob")
	other := newCA(t).client(t, "mallory", "system:masters")
	cases := []struct {
		name   string
		cert   *tls.Certificate
		token  string
		path   string
		status int
		body   string
	}{
		{"no credentials", nil, "", "/pods", 401, "Unauthorized"},
		{"certificate of another CA", &other, "", "/pods", 401, "certificate signed by unknown authority"},
		{"bad token", nil, "bad", "/pods", 401, "Unauthorized"},
		{"good token", nil, "good", "/healthz", 200, "ok"},
		{"certificate, denied", &bob, "", "/metrics", 403, "Forbidden (user=bob, verb=get, resource=nodes, subresource=metrics)"},
		{"certificate, admin group is not enough online", &admin, "", "/pods", 403, "no RBAC policy matched"},
	}
	for _, c := range cases {
		status, body := h.do("GET", c.path, c.cert, c.token)
		if status != c.status || !strings.Contains(body, c.body) {
			t.Errorf("%s: got %d %q, want %d containing %q", c.name, status, body, c.status, c.body)
		}
	}
	h.rev.mu.Lock()
	asked := strings.Join(h.rev.asked, "\n")
	h.rev.mu.Unlock()
	for _, want := range []string{"alice get healthz n1", "bob get metrics n1", "admin get pods n1", "admin get proxy n1"} {
		if !strings.Contains(asked, want) {
			t.Errorf("reviews asked:\n%s\nwant %q", asked, want)
		}
	}
	// Cached: the token is not reviewed again.
	h.do("GET", "/healthz", nil, "good")
	if h.rev.reviews != 2 {
		t.Errorf("token reviews = %d, want 2 (good and bad once each)", h.rev.reviews)
	}
	// Offline: the cached decision for alice stands, tokens not yet
	// cached fail closed, an admin certificate gets in by its group.
	h.rev.mu.Lock()
	h.rev.down = true
	h.rev.mu.Unlock()
	if status, body := h.do("GET", "/pods", nil, "other-token"); status != 401 {
		t.Errorf("offline, new token: %d %q, want 401", status, body)
	}
	if status, body := h.do("GET", "/pods", &admin, ""); status != 403 {
		// admin's denial within the day stands.
		t.Errorf("offline, admin denied earlier: %d %q, want 403", status, body)
	}
	admin2 := h.ca.client(t, "root", "system:masters")
	if status, body := h.do("GET", "/healthz", &admin2, ""); status != 200 {
		t.Errorf("offline, admin certificate: %d %q, want 200", status, body)
	}
	// bob was never asked about healthz: kubelet answers an authorizer
	// error with 500, not a denial.
	if status, body := h.do("GET", "/healthz", &bob, ""); status != 500 || !strings.Contains(body, "Authorization error (user=bob, verb=get, resource=nodes, subresource=proxy)") {
		t.Errorf("offline, certificate outside the local groups: %d %q, want 500", status, body)
	}
	// bob's metrics denial within the day stands.
	if status, body := h.do("GET", "/metrics", &bob, ""); status != 403 {
		t.Errorf("offline, bob denied earlier: %d %q, want 403", status, body)
	}
}

// TestAuthenticateLikeKubelet: a certificate that does not verify (an
// unknown CA, expired) is a 401, not a failed handshake; a valid token
// beside it still gets in, as with kubelet's union of authenticators;
// anonymous never stands in for a bad certificate.
func TestAuthenticateLikeKubelet(t *testing.T) {
	h := start(t, false)
	other := newCA(t).client(t, "mallory", "system:masters")
	expired := h.ca.clientValid(t, "old", time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour), "system:masters")
	cases := []struct {
		name   string
		cert   *tls.Certificate
		token  string
		status int
		body   string
	}{
		{"expired certificate", &expired, "", 401, "certificate has expired"},
		{"certificate of another CA", &other, "", 401, "unknown authority"},
		{"certificate of another CA and a good token", &other, "good", 200, "ok"},
		{"expired certificate and a bad token", &expired, "bad", 401, "Unauthorized"},
	}
	for _, c := range cases {
		status, body := h.do("GET", "/healthz", c.cert, c.token)
		if status != c.status || !strings.Contains(body, c.body) {
			t.Errorf("%s: got %d %q, want %d containing %q", c.name, status, body, c.status, c.body)
		}
	}
	g := NewGuard(GuardConfig{ClientCAs: h.caPool(), Anonymous: true}, GuardDeps{Reviewer: h.rev, Clock: clock.Real{}, Log: slog.New(slog.DiscardHandler)})
	leaf, _ := x509.ParseCertificate(expired.Certificate[0])
	r, _ := http.NewRequest("GET", "/healthz", nil)
	r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}
	if status, msg := g.Check(r, "n1"); status != 401 {
		t.Errorf("anonymous allowed, expired certificate: %d %q, want 401", status, msg)
	}
}

func TestStandalone(t *testing.T) {
	h := start(t, true)
	admin := h.ca.client(t, "admin", "system:masters")
	bob := h.ca.client(t, "bob")
	if status, body := h.do("GET", "/pods", &admin, ""); status != 200 || !strings.Contains(body, `"name":"web"`) {
		t.Errorf("admin /pods: %d %q", status, body)
	}
	if status, body := h.do("GET", "/pods", &bob, ""); status != 403 || !strings.Contains(body, "server.localGroups") {
		t.Errorf("bob /pods: %d %q", status, body)
	}
	if status, body := h.do("GET", "/pods", nil, "good"); status != 401 || !strings.Contains(body, "standalone") {
		t.Errorf("token /pods: %d %q", status, body)
	}
}

func TestLogs(t *testing.T) {
	h := start(t, true)
	admin := h.ca.client(t, "admin", "system:masters")
	cases := []struct {
		path   string
		status int
		body   string
	}{
		{"/containerLogs/default/web/httpd", 200, "line 1\nline 2\nline 3\nline 4\nline 5\n"},
		{"/containerLogs/default/web/httpd?tailLines=2", 200, "line 4\nline 5\n"},
		{"/containerLogs/default/web/httpd?limitBytes=8", 200, "line 1\nl"},
		{"/containerLogs/default/web/httpd?sinceSeconds=420", 200, "line 4\nline 5\n"},
		{"/containerLogs/default/web/httpd?previous=true", 200, "before restart\n"},
		{"/containerLogs/default/web/httpd?tailLines=x", 400, `tailLines: "x" is not an integer`},
		{"/containerLogs/default/web/httpd?tailLines=-1", 400, "tailLines: -1 is less than 0"},
		{"/containerLogs/default/web/httpd?limitBytes=0", 400, "limitBytes: 0 is less than 1"},
		{"/containerLogs/default/web/httpd?follow=maybe", 400, `follow: "maybe" is not true or false`},
		{"/containerLogs/default/web/httpd?sinceTime=yesterday", 400, "sinceTime"},
		{"/containerLogs/default/web/httpd?sinceSeconds=5&sinceTime=2026-01-01T00:00:00Z", 400, "only one of sinceSeconds and sinceTime"},
		{"/containerLogs/default/web/nginx", 404, `container "nginx" is not in pod default/web`},
		{"/containerLogs/default/nope/httpd", 404, "pod default/nope is not on this node"},
		{"/containerLogs/kube-system/secret-pod/main", 400, "has no log yet"},
		{"/containerLogs/default/web/..%2f..%2fkube-system_secret-pod_u2%2fmain", 400, `a ".." segment`},
	}
	for _, c := range cases {
		status, body := h.do("GET", c.path, &admin, "")
		if status != c.status || !strings.Contains(body, c.body) {
			t.Errorf("%s: got %d %q, want %d containing %q", c.path, status, body, c.status, c.body)
		}
	}
	status, body := h.do("GET", "/containerLogs/default/web/httpd?timestamps=1&tailLines=1", &admin, "")
	if status != 200 || !strings.HasSuffix(body, " line 5\n") || len(body) < 20 {
		t.Errorf("timestamps: %d %q", status, body)
	}
}

// TestLogEndsApartFromItsLastByte: a finished log comes chunked, and a
// reader that reads its last bytes does not get the end of the body in the
// same read. The API server's websocket log copier drops the bytes of a
// read that also returns io.EOF, so such a log would reach a websocket
// client (kubectl logs over websockets) empty.
func TestLogEndsApartFromItsLastByte(t *testing.T) {
	h := start(t, true)
	admin := h.ca.client(t, "admin", "system:masters")
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{admin}}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(h.url + "/containerLogs/default/web/httpd?tailLines=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ContentLength != -1 || !slices.Equal(resp.TransferEncoding, []string{"chunked"}) {
		t.Errorf("content length %d, transfer encoding %q; want chunked", resp.ContentLength, resp.TransferEncoding)
	}
	buf := make([]byte, 4096)
	n, err := resp.Body.Read(buf)
	if string(buf[:n]) != "line 5\n" || err != nil {
		t.Errorf("first read = %q, %v; want the whole log and no error", buf[:n], err)
	}
	if n, err := resp.Body.Read(buf); n != 0 || err != io.EOF {
		t.Errorf("second read = %d, %v; want the end alone", n, err)
	}
}

func TestPodsAndMetrics(t *testing.T) {
	h := start(t, true)
	admin := h.ca.client(t, "admin", "system:masters")
	status, body := h.do("GET", "/pods", &admin, "")
	var list corev1.PodList
	if status != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list.Items) != 2 || list.Kind != "PodList" {
		t.Errorf("/pods: %d %q", status, body)
	}
	status, body = h.do("GET", "/metrics", &admin, "")
	if status != 200 || !strings.Contains(body, "outpost_up 1") {
		t.Errorf("/metrics: %d %q", status, body)
	}
	if status, _ := h.do("GET", "/metrics/resource", &admin, ""); status != 404 {
		t.Errorf("/metrics/resource with no Resources: %d", status)
	}
	if status, _ := h.do("GET", "/nothing", &admin, ""); status != 404 {
		t.Errorf("/nothing: %d", status)
	}
}

func TestExec(t *testing.T) {
	h := start(t, true)
	admin := h.ca.client(t, "admin", "system:masters")
	u, _ := url.Parse(h.url)
	cfg := &rest.Config{Host: u.Host, TLSClientConfig: rest.TLSClientConfig{Insecure: true,
		CertData: pemCert(admin), KeyData: pemKey(t, admin)}}
	exec := func(query string, stdin io.Reader) (string, string, error) {
		eu, _ := url.Parse(h.url + "/exec/default/web/httpd?" + query)
		ex, err := remotecommand.NewSPDYExecutor(cfg, "POST", eu)
		if err != nil {
			t.Fatal(err)
		}
		// The streams must be the ones the query asks for, as kubectl
		// makes them: the server counts what it receives.
		var out, errOut bytes.Buffer
		opts := remotecommand.StreamOptions{Stdin: stdin, Stdout: &out}
		if strings.Contains(query, "error=1") {
			opts.Stderr = &errOut
		}
		err = ex.StreamWithContext(context.Background(), opts)
		return out.String(), errOut.String(), err
	}
	out, _, err := exec("command=echo&command=hello&command=world&output=1", nil)
	if err != nil || out != "hello world\n" {
		t.Errorf("echo: %q %v", out, err)
	}
	_, errOut, err := exec("command=exit&command=3&output=1&error=1", nil)
	var code interface{ ExitStatus() int }
	if !errors.As(err, &code) || code.ExitStatus() != 3 || errOut != "exiting\n" {
		t.Errorf("exit 3: %v %q", err, errOut)
	}
	out, _, err = exec("command=cat&input=1&output=1", strings.NewReader("typed\n"))
	if err != nil || out != "typed\n" {
		t.Errorf("cat: %q %v", out, err)
	}
	// WebSocket too, in the versions kubelet's streaming server speaks
	// (v4.channel.k8s.io; an API server turns kubectl's v5 into SPDY
	// towards nodes).
	wu := h.url + "/exec/default/web/httpd?command=exit&command=5&output=1&error=1"
	ws, err := remotecommand.NewWebSocketExecutorForProtocols(cfg, "GET", wu, "v4.channel.k8s.io")
	if err != nil {
		t.Fatal(err)
	}
	var wout, werr bytes.Buffer
	err = ws.StreamWithContext(context.Background(), remotecommand.StreamOptions{Stdout: &wout, Stderr: &werr})
	if !errors.As(err, &code) || code.ExitStatus() != 5 || werr.String() != "exiting\n" {
		t.Errorf("websocket exit 5: %v %q", err, werr.String())
	}
	if status, body := h.do("POST", "/exec/default/web/httpd?output=1", &admin, ""); status != 400 || !strings.Contains(body, "command") {
		t.Errorf("no command: %d %q", status, body)
	}
	if status, body := h.do("POST", "/run/default/web/httpd?cmd=echo+hi", &admin, ""); status != 200 || body != "hi\n" {
		t.Errorf("run: %d %q", status, body)
	}
}

func pemCert(c tls.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]})
}

func pemKey(t *testing.T, c tls.Certificate) []byte {
	der, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

func TestSelfSignedKept(t *testing.T) {
	dir := t.TempDir()
	s := &Server{cfg: Config{NodeName: "n1", CertDir: dir, Hosts: []string{"n1", "10.0.0.1"}}, deps: Deps{Clock: clock.Real{}, Log: slog.New(slog.DiscardHandler)}}
	c1, err := s.servingCert()
	if err != nil {
		t.Fatal(err)
	}
	c2, _ := s.servingCert()
	if !bytes.Equal(c1.Certificate[0], c2.Certificate[0]) {
		t.Error("a valid self-signed certificate was made anew")
	}
	s.cfg.Hosts = []string{"n1", "10.0.0.2"}
	c3, _ := s.servingCert()
	leaf, _ := x509.ParseCertificate(c3.Certificate[0])
	if bytes.Equal(c1.Certificate[0], c3.Certificate[0]) || !leaf.IPAddresses[0].Equal(net.ParseIP("10.0.0.2")) {
		t.Error("a new address did not make a new certificate")
	}
}

// The certificate Deps.ServingCert returns is served from the next
// handshake on, with or without a server name in the hello; when it
// returns nil the certificate given to Serve is.
func TestServingCertSwapped(t *testing.T) {
	var issued atomic.Pointer[tls.Certificate]
	s, err := New(Config{NodeName: "n1", CertDir: t.TempDir(), Hosts: []string{"n1", "127.0.0.1"}},
		Deps{Node: &fakeNode{}, Clock: clock.Real{}, Log: slog.New(slog.DiscardHandler), ServingCert: issued.Load})
	if err != nil {
		t.Fatal(err)
	}
	addr, fallback := serve(t, s)
	served := func(serverName string) []byte {
		t.Helper()
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, ServerName: serverName})
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Raw
	}
	newCert := func() *tls.Certificate {
		certPEM, keyPEM, err := selfSigned("n1", []string{"n1"}, nil, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return &c
	}
	first, second := newCert(), newCert()
	for _, step := range []struct {
		name string
		set  *tls.Certificate
		want []byte
	}{
		{"none issued", nil, fallback.Certificate[0]},
		{"issued", first, first.Certificate[0]},
		{"renewed", second, second.Certificate[0]},
		{"expired", nil, fallback.Certificate[0]},
	} {
		issued.Store(step.set)
		for _, sni := range []string{"", "n1"} {
			if got := served(sni); !bytes.Equal(got, step.want) {
				t.Errorf("%s, server name %q: served another certificate", step.name, sni)
			}
		}
	}
}

func TestPortForward(t *testing.T) {
	h := start(t, true)
	admin := h.ca.client(t, "admin", "system:masters")
	cfg := &rest.Config{TLSClientConfig: rest.TLSClientConfig{Insecure: true, CertData: pemCert(admin), KeyData: pemKey(t, admin)}}
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(h.url + "/portForward/default/web")
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, "POST", u)
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.New(dialer, []string{"0:8080"}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	defer func() { close(stop); <-errc }()
	select {
	case <-ready:
	case err := <-errc:
		t.Fatalf("forward: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("port forward not ready")
	}
	ports, _ := fw.GetPorts()
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0].Local))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	line, _ := io.ReadAll(io.LimitReader(c, 10))
	if string(line) != "port 8080\n" {
		t.Errorf("through the forward: %q", line)
	}
}

// TestOversized: a request line or headers past 64 KiB get 431, before
// any authentication, and the server goes on serving.
func TestOversized(t *testing.T) {
	h := start(t, true)
	admin := h.ca.client(t, "admin", "system:masters")
	status, _ := h.do("GET", "/containerLogs/default/web/httpd?tailLines="+strings.Repeat("9", 100<<10), &admin, "")
	if status != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("100 KiB query: %d, want 431", status)
	}
	if status, body := h.do("GET", "/healthz", &admin, ""); status != 200 {
		t.Errorf("after it: %d %q", status, body)
	}
}

// TestUncleanPathRefused: a path with . or .. segments is a 400 after
// authentication, not the mux's redirect to a path the Guard did not
// authorize; nothing runs.
func TestUncleanPathRefused(t *testing.T) {
	h := start(t, true)
	admin := h.ca.client(t, "admin", "system:masters")
	for _, p := range []string{
		"/stats/../run/default/web/httpd?cmd=echo+ran",
		"/stats/%2E%2E/run/default/web/httpd?cmd=echo+ran",
		"/run/default/web/./httpd?cmd=echo+ran",
		"/run//default/web/httpd?cmd=echo+ran",
	} {
		status, body := h.do("POST", p, &admin, "")
		if status != 400 || !strings.Contains(body, "segment") || strings.Contains(body, "ran") {
			t.Errorf("POST %s: %d %q, want 400 naming the segment", p, status, body)
		}
	}
	if status, body := h.do("POST", "/run/default/web/httpd?cmd=echo+ran", &admin, ""); status != 200 || body != "ran\n" {
		t.Errorf("clean path: %d %q", status, body)
	}
	if status, _ := h.do("GET", "/stats/../pods", nil, ""); status != 401 {
		t.Errorf("unclean path without credentials: %d, want 401 first", status)
	}
}

// startWith serves a node with the pod default/web (container httpd),
// standalone, with cfg's timeouts, and returns its address and an admin
// certificate.
func startWith(t *testing.T, cfg Config) (string, tls.Certificate) {
	t.Helper()
	dir := t.TempDir()
	ca := newCA(t)
	cfg.NodeName, cfg.CertDir, cfg.ClientCAFile, cfg.LocalGroups = "n1", dir, filepath.Join(dir, "ca.crt"), []string{"system:masters"}
	os.WriteFile(cfg.ClientCAFile, ca.pem, 0o644)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "httpd"}}}}
	s, err := New(cfg, Deps{Node: &fakeNode{pods: []*corev1.Pod{pod}}, Clock: clock.Real{}, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, s)
	return addr, ca.client(t, "admin", "system:masters")
}

// rawRequest sends req on a new connection and returns the connection,
// a reader after the answer's headers, and the answer.
func rawRequest(t *testing.T, addr string, cert tls.Certificate, req string) (*tls.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	io.WriteString(conn, req)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return conn, br, resp
}

// closedWithin reports whether the server closes conn within d.
func closedWithin(conn net.Conn, br *bufio.Reader, d time.Duration) bool {
	conn.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, br)
	return !errors.Is(err, os.ErrDeadlineExceeded)
}

// TestIdleConnectionClosed: a kept-alive connection with no next request
// is closed after IdleTimeout, so idle clients cannot hold descriptors.
func TestIdleConnectionClosed(t *testing.T) {
	addr, admin := startWith(t, Config{IdleTimeout: 300 * time.Millisecond})
	conn, br, resp := rawRequest(t, addr, admin, "GET /healthz HTTP/1.1\r\nHost: n1\r\n\r\n")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if !closedWithin(conn, br, 10*time.Second) {
		t.Error("an idle connection stayed open 10 s, with a 300 ms idle timeout")
	}
}

// TestUpgradeWithoutStreamsClosed: a client that upgrades an exec or
// attach and opens no streams loses its connection after the stream
// creation timeout; the streaming code left it open until the stream
// idle timeout (4 h). (A port-forward with no streams is one waiting for
// its first local connection: the idle timeout is its limit.)
func TestUpgradeWithoutStreamsClosed(t *testing.T) {
	addr, admin := startWith(t, Config{StreamCreationTimeout: 300 * time.Millisecond})
	for _, c := range []struct{ path, proto string }{
		{"/exec/default/web/httpd?command=echo&command=ran&output=1", "v4.channel.k8s.io"},
		{"/attach/default/web/httpd?output=1", "v4.channel.k8s.io"},
	} {
		conn, br, resp := rawRequest(t, addr, admin, "POST "+c.path+" HTTP/1.1\r\nHost: n1\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"+
			"X-Stream-Protocol-Version: "+c.proto+"\r\nContent-Length: 0\r\n\r\n")
		if resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("%s: %s, want 101", c.path, resp.Status)
		}
		if !closedWithin(conn, br, 10*time.Second) {
			t.Errorf("%s: upgraded without streams, still open after 10 s with a 300 ms stream creation timeout", c.path)
		}
	}
}

// TestWebSocketUnknownProtocol: a WebSocket exec or attach asking only
// for subprotocols the server does not speak gets a 403 that says so,
// not the streaming code's bare 403.
func TestWebSocketUnknownProtocol(t *testing.T) {
	addr, admin := startWith(t, Config{})
	for _, path := range []string{"/exec/default/web/httpd?command=echo&command=ran&output=1", "/attach/default/web/httpd?output=1"} {
		_, _, resp := rawRequest(t, addr, admin, "GET "+path+" HTTP/1.1\r\nHost: n1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: nope.example.com, v9.example.com\r\n\r\n")
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 403 || !strings.Contains(string(body), "nope.example.com, v9.example.com: not supported; the server speaks channel.k8s.io") {
			t.Errorf("%s: %d %q", path, resp.StatusCode, body)
		}
	}
}
