package kube

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	certsv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/connrotation"

	"github.com/outpost-edge/outpost/internal/atomicfile"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/report"
)

// Client certificate bootstrap and rotation, as kubelet's
// --bootstrap-kubeconfig and certificate manager do it.
//
// A Bootstrapper owns the node's client certificate. When the kubeconfig
// holds a certificate that has not expired, it is used as is. Otherwise
// the bootstrap kubeconfig (a bootstrap token, group system:bootstrappers)
// creates a CertificateSigningRequest for the
// kubernetes.io/kube-apiserver-client-kubelet signer with subject
// CN=system:node:<node>, O=system:nodes and an ECDSA P-256 key, waits for
// it to be approved and signed, and stores certificate and key in
// CertDir/outpost-client-current.pem (mode 0600) and a kubeconfig naming
// that file at Kubeconfig. When 70 to 90 % (jittered) of the certificate's
// lifetime has passed, the same is done with the current certificate as
// the identity (a node may ask for its own certificate: "selfnodeclient"),
// or with the bootstrap kubeconfig again if it expired meanwhile.
//
// Every client made from Config presents the current certificate through
// tls.Config.GetClientCertificate; a new certificate closes the open
// connections, so watches reconnect with it. Nothing restarts.
//
// The key of a request is kept in CertDir/outpost-client.key.tmp until
// its certificate is stored, and the request's name is a digest of key and
// subject: an agent restarted while it waits finds its own request again
// instead of making another. For the same reason a denied request is not
// followed by a new one: the agent keeps checking it, with the reconnect
// backoff, until an administrator (or the cluster's cleaner, an hour
// later) deletes it. A denied request, an expired certificate or an
// unreachable API server never stop anything: the pods keep running from
// the store, and State says why the sync cannot start or renew.

const (
	// certFileName holds the certificate chain, then the key (PEM), as
	// kubelet's kubelet-client-current.pem.
	certFileName = "outpost-client-current.pem"
	// pendingKeyFileName holds the key of the request in flight.
	pendingKeyFileName = "outpost-client.key.tmp"
	// csrNamePrefix is kubelet's, so tools that look for node CSRs find
	// ours.
	csrNamePrefix = "node-csr-"
	// certRecheckEvery bounds the wait for the renewal deadline, so a wall
	// clock set after boot (a board without RTC) is noticed.
	certRecheckEvery = 10 * time.Minute
	// csrWatchTimeout is the timeoutSeconds of the watch on a request.
	csrWatchTimeout = 5 * time.Minute
)

// BootstrapConfig says whose certificate to request and where it lives.
type BootstrapConfig struct {
	// NodeName is the node: the certificate is for system:node:<NodeName>.
	NodeName string
	// Kubeconfig is the node's kubeconfig: its certificate is used while
	// valid, and it is rewritten after every certificate issued.
	Kubeconfig string
	// BootstrapKubeconfig holds the credential that requests a certificate
	// when there is no valid one.
	BootstrapKubeconfig string
	// CertDir holds the certificate and key (config's stateDir/pki).
	CertDir string
	// UserAgent is sent with the requests.
	UserAgent string
}

// BootstrapDeps are what a Bootstrapper talks to.
type BootstrapDeps struct {
	Clock clock.Clock
	Log   *slog.Logger
	// Jitter returns a number in [0, 1) that places a renewal deadline
	// between 70 and 90 % of the certificate's lifetime; default random.
	Jitter func() float64
}

// Bootstrapper obtains and renews the node's client certificate. Its
// methods are safe for concurrent use.
type Bootstrapper struct {
	certSlot
	cfg     BootstrapConfig
	cluster *rest.Config // server and CA, no credential
	rc      *rest.Config // cluster with the rotating certificate
	node    *Client      // over rc: the node's own identity
	tracker *connrotation.ConnectionTracker
	ready   chan struct{} // closed once cert is set
}

