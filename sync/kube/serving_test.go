package kube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/internal/report"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// ---- unit tests ----

// scConfig is node n1's serving configuration under dir: names with
// duplicates, localhost and loopback addresses, which are left out.
func scConfig(dir string) ServingConfig {
	return ServingConfig{
		NodeName: "n1",
		DNSNames: []string{"n1", "localhost", "Pi-017", "n1"},
		IPs:      []net.IP{net.ParseIP("10.0.0.5"), net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP("10.0.0.5").To4()},
		CertDir:  filepath.Join(dir, "pki"),
	}
}

// What scConfig's certificate is for.
var (
	scWantNames = []string{"n1", "pi-017"}
	scWantIPs   = []string{"10.0.0.5"}
)

// A node without a serving certificate asks for one with its own
// identity, for the kubelet serving signer and its names; the issued
// certificate is served and kept on disk (0600), the request's key is
// gone.
func TestServingCertsRequestsAndStores(t *testing.T) {
	f := newBSFake(t)
	clk := clocktest.New(ndEpoch)
	dir := t.TempDir()
	s, log := f.servingCerts(t, dir, scConfig(dir), clk)
	if s.Current() != nil {
		t.Fatal("a certificate before any was issued")
	}
	if st := s.State(); st.Phase != report.CertRequesting || st.Usable || !strings.Contains(st.Reason, "no serving certificate") {
		t.Errorf("state before Run %+v", st)
	}
	runUntilDone(t, s.Run)
	spinWait.Until(t, "serving certificate", func() bool { return s.Current() != nil })
	csrs := f.created()
	if len(csrs) != 1 {
		t.Fatalf("%d requests created, want 1", len(csrs))
	}
	checkCSR(t, csrs[0], "n1", servingCSR, scWantNames, scWantIPs)
	if u := csrs[0].Spec.Username; u != "system:node:n1" {
		t.Errorf("request made by %q, want the node itself", u)
	}
	issued := f.issued(csrs[0].Name)
	leaf := s.Current().Leaf
	if !leaf.Equal(issued) {
		t.Errorf("serving %s, want the issued %s", leaf.SerialNumber, issued.SerialNumber)
	}
	scCheckLeaf(t, leaf, scWantNames, scWantIPs)
	scCheckFiles(t, dir, issued)
	if st := s.State(); st.Phase != report.CertValid || !st.Usable || st.CSR != csrs[0].Name || !st.RenewAt.Equal(renewalDeadline(issued, 0.5)) {
		t.Errorf("state %+v", st)
	}
	if got := log.matching("serving certificate in use"); len(got) != 1 {
		t.Errorf("logs %q", log.matching(""))
	}
}

