package kube

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	certsv1 "k8s.io/api/certificates/v1"

	"github.com/outpost-edge/outpost/internal/atomicfile"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/report"
)

// Serving certificates issued by the cluster, as kubelet's
// serverTLSBootstrap does it.
//
// A ServingCerts owns the kubelet API's serving certificate when the
// cluster issues it. It asks with the node's own identity
// (system:node:<node>) for a certificate of the
// kubernetes.io/kubelet-serving signer: subject CN=system:node:<node>,
// O=system:nodes, usages digital signature and server auth (an ECDSA
// P-256 key needs no key encipherment), and the node's DNS names and IP
// addresses as subject alternative names. localhost and loopback
// addresses are left out: a certificate authority vouches only for names
// that reach this node from elsewhere, and approvers of kubelet serving
// requests reject them.
//
// The issued certificate and its key are kept in
// CertDir/outpost-serving-current.pem (mode 0600), as kubelet keeps
// kubelet-server-current.pem. One found there at start is used when it
// has not expired and is for this node's names and addresses; when the
// names or addresses changed (a new host IP), a certificate for the new
// ones is requested. It is renewed when 70 to 90 % (jittered) of its
// lifetime has passed.
//
// Nothing approves kubelet-serving requests in a stock cluster:
// kube-controller-manager signs them once approved, but its approver only
// handles client certificates. An administrator approves them with
// `kubectl certificate approve <csr>`, or an approver (kubelet-csr-approver,
// a cloud's node controller) does. Until then Current returns nil (or the
// certificate it had, until it expires), and the caller serves what it
// had: the self-signed certificate. As for client certificates, the
// request's key is kept (CertDir/outpost-serving-request.key.tmp) and
// its name derived from key, subject and names, so a restart finds the
// pending request again, and a denied one is checked again with backoff
// until it is deleted.

const (
	// servingCertFileName holds the certificate chain, then the key
	// (PEM), as kubelet's kubelet-server-current.pem.
	servingCertFileName = "outpost-serving-current.pem"
	// servingPendingKeyFileName holds the key of the request in flight.
	// Not outpost-serving.key.tmp: the kubelet API writes its self-signed
	// key through that name.
	servingPendingKeyFileName = "outpost-serving-request.key.tmp"
)

// ServingConfig says which names the serving certificate is for and
// where it is kept.
type ServingConfig struct {
	// NodeName is the node: the certificate is for system:node:<NodeName>.
	NodeName string
	// DNSNames and IPs are the certificate's subject alternative names:
	// the node's name, host name and addresses. localhost and loopback
	// or unspecified addresses are left out; at least one other name or
	// address is needed.
	DNSNames []string
	IPs      []net.IP
	// CertDir holds the certificate and key (config's stateDir/pki).
	CertDir string
}

// ServingDeps are what a ServingCerts talks to.
type ServingDeps struct {
	// Client is the node's own identity (system:node:<NodeName>): the
	// Node authorizer lets it request certificates, and NodeRestriction
	// only for its own name.
	Client *Client
	Clock  clock.Clock
	Log    *slog.Logger
	// Jitter returns a number in [0, 1) that places a renewal deadline
	// between 70 and 90 % of the certificate's lifetime; default random.
	Jitter func() float64
}

// ServingCerts obtains and renews the node's serving certificate from
// the cluster. Its methods are safe for concurrent use.
type ServingCerts struct {
	certSlot
	cfg    ServingConfig
	client *Client
	tmpl   csrTemplate
}