// NewBootstrapper reads the kubeconfig (if it exists) and the bootstrap
// kubeconfig. A kubeconfig that is missing, unreadable or holds no valid
// certificate only means a certificate will be requested. A bootstrap
// kubeconfig that cannot be used is an error naming it when there is no
// readable kubeconfig (nothing else names the API server); otherwise
// Run retries it when it needs it. NewBootstrapper makes no request and
// starts nothing.
func NewBootstrapper(cfg BootstrapConfig, deps BootstrapDeps) (*Bootstrapper, error) {
	if cfg.NodeName == "" || cfg.Kubeconfig == "" || cfg.BootstrapKubeconfig == "" || cfg.CertDir == "" {
		return nil, errors.New("sync/kube: bootstrap needs a node name, kubeconfig, bootstrap kubeconfig and certificate directory")
	}
	if deps.Clock == nil {
		return nil, errors.New("sync/kube: bootstrap needs a clock")
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.Jitter == nil {
		deps.Jitter = mrand.Float64
	}
	b := &Bootstrapper{
		certSlot: certSlot{what: "client", clock: deps.Clock, log: deps.Log, jitter: deps.Jitter},
		cfg:      cfg, ready: make(chan struct{}),
	}
	var cert *tls.Certificate
	why := "no kubeconfig " + cfg.Kubeconfig
	_, statErr := os.Stat(cfg.Kubeconfig)
	if statErr == nil {
		// The node's kubeconfig says which server it belongs to; the
		// bootstrap kubeconfig only stands in when it cannot be read.
		if rc, err := LoadKubeconfig(cfg.Kubeconfig); err != nil {
			why = err.Error()
		} else {
			b.cluster = clusterOf(rc)
			if cert, err = clientCertOf(rc); err != nil {
				why = fmt.Sprintf("kubeconfig %s: %v", cfg.Kubeconfig, err)
			} else if now := b.clock.Now(); !now.Before(cert.Leaf.NotAfter) {
				why = fmt.Sprintf("kubeconfig %s: client certificate expired at %s", cfg.Kubeconfig, cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
				cert = nil
			}
		}
	}
	// The bootstrap kubeconfig is read again for every request it makes,
	// so one that is missing now (removed after the first certificate,
	// as kubeadm does) is only an error when nothing else says where
	// the API server is: on a node that never had a kubeconfig.
	boot, err := LoadKubeconfig(cfg.BootstrapKubeconfig)
	switch {
	case err == nil && b.cluster == nil:
		b.cluster = clusterOf(boot)
	case err != nil && (b.cluster == nil || statErr != nil):
		return nil, fmt.Errorf("bootstrap %w", err)
	}
	if b.rc, b.tracker, err = rotatingConfig(b.cluster, b.current); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	if cfg.UserAgent != "" {
		b.rc.UserAgent = cfg.UserAgent
	}
	if b.node, err = NewClient(b.rc, cfg.UserAgent); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	if cert != nil {
		b.use(cert, "")
	} else {
		b.setState(report.CertRequesting, why+"; requesting a certificate with bootstrap kubeconfig "+cfg.BootstrapKubeconfig, "")
	}
	return b, nil
}

// Config returns the connection every client of the node should use: it
// presents the current certificate, and a new one replaces it in place.
// Before Ready it presents none.
func (b *Bootstrapper) Config() *rest.Config { return rest.CopyConfig(b.rc) }

// Ready is closed once a certificate that has not expired is in use.
func (b *Bootstrapper) Ready() <-chan struct{} { return b.ready }

// Wait blocks until a certificate is in use (Run obtains it) and returns
// Config, or returns ctx's error.
func (b *Bootstrapper) Wait(ctx context.Context) (*rest.Config, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.ready:
		return b.Config(), nil
	}
}

// Run requests a certificate when there is none, and a new one when the
// renewal deadline passed, until ctx ends. Failures are retried with the
// reconnect backoff; Run returns nil when ctx ends.
func (b *Bootstrapper) Run(ctx context.Context) error {
	b.run(ctx, b.request)
	return nil
}

// current is what GetClientCertificate presents.
func (b *Bootstrapper) current() *tls.Certificate {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cert
}

// request obtains a new certificate: with the current one as the identity
// while it is valid, else with the bootstrap kubeconfig.
func (b *Bootstrapper) request(ctx context.Context) error {
	client, identity := b.node, "node"
	if cur := b.current(); cur == nil || !b.clock.Now().Before(cur.Leaf.NotAfter) {
		rc, err := LoadKubeconfig(b.cfg.BootstrapKubeconfig)
		if err != nil {
			return fmt.Errorf("bootstrap %w", err)
		}
		if client, err = NewClient(rc, b.cfg.UserAgent); err != nil {
			return fmt.Errorf("bootstrap kubeconfig %s: %w", b.cfg.BootstrapKubeconfig, err)
		}
		identity = "bootstrap"
	}
	key, err := pendingKey(filepath.Join(b.cfg.CertDir, pendingKeyFileName), "client", b.log)
	if err != nil {
		return err
	}
	csr, err := createCSR(ctx, client.Certificates, b.log, key, b.csrTemplate(), identity)
	if err != nil {
		return err
	}
	certPEM, err := waitCSR(ctx, client.Certificates, b.clock, csr, func(reason string) {
		b.setState(report.CertRequesting, reason, csr.Name)
	})
	if err != nil {
		return err
	}
	cert, err := b.store(key, certPEM)
	if err != nil {
		return fmt.Errorf("csr %s: %w", csr.Name, err)
	}
	b.use(cert, csr.Name)
	return nil
}

// use makes cert (issued for the request csr, if any) the one presented,
// closes the connections made with the previous one, and sets the renewal
// deadline.
func (b *Bootstrapper) use(cert *tls.Certificate, csr string) {
	// Connections made with the old certificate are closed before the
	// state says the new one is in use: a request made after that
	// presents the new one.
	b.install(cert, csr, b.tracker.CloseAll)
	// Ready only once the state says so, for whoever waited on it.
	b.mu.Lock()
	select {
	case <-b.ready:
	default:
		close(b.ready)
	}
	b.mu.Unlock()
}

// renewalDeadline is when a certificate is renewed: after 70 % plus j
// times 20 % of its lifetime, as kubelet's certificate manager does.
func renewalDeadline(leaf *x509.Certificate, j float64) time.Time {
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	return leaf.NotBefore.Add(life/10*7 + time.Duration(j*float64(life/5)))
}

// sleepClock waits d on clk, or until ctx ends.
func sleepClock(ctx context.Context, clk clock.Clock, d time.Duration) {
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C():
	}
}