// The certificate kept on disk is served at once when it is valid and
// for the node's names, whatever their order; otherwise a new one is
// requested.
func TestServingCertsLoadedAtStart(t *testing.T) {
	for _, tt := range []struct {
		name     string
		cn       string
		dns      []string
		ips      []string
		nb, na   time.Time
		garbage  bool
		wantWhy  string // "" when the kept certificate is used
		wantCSRs int
	}{
		{name: "valid", cn: "system:node:n1", dns: []string{"pi-017", "n1"}, ips: []string{"10.0.0.5"},
			nb: ndEpoch.Add(-time.Hour), na: ndEpoch.Add(99 * time.Hour)},
		{name: "address changed", cn: "system:node:n1", dns: scWantNames, ips: []string{"10.0.0.9"},
			nb: ndEpoch.Add(-time.Hour), na: ndEpoch.Add(99 * time.Hour), wantWhy: "is for 10.0.0.9,n1,pi-017, not 10.0.0.5,n1,pi-017", wantCSRs: 1},
		{name: "name added", cn: "system:node:n1", dns: []string{"n1"}, ips: scWantIPs,
			nb: ndEpoch.Add(-time.Hour), na: ndEpoch.Add(99 * time.Hour), wantWhy: "is for 10.0.0.5,n1, not", wantCSRs: 1},
		{name: "expired", cn: "system:node:n1", dns: scWantNames, ips: scWantIPs,
			nb: ndEpoch.Add(-100 * time.Hour), na: ndEpoch, wantWhy: "expired at 2026-03-01T12:00:00Z", wantCSRs: 1},
		{name: "another node", cn: "system:node:n2", dns: scWantNames, ips: scWantIPs,
			nb: ndEpoch.Add(-time.Hour), na: ndEpoch.Add(99 * time.Hour), wantWhy: "is for system:node:n2", wantCSRs: 1},
		{name: "not PEM", garbage: true, wantWhy: "outpost-serving-current.pem: tls:", wantCSRs: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newBSFake(t)
			clk := clocktest.New(ndEpoch)
			dir := t.TempDir()
			var kept *x509.Certificate
			if tt.garbage {
				scWriteFile(t, dir, []byte("not a certificate\n"))
			} else {
				kept = f.writeServing(t, dir, tt.cn, tt.dns, tt.ips, tt.nb, tt.na)
			}
			s, _ := f.servingCerts(t, dir, scConfig(dir), clk)
			st := s.State()
			if tt.wantWhy == "" {
				if cur := s.Current(); cur == nil || !cur.Leaf.Equal(kept) {
					t.Fatalf("kept certificate not served: state %+v", st)
				}
				if st.Phase != report.CertValid || !st.Usable || !st.RenewAt.Equal(tt.nb.Add(80*time.Hour)) {
					t.Errorf("state %+v", st)
				}
			} else {
				if s.Current() != nil {
					t.Fatal("kept certificate served")
				}
				if st.Phase != report.CertRequesting || st.Usable || !strings.Contains(st.Reason, tt.wantWhy) {
					t.Errorf("state %+v, want the reason to say %q", st, tt.wantWhy)
				}
			}
			done := runUntilDone(t, s.Run)
			if tt.wantCSRs > 0 {
				spinWait.Until(t, "new certificate", func() bool { return s.Current() != nil })
			}
			bsAsleep(t, clk)
			csrs := f.created()
			if len(csrs) != tt.wantCSRs {
				t.Fatalf("%d requests, want %d", len(csrs), tt.wantCSRs)
			}
			scCheckLeaf(t, s.Current().Leaf, scWantNames, scWantIPs)
			if tt.wantCSRs > 0 {
				checkCSR(t, csrs[0], "n1", servingCSR, scWantNames, scWantIPs)
				scCheckFiles(t, dir, f.issued(csrs[0].Name))
			}
			done()
		})
	}
}

// The certificate is renewed at its deadline, not before, and the new
// one is served from then on.
func TestServingCertsRenewsAtDeadline(t *testing.T) {
	f := newBSFake(t)
	clk := clocktest.New(ndEpoch)
	dir := t.TempDir()
	old := f.writeServing(t, dir, "system:node:n1", scWantNames, scWantIPs, ndEpoch, ndEpoch.Add(100*time.Hour))
	s, _ := f.servingCerts(t, dir, scConfig(dir), clk)
	runUntilDone(t, s.Run)
	bsAsleep(t, clk)
	clk.Advance(80*time.Hour - time.Minute)
	bsAsleep(t, clk)
	if n := len(f.created()); n != 0 {
		t.Fatalf("%d requests before the deadline", n)
	}
	if cur := s.Current(); cur == nil || !cur.Leaf.Equal(old) {
		t.Fatal("the kept certificate is not served before the deadline")
	}
	clk.Advance(2 * time.Minute)
	spinWait.Until(t, "renewal", func() bool { return !s.Current().Leaf.Equal(old) })
	csrs := f.created()
	if len(csrs) != 1 {
		t.Fatalf("%d requests, want 1", len(csrs))
	}
	issued := f.issued(csrs[0].Name)
	if !s.Current().Leaf.Equal(issued) {
		t.Error("the renewed certificate is not served")
	}
	scCheckFiles(t, dir, issued)
}

