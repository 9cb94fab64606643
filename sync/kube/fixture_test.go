package kube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	certsv1 "k8s.io/api/certificates/v1"

	"github.com/outpost-edge/outpost/internal/waittest"
)

// The waits of this package's tests.
var (
	// spinWait waits for code that runs on a fake clock and a loopback
	// server, so it gets there without time passing. Generous: under
	// qemu-user on a loaded machine a step takes seconds.
	spinWait = waittest.Poll{Timeout: 60 * time.Second, Every: time.Millisecond}
	// reactWait waits in wall time for a goroutine under test to react,
	// never for fake time.
	reactWait = waittest.Poll{Timeout: 10 * time.Second, Every: 5 * time.Millisecond}
	// apiWait waits for a real API server, and for what the code under
	// test does with it at a real clock.
	apiWait = waittest.Poll{Timeout: 30 * time.Second, Every: 50 * time.Millisecond}
)

// A csrKind is what a node's certificate request is for: the signer it
// names and the usage besides digital signature.
type csrKind struct {
	signer string
	usage  certsv1.KeyUsage
}

var (
	// clientCSR is the node's client certificate, as the kubelet client
	// signer and the node CSR approver want it.
	clientCSR = csrKind{certsv1.KubeAPIServerClientKubeletSignerName, certsv1.UsageClientAuth}
	// servingCSR is the kubelet API's serving certificate, as the kubelet
	// serving signer wants it (pkg/apis/certificates.ValidateKubeletServingCSR).
	servingCSR = csrKind{certsv1.KubeletServingSignerName, certsv1.UsageServerAuth}
)

// checkCSR checks node's request for a kind certificate: its name,
// signer and usages, a signed PEM request for the node's identity with
// an ECDSA P-256 key, naming exactly names and ips (nil for a client
// certificate) and no e-mail or URI.
func checkCSR(t *testing.T, csr *certsv1.CertificateSigningRequest, node string, kind csrKind, names, ips []string) {
	t.Helper()
	if !strings.HasPrefix(csr.Name, "node-csr-") {
		t.Errorf("request name %q", csr.Name)
	}
	if csr.Spec.SignerName != kind.signer {
		t.Errorf("signer %q", csr.Spec.SignerName)
	}
	if !slices.Equal(csr.Spec.Usages, []certsv1.KeyUsage{certsv1.UsageDigitalSignature, kind.usage}) {
		t.Errorf("usages %q", csr.Spec.Usages)
	}
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		t.Fatalf("request %q is not a PEM certificate request", csr.Spec.Request)
	}
	cr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := cr.CheckSignature(); err != nil {
		t.Errorf("request signature: %v", err)
	}
	if cr.Subject.CommonName != "system:node:"+node || !slices.Equal(cr.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("subject %s", cr.Subject)
	}
	if got := ipStrings(cr.IPAddresses); !slices.Equal(cr.DNSNames, names) || !slices.Equal(got, ips) {
		t.Errorf("request for %q %q, want %q %q", cr.DNSNames, got, names, ips)
	}
	if len(cr.EmailAddresses)+len(cr.URIs) > 0 {
		t.Errorf("request has e-mail or URI names: %+v", cr)
	}
	if k, ok := cr.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("key %T, want ECDSA P-256", cr.PublicKey)
	}
}

// ipStrings returns ips as strings.
func ipStrings(ips []net.IP) []string {
	var out []string
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return out
}

// tcpProxy forwards TCP connections to target until cut, which closes
// them all and refuses new ones until resume listens again on the same
// address: the server at target goes away, then comes back.
type tcpProxy struct {
	t      *testing.T
	target string
	addr   string // where it listens, once started
	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
}

// startProxy starts a tcpProxy to target on a free loopback port; it is
// cut when the test ends.
func startProxy(t *testing.T, target string) *tcpProxy {
	p := &tcpProxy{t: t, target: target}
	p.resume()
	t.Cleanup(p.cut)
	return p
}

func (p *tcpProxy) resume() {
	p.t.Helper()
	addr := p.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		p.t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", p.target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
}

func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