// ---- the request ----

// csrTemplate is what a request asks for.
type csrTemplate struct {
	subject  pkix.Name
	dnsNames []string
	ips      []net.IP
	signer   string
	usages   []certsv1.KeyUsage
}

// nodeSubject is the subject of a node's certificates, client and
// serving: CN=system:node:<node>, O=system:nodes.
func nodeSubject(node string) pkix.Name {
	return pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}
}

// csrTemplate is what the kube-apiserver-client-kubelet signer and the
// node CSR approver accept; key encipherment is for RSA keys only.
func (b *Bootstrapper) csrTemplate() csrTemplate {
	return csrTemplate{
		subject: nodeSubject(b.cfg.NodeName),
		signer:  certsv1.KubeAPIServerClientKubeletSignerName,
		usages:  []certsv1.KeyUsage{certsv1.UsageDigitalSignature, certsv1.UsageClientAuth},
	}
}

// pendingKey returns the key of the request in flight, kept at path,
// making and saving a new one if there is none. what names the
// certificate ("client", "serving") in errors and logs.
func pendingKey(path, what string, log *slog.Logger) (*ecdsa.PrivateKey, error) {
	if data, err := os.ReadFile(path); err == nil {
		if block, _ := pem.Decode(data); block != nil {
			if key, err := x509.ParseECPrivateKey(block.Bytes); err == nil {
				return key, nil
			}
		}
		log.Warn("pending "+what+" key unreadable; making a new one", "file", path)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s key %s: %w", what, path, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate %s key: %w", what, err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode %s key: %w", what, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("certificate directory: %w", err)
	}
	if err := atomicfile.Write(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})); err != nil {
		return nil, fmt.Errorf("write %s key: %w", what, err)
	}
	return key, nil
}