// NewServingCerts checks cfg and loads the certificate kept in CertDir
// if it is still valid for cfg's names. A missing, expired or unreadable
// certificate only means one will be requested. It makes no request and
// starts nothing.
func NewServingCerts(cfg ServingConfig, deps ServingDeps) (*ServingCerts, error) {
	if cfg.NodeName == "" || cfg.CertDir == "" {
		return nil, errors.New("sync/kube: serving certificate needs a node name and certificate directory")
	}
	if deps.Client == nil || deps.Clock == nil {
		return nil, errors.New("sync/kube: serving certificate needs a client and a clock")
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.Jitter == nil {
		deps.Jitter = mrand.Float64
	}
	names, ips := servingSANs(cfg.DNSNames, cfg.IPs)
	if len(names) == 0 && len(ips) == 0 {
		return nil, fmt.Errorf("sync/kube: serving certificate of node %s: no DNS name or IP address other than localhost and loopback", cfg.NodeName)
	}
	cfg.DNSNames, cfg.IPs = names, ips
	s := &ServingCerts{
		certSlot: certSlot{what: "serving", clock: deps.Clock, log: deps.Log, jitter: deps.Jitter,
			logAttrs: []any{"names", sanList(names, ips)}},
		cfg: cfg, client: deps.Client,
		tmpl: csrTemplate{
			subject:  nodeSubject(cfg.NodeName),
			dnsNames: names,
			ips:      ips,
			signer:   certsv1.KubeletServingSignerName,
			usages:   []certsv1.KeyUsage{certsv1.UsageDigitalSignature, certsv1.UsageServerAuth},
		},
	}
	cert, why := s.load()
	if cert != nil {
		s.use(cert, "")
	} else {
		s.setState(report.CertRequesting, why+"; requesting a serving certificate", "")
	}
	return s, nil
}

// servingSANs returns the names and addresses without duplicates,
// localhost and loopback or unspecified addresses, in their order.
func servingSANs(dnsNames []string, ips []net.IP) ([]string, []net.IP) {
	var names []string
	for _, n := range dnsNames {
		n = strings.ToLower(strings.TrimSpace(n))
		if n == "" || n == "localhost" || strings.HasSuffix(n, ".localhost") || slices.Contains(names, n) {
			continue
		}
		names = append(names, n)
	}
	var out []net.IP
	for _, ip := range ips {
		if ip == nil || ip.IsLoopback() || ip.IsUnspecified() || slices.ContainsFunc(out, ip.Equal) {
			continue
		}
		if v4 := ip.To4(); v4 != nil {
			ip = v4
		}
		out = append(out, ip)
	}
	return names, out
}

// load reads the kept certificate; when it cannot be used it returns nil
// and why.
func (s *ServingCerts) load() (*tls.Certificate, string) {
	path := filepath.Join(s.cfg.CertDir, servingCertFileName)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "no serving certificate " + path
	}
	if err != nil {
		return nil, fmt.Sprintf("serving certificate %s: %v", path, err)
	}
	cert, err := tls.X509KeyPair(data, data)
	if err != nil {
		return nil, fmt.Sprintf("serving certificate %s: %v", path, err)
	}
	switch leaf := cert.Leaf; {
	case leaf.Subject.CommonName != s.tmpl.subject.CommonName:
		return nil, fmt.Sprintf("serving certificate %s is for %s", path, leaf.Subject.CommonName)
	case !s.clock.Now().Before(leaf.NotAfter):
		return nil, fmt.Sprintf("serving certificate %s expired at %s", path, leaf.NotAfter.UTC().Format(time.RFC3339))
	case !sameSANs(leaf, s.cfg.DNSNames, s.cfg.IPs):
		return nil, fmt.Sprintf("serving certificate %s is for %s, not %s", path, sanList(leaf.DNSNames, leaf.IPAddresses), sanList(s.cfg.DNSNames, s.cfg.IPs))
	}
	return &cert, ""
}

// sameSANs reports whether leaf is for exactly names and ips, in any
// order.
func sameSANs(leaf *x509.Certificate, names []string, ips []net.IP) bool {
	return sanList(leaf.DNSNames, leaf.IPAddresses) == sanList(names, ips)
}

// sanList is names and ips, sorted and comma-separated.
func sanList(names []string, ips []net.IP) string {
	var all []string
	for _, n := range names {
		all = append(all, strings.ToLower(n))
	}
	for _, ip := range ips {
		all = append(all, ip.String())
	}
	slices.Sort(all)
	return strings.Join(slices.Compact(all), ",")
}

// Current returns the certificate to serve: nil until one is issued (or
// loaded at start), and nil again once it has expired while its renewal
// waits. The caller serves its self-signed certificate then.
func (s *ServingCerts) Current() *tls.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cert == nil || !s.clock.Now().Before(s.cert.Leaf.NotAfter) {
		return nil
	}
	return s.cert
}

// Run requests a certificate when there is none, and a new one when the
// renewal deadline passed, until ctx ends. A request waits for approval
// as long as it takes; failures are retried with the reconnect backoff.
// Run returns nil when ctx ends.
func (s *ServingCerts) Run(ctx context.Context) error {
	s.run(ctx, s.request)
	return nil
}

// request obtains a new certificate with the node's identity.
func (s *ServingCerts) request(ctx context.Context) error {
	key, err := pendingKey(filepath.Join(s.cfg.CertDir, servingPendingKeyFileName), "serving", s.log)
	if err != nil {
		return err
	}
	c := s.client.Certificates
	csr, err := createCSR(ctx, c, s.log, key, s.tmpl, "node")
	if err != nil {
		return err
	}
	certPEM, err := waitCSR(ctx, c, s.clock, csr, func(reason string) {
		if strings.HasSuffix(reason, "waiting for approval") {
			reason += " (kubectl certificate approve " + csr.Name + ")"
		}
		s.setState(report.CertRequesting, reason, csr.Name)
	})
	if err != nil {
		return err
	}
	pending := filepath.Join(s.cfg.CertDir, servingPendingKeyFileName)
	data, cert, err := issuedPair(key, certPEM, s.clock.Now(), pending, "serving")
	if err != nil {
		return fmt.Errorf("csr %s: %w", csr.Name, err)
	}
	if err := os.MkdirAll(s.cfg.CertDir, 0o700); err != nil {
		return fmt.Errorf("certificate directory: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(s.cfg.CertDir, servingCertFileName), data); err != nil {
		return fmt.Errorf("write serving certificate: %w", err)
	}
	if err := os.Remove(pending); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("remove pending serving key", "err", err)
	}
	s.use(cert, csr.Name)
	return nil
}

// use makes cert (issued for the request csr, if any) the one served and
// sets the renewal deadline.
func (s *ServingCerts) use(cert *tls.Certificate, csr string) {
	s.install(cert, csr, nil)
}