// While a renewal is denied the certificate in hand is served until it
// expires; then Current is nil, so the caller serves its self-signed
// certificate, and the denied request is still checked.
func TestServingCertsExpiresWhileDenied(t *testing.T) {
	f := newBSFake(t)
	f.deny = true
	clk := clocktest.New(ndEpoch)
	dir := t.TempDir()
	// 90 % of its life is over: due at once.
	f.writeServing(t, dir, "system:node:n1", scWantNames, scWantIPs, ndEpoch.Add(-90*time.Hour), ndEpoch.Add(10*time.Hour))
	s, log := f.servingCerts(t, dir, scConfig(dir), clk)
	runUntilDone(t, s.Run)
	spinWait.Until(t, "denied", func() bool { return s.State().Phase == report.CertDenied })
	if st := s.State(); !st.Usable || s.Current() == nil || !strings.Contains(st.Reason, "NotThisOne") {
		t.Errorf("denied renewal with a valid certificate: state %+v", st)
	}
	bsAsleep(t, clk)
	clk.Advance(10 * time.Hour)
	bsAsleep(t, clk)
	if s.Current() != nil {
		t.Error("an expired certificate is served")
	}
	if st := s.State(); st.Phase != report.CertDenied || st.Usable {
		t.Errorf("state after expiry %+v", st)
	}
	csrs := f.created()
	if len(csrs) != 1 {
		t.Fatalf("%d requests created while denied, want 1", len(csrs))
	}
	if n := f.count("GET", csrs[0].Name); n < 1 {
		t.Errorf("denied request read %d times, want it checked again", n)
	}
	if got := log.matching("serving certificate request denied"); len(got) != 1 {
		t.Errorf("denial logged %d times, want once: %q", len(got), got)
	}
}

// NewServingCerts refuses what cannot make a request the signer takes.
func TestNewServingCertsChecksConfig(t *testing.T) {
	f := newBSFake(t)
	dir := t.TempDir()
	client := f.nodeClient(t, dir)
	for _, tt := range []struct {
		name string
		cfg  ServingConfig
		deps ServingDeps
		want string
	}{
		{"only localhost", ServingConfig{NodeName: "n1", DNSNames: []string{"localhost"}, IPs: []net.IP{net.ParseIP("127.0.0.1"), net.IPv6zero}, CertDir: dir},
			ServingDeps{Client: client, Clock: clocktest.New(ndEpoch)}, "serving certificate of node n1: no DNS name or IP address other than localhost and loopback"},
		{"no client", ServingConfig{NodeName: "n1", DNSNames: []string{"n1"}, CertDir: dir},
			ServingDeps{Clock: clocktest.New(ndEpoch)}, "needs a client"},
		{"no directory", ServingConfig{NodeName: "n1", DNSNames: []string{"n1"}},
			ServingDeps{Client: client, Clock: clocktest.New(ndEpoch)}, "certificate directory"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewServingCerts(tt.cfg, tt.deps)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

// ---- unit test helpers ----

// nodeClient returns a Client of node n1 to the fake.
func (f *bsFake) nodeClient(t *testing.T, dir string) *Client {
	t.Helper()
	kc := f.nodeKubeconfig(t, dir, "n1", ndEpoch.Add(-time.Hour), ndEpoch.Add(365*24*time.Hour))
	rc, err := LoadKubeconfig(kc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(rc, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// servingCerts returns a ServingCerts of node n1 over the fake, with
// jitter 0.5.
func (f *bsFake) servingCerts(t *testing.T, dir string, cfg ServingConfig, clk *clocktest.Fake) (*ServingCerts, *ndLog) {
	t.Helper()
	f.clk = clk.Now
	log := &ndLog{}
	s, err := NewServingCerts(cfg, ServingDeps{Client: f.nodeClient(t, dir), Clock: clk, Log: slog.New(log), Jitter: func() float64 { return 0.5 }})
	if err != nil {
		t.Fatal(err)
	}
	return s, log
}

// writeServing keeps a serving certificate from the fake's CA for cn,
// names and addresses, valid from nb to na, where a ServingCerts of dir
// finds it.
func (f *bsFake) writeServing(t *testing.T, dir, cn string, dns, ips []string, nb, na time.Time) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cr := &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}}, DNSNames: dns, PublicKey: key.Public()}
	for _, ip := range ips {
		cr.IPAddresses = append(cr.IPAddresses, net.ParseIP(ip))
	}
	certPEM := scSign(t, f.ca, cr, nb, na)
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	scWriteFile(t, dir, append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})...))
	block, _ := pem.Decode(certPEM)
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func scWriteFile(t *testing.T, dir string, data []byte) {
	t.Helper()
	pki := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pki, "outpost-serving-current.pem"), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// scSign issues a serving certificate for the request cr from ca, as the