// csrName is a digest of the public key, subject, usages and subject
// alternative names, as kubelet names its client requests: the same key
// always makes the same name for the same request, and a request with
// other names (a node whose address changed) another one.
func csrName(pub any, t csrTemplate) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", err
	}
	h := sha512.New512_256()
	enc := base64.RawURLEncoding.EncodeToString
	// '|' is outside the base64url alphabet: no two inputs write the same
	// stream.
	write := func(p []byte) { h.Write([]byte(enc(p))); h.Write([]byte{'|'}) }
	write(der)
	write([]byte(t.subject.CommonName))
	for _, o := range t.subject.Organization {
		write([]byte(o))
	}
	for _, u := range t.usages {
		write([]byte(u))
	}
	// Client requests have none: their names stay what they were.
	for _, d := range t.dnsNames {
		write([]byte("dns:" + d))
	}
	for _, ip := range t.ips {
		write([]byte("ip:" + ip.String()))
	}
	return csrNamePrefix + enc(h.Sum(nil)), nil
}

// createCSR creates the request for key, or adopts the one of that name
// made before (by this agent before a restart, or before an outage).
func createCSR(ctx context.Context, c rest.Interface, log *slog.Logger, key *ecdsa.PrivateKey, t csrTemplate, identity string) (*certsv1.CertificateSigningRequest, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: t.subject, DNSNames: t.dnsNames, IPAddresses: t.ips}, key)
	if err != nil {
		return nil, fmt.Errorf("make certificate request: %w", err)
	}
	name, err := csrName(key.Public(), t)
	if err != nil {
		return nil, fmt.Errorf("name certificate request: %w", err)
	}
	want := &certsv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certsv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: t.signer,
			Usages:     t.usages,
		},
	}
	var got certsv1.CertificateSigningRequest
	err = c.Post().Resource("certificatesigningrequests").Body(want).Do(ctx).Into(&got)
	switch {
	case err == nil:
		log.Info("certificate signing request created", "csr", name, "signer", t.signer, "identity", identity)
	case apierrors.IsAlreadyExists(err):
		if err := c.Get().Resource("certificatesigningrequests").Name(name).Do(ctx).Into(&got); err != nil {
			return nil, fmt.Errorf("get csr %s: %w", name, err)
		}
		if err := sameRequest(&got, key, t.signer); err != nil {
			return nil, fmt.Errorf("csr %s exists: %w", name, err)
		}
	default:
		return nil, fmt.Errorf("create csr %s: %w", name, err)
	}
	return &got, nil
}

// sameRequest checks that an existing request is for key and signer.
func sameRequest(csr *certsv1.CertificateSigningRequest, key *ecdsa.PrivateKey, signer string) error {
	if csr.Spec.SignerName != signer {
		return fmt.Errorf("signer %q, not %s", csr.Spec.SignerName, signer)
	}
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil {
		return errors.New("request is not PEM")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return fmt.Errorf("request: %w", err)
	}
	if !key.PublicKey.Equal(req.PublicKey) {
		return errors.New("request is for another key")
	}
	return nil
}

// csrDeniedError is a request denied, or whose signing failed.
type csrDeniedError struct {
	name, condition, reason, message string
}

func (e *csrDeniedError) Error() string {
	s := fmt.Sprintf("csr %s %s", e.name, e.condition)
	if e.reason != "" {
		s += ": " + e.reason
	}
	if e.message != "" {
		s += ": " + e.message
	}
	return s
}

// csrOutcome returns the certificate of a signed request, an error for a
// denied or failed one, and done false while it waits; waiting says for
// what.
func csrOutcome(csr *certsv1.CertificateSigningRequest) (certPEM []byte, done bool, waiting string, err error) {
	approved := false
	for _, c := range csr.Status.Conditions {
		switch c.Type {
		case certsv1.CertificateDenied:
			return nil, true, "", &csrDeniedError{csr.Name, "denied", c.Reason, c.Message}
		case certsv1.CertificateFailed:
			return nil, true, "", &csrDeniedError{csr.Name, "failed", c.Reason, c.Message}
		case certsv1.CertificateApproved:
			approved = true
		}
	}
	switch {
	case approved && len(csr.Status.Certificate) > 0:
		return csr.Status.Certificate, true, "", nil
	case approved:
		return nil, false, "approved; waiting for the signer", nil
	}
	return nil, false, "waiting for approval", nil
}

// waitCSR follows the request until it is signed, denied or fails;
// waiting is told what it waits for each time that changes or is seen
// again.
func waitCSR(ctx context.Context, c rest.Interface, clk clock.Clock, csr *certsv1.CertificateSigningRequest, waiting func(reason string)) ([]byte, error) {
	for {
		certPEM, done, what, err := csrOutcome(csr)
		if done {
			return certPEM, err
		}
		waiting("csr " + csr.Name + " " + what)
		if csr, err = nextCSR(ctx, c, clk, csr); err != nil {
			return nil, err
		}
	}
}

// nextCSR watches the request from the version seen until it changes,
// and returns it then (or when the watch ends: then fresh from a GET).
func nextCSR(ctx context.Context, c rest.Interface, clk clock.Clock, csr *certsv1.CertificateSigningRequest) (*certsv1.CertificateSigningRequest, error) {
	timeout := int64(csrWatchTimeout / time.Second)
	start := clk.Now()
	w, err := c.Get().Resource("certificatesigningrequests").VersionedParams(&metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", csr.Name).String(),
		ResourceVersion: csr.ResourceVersion,
		TimeoutSeconds:  &timeout,
		Watch:           true,
	}, metav1.ParameterCodec).Watch(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch csr %s: %w", csr.Name, err)
	}
	defer w.Stop()
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case ev, ok = <-w.ResultChan():
		}
		switch {
		case !ok:
			if clk.Since(start) < minWatchLife {
				return nil, fmt.Errorf("watch csr %s: %w", csr.Name, errWatchClosed)
			}
		case ev.Type == watch.Error:
			if err := apierrors.FromObject(ev.Object); !isExpired(err) {
				return nil, fmt.Errorf("watch csr %s: %w", csr.Name, err)
			}
		case ev.Type == watch.Deleted:
			return nil, fmt.Errorf("csr %s deleted before it was signed", csr.Name)
		case ev.Type == watch.Added || ev.Type == watch.Modified:
			if got, ok := ev.Object.(*certsv1.CertificateSigningRequest); ok {
				return got, nil
			}
			continue
		default:
			continue
		}
		// The watch ended (its timeout, or an expired version): read the
		// request afresh.
		var got certsv1.CertificateSigningRequest
		if err := c.Get().Resource("certificatesigningrequests").Name(csr.Name).Do(ctx).Into(&got); err != nil {
			return nil, fmt.Errorf("get csr %s: %w", csr.Name, err)
		}
		return &got, nil
	}
}

// ---- storing ----