// kubelet serving signer does: cr's subject, names and addresses.
func scSign(t testing.TB, ca *env.CA, cr *x509.CertificateRequest, nb, na time.Time) []byte {
	t.Helper()
	return caSign(t, ca, &x509.Certificate{
		Subject: cr.Subject, NotBefore: nb, NotAfter: na,
		DNSNames: cr.DNSNames, IPAddresses: cr.IPAddresses,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, cr.PublicKey)
}

// scCheckLeaf checks that a served certificate is a serving certificate
// for names and ips.
func scCheckLeaf(t *testing.T, leaf *x509.Certificate, names, ips []string) {
	t.Helper()
	got := slices.Clone(leaf.DNSNames)
	slices.Sort(got)
	if gotIPs := ipStrings(leaf.IPAddresses); !slices.Equal(got, names) || !slices.Equal(gotIPs, ips) {
		t.Errorf("certificate for %q %q, want %q %q", got, gotIPs, names, ips)
	}
	if !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || leaf.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		t.Errorf("certificate usages %v %v, want server auth and digital signature", leaf.ExtKeyUsage, leaf.KeyUsage)
	}
}

// scCheckFiles checks that dir/pki holds issued and its key, mode 0600,
// and nothing else (no request key).
func scCheckFiles(t *testing.T, dir string, issued *x509.Certificate) {
	t.Helper()
	pki := filepath.Join(dir, "pki")
	path := filepath.Join(pki, "outpost-serving-current.pem")
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %v, err %v; want 0600", path, fi.Mode(), err)
	}
	entries, _ := os.ReadDir(pki)
	for _, e := range entries {
		if e.Name() != "outpost-serving-current.pem" {
			t.Errorf("%s left in the certificate directory", e.Name())
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(data, data)
	if err != nil {
		t.Fatalf("kept certificate: %v", err)
	}
	if !cert.Leaf.Equal(issued) {
		t.Errorf("kept certificate %s, want the issued %s", cert.Leaf.SerialNumber, issued.SerialNumber)
	}
}

// ---- against a real API server ----

// A node identity asks for a serving certificate; kube-apiserver takes
// the request (NodeRestriction, the Node authorizer), the test approves
// and signs it as an administrator and the kubelet serving signer would,
// and the certificate is served. A restart serves it from disk without a
// request; a new address makes a new request.
func TestServingCertsAPIServer(t *testing.T) {
	api := env.StartAPIServer(t)
	admin, err := NewClient(api.Config, "outpost-test-admin")
	if err != nil {
		t.Fatal(err)
	}
	c := &bsCluster{api: api, admin: admin}
	const name = "edge-serve"
	rc, err := LoadKubeconfig(api.NodeKubeconfig(t, name))
	if err != nil {
		t.Fatal(err)
	}
	node, err := NewClient(rc, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := ServingConfig{
		NodeName: name,
		DNSNames: []string{name, "localhost", "edge-serve.lan"},
		IPs:      []net.IP{net.ParseIP("10.20.0.7"), net.ParseIP("127.0.0.1")},
		CertDir:  filepath.Join(dir, "pki"),
	}
	wantNames, wantIPs := []string{name, "edge-serve.lan"}, []string{"10.20.0.7"}
	s, err := NewServingCerts(cfg, ServingDeps{Client: node, Clock: clock.Real{}, Log: slog.New(&ndLog{})})
	if err != nil {
		t.Fatal(err)
	}
	done := runUntilDone(t, s.Run)

	csr := c.waitPending(t, name)
	checkCSR(t, csr, name, servingCSR, wantNames, wantIPs)
	if csr.Spec.Username != "system:node:"+name || !slices.Contains(csr.Spec.Groups, "system:nodes") {
		t.Errorf("request made by %s %v, want the node itself", csr.Spec.Username, csr.Spec.Groups)
	}
	apiWait.Until(t, "waiting for approval", func() bool {
		st := s.State()
		return st.Phase == report.CertRequesting && st.CSR == csr.Name && strings.Contains(st.Reason, "kubectl certificate approve "+csr.Name)
	})
	if s.Current() != nil {
		t.Fatal("a certificate before the request was signed")
	}
	c.approve(t, csr.Name)
	now := time.Now()
	issued := c.signServing(t, csr.Name, now.Add(-time.Minute), now.Add(time.Hour))
	apiWait.Until(t, "serving certificate", func() bool { return s.Current() != nil })
	leaf := s.Current().Leaf
	if !leaf.Equal(issued) {
		t.Errorf("serving %s, want the issued %s", leaf.SerialNumber, issued.SerialNumber)
	}
	scCheckLeaf(t, leaf, []string{"edge-serve", "edge-serve.lan"}, wantIPs)
	scCheckFiles(t, dir, issued)
	if st := s.State(); st.Phase != report.CertValid || !st.Usable || st.CSR != csr.Name {
		t.Errorf("state %+v", st)
	}
	done()

	// Restart: the kept certificate is served at once, and no request
	// is made.
	before := len(c.list(t))
	clk := clocktest.New(time.Now())
	again, err := NewServingCerts(cfg, ServingDeps{Client: node, Clock: clk, Log: slog.New(&ndLog{})})
	if err != nil {
		t.Fatal(err)
	}
	if cur := again.Current(); cur == nil || !cur.Leaf.Equal(issued) {
		t.Fatalf("restart does not serve the kept certificate: %+v", again.State())
	}
	doneAgain := runUntilDone(t, again.Run)
	bsAsleep(t, clk)
	if after := len(c.list(t)); after != before {
		t.Errorf("restart made %d requests", after-before)
	}
	doneAgain()

	// A new address: the kept certificate is not for it, so a new one
	// is requested.
	moved := cfg
	moved.IPs = append(slices.Clone(cfg.IPs), net.ParseIP("10.20.0.8"))
	wantIPs = []string{"10.20.0.7", "10.20.0.8"}
	m, err := NewServingCerts(moved, ServingDeps{Client: node, Clock: clock.Real{}, Log: slog.New(&ndLog{})})
	if err != nil {
		t.Fatal(err)
	}
	if m.Current() != nil {
		t.Fatal("the certificate for the old address is served")
	}
	runUntilDone(t, m.Run)
	renewal := c.waitPending(t, name)
	if renewal.Name == csr.Name {
		t.Fatal("the request for the new address has the old one's name")
	}
	checkCSR(t, renewal, name, servingCSR, wantNames, wantIPs)
	c.approve(t, renewal.Name)
	now = time.Now()
	second := c.signServing(t, renewal.Name, now.Add(-time.Minute), now.Add(time.Hour))
	apiWait.Until(t, "certificate for the new address", func() bool { return m.Current() != nil })
	if !m.Current().Leaf.Equal(second) {
		t.Error("the certificate for the new address is not served")
	}
	scCheckLeaf(t, m.Current().Leaf, []string{"edge-serve", "edge-serve.lan"}, wantIPs)
	scCheckFiles(t, dir, second)
}

// signServing issues the request's certificate from the cluster CA, as
// the kubelet serving signer does, valid from nb to na, and returns it.
func (c *bsCluster) signServing(t *testing.T, name string, nb, na time.Time) *x509.Certificate {
	t.Helper()
	return c.signWith(t, name, func(cr *x509.CertificateRequest) []byte { return scSign(t, c.api.CA, cr, nb, na) })
}