// store checks that the issued certificate is for key, and writes
// certificate and key, then the kubeconfig naming them.
func (b *Bootstrapper) store(key *ecdsa.PrivateKey, certPEM []byte) (*tls.Certificate, error) {
	data, cert, err := issuedPair(key, certPEM, b.clock.Now(), filepath.Join(b.cfg.CertDir, pendingKeyFileName), "client")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(b.cfg.CertDir, 0o700); err != nil {
		return nil, fmt.Errorf("certificate directory: %w", err)
	}
	certPath := filepath.Join(b.cfg.CertDir, certFileName)
	if err := atomicfile.Write(certPath, data); err != nil {
		return nil, fmt.Errorf("write client certificate: %w", err)
	}
	kc, err := clientcmd.Write(nodeKubeconfig(b.cluster, certPath))
	if err != nil {
		return nil, fmt.Errorf("encode kubeconfig %s: %w", b.cfg.Kubeconfig, err)
	}
	if err := os.MkdirAll(filepath.Dir(b.cfg.Kubeconfig), 0o700); err != nil {
		return nil, fmt.Errorf("write kubeconfig %s: %w", b.cfg.Kubeconfig, err)
	}
	if err := atomicfile.Write(b.cfg.Kubeconfig, kc); err != nil {
		return nil, fmt.Errorf("write kubeconfig %s: %w", b.cfg.Kubeconfig, err)
	}
	if err := os.Remove(filepath.Join(b.cfg.CertDir, pendingKeyFileName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		b.log.Warn("remove pending client key", "err", err)
	}
	return cert, nil
}

// issuedPair joins the issued certificate chain and key into one PEM
// file's content (certificate first, as kubelet's *-current.pem), and
// checks that the certificate is for key and has not expired at now.
// When it is not usable the pending key at pendingPath is removed, so a
// new key makes the next request. what names the key in errors.
func issuedPair(key *ecdsa.PrivateKey, certPEM []byte, now time.Time, pendingPath, what string) ([]byte, *tls.Certificate, error) {
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode %s key: %w", what, err)
	}
	var data bytes.Buffer
	data.Write(bytes.TrimSpace(certPEM))
	data.WriteByte('\n')
	data.Write(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	cert, err := tls.X509KeyPair(data.Bytes(), data.Bytes())
	if err != nil {
		// The certificate does not parse or is for another key.
		_ = os.Remove(pendingPath)
		return nil, nil, fmt.Errorf("issued certificate: %w", err)
	}
	if !now.Before(cert.Leaf.NotAfter) {
		_ = os.Remove(pendingPath)
		return nil, nil, fmt.Errorf("issued certificate expired at %s", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return data.Bytes(), &cert, nil
}

// nodeKubeconfig names the cluster and the certificate file (which holds
// the key too), as kubelet writes its kubeconfig.
func nodeKubeconfig(cluster *rest.Config, certPath string) clientcmdapi.Config {
	c := clientcmdapi.NewConfig()
	ci := &clientcmdapi.Cluster{
		Server:                cluster.Host,
		TLSServerName:         cluster.ServerName,
		InsecureSkipTLSVerify: cluster.Insecure,
	}
	// Both is an error to clientcmd; the file is kept when there is one,
	// so a CA the administrator replaces is picked up.
	if cluster.CAFile != "" {
		ci.CertificateAuthority = cluster.CAFile
	} else {
		ci.CertificateAuthorityData = cluster.CAData
	}
	c.Clusters["default-cluster"] = ci
	c.AuthInfos["default-auth"] = &clientcmdapi.AuthInfo{ClientCertificate: certPath, ClientKey: certPath}
	c.Contexts["default-context"] = &clientcmdapi.Context{Cluster: "default-cluster", AuthInfo: "default-auth"}
	c.CurrentContext = "default-context"
	return *c
}

// ---- the connection ----

// clusterOf is rc without its credential: the server and how to trust it.
func clusterOf(rc *rest.Config) *rest.Config {
	return &rest.Config{
		Host:    rc.Host,
		APIPath: rc.APIPath,
		TLSClientConfig: rest.TLSClientConfig{
			Insecure: rc.Insecure, ServerName: rc.ServerName, CAFile: rc.CAFile, CAData: rc.CAData,
		},
		Proxy:   rc.Proxy,
		Timeout: rc.Timeout,
	}
}

// clientCertOf returns the client certificate and key rc names.
func clientCertOf(rc *rest.Config) (*tls.Certificate, error) {
	certPEM, keyPEM := rc.CertData, rc.KeyData
	var err error
	if len(certPEM) == 0 && rc.CertFile != "" {
		if certPEM, err = os.ReadFile(rc.CertFile); err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
	}
	if len(keyPEM) == 0 && rc.KeyFile != "" {
		if keyPEM, err = os.ReadFile(rc.KeyFile); err != nil {
			return nil, fmt.Errorf("client key: %w", err)
		}
	}
	if len(certPEM) == 0 {
		return nil, errors.New("no client certificate")
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	return &cert, nil
}

// rotatingConfig returns a connection to cluster whose TLS handshakes
// present what current returns, over connections the tracker can close,
// as kubelet's certificate transport does. client-go refuses a custom
// transport beside TLS settings, so the TLS settings move into it.
func rotatingConfig(cluster *rest.Config, current func() *tls.Certificate) (*rest.Config, *connrotation.ConnectionTracker, error) {
	tc, err := rest.TLSConfigFor(cluster)
	if err != nil {
		return nil, nil, err
	}
	if tc == nil {
		tc = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if c := current(); c != nil {
			return c, nil
		}
		return &tls.Certificate{}, nil // none yet: the server sees anonymous
	}
	tracker := connrotation.NewConnectionTracker()
	dial := connrotation.NewDialerWithTracker((&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext, tracker)
	t := utilnet.SetTransportDefaults(&http.Transport{
		Proxy:               cluster.Proxy,
		TLSHandshakeTimeout: 10 * time.Second,
		TLSClientConfig:     tc,
		MaxIdleConnsPerHost: 25,
		DialContext:         dial.DialContext,
	})
	return &rest.Config{Host: cluster.Host, APIPath: cluster.APIPath, Timeout: cluster.Timeout, Transport: t}, tracker, nil
}
