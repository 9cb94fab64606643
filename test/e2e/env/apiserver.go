package env

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certsv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// APIServer is a private etcd plus kube-apiserver.
type APIServer struct {
	// URL is https://127.0.0.1:PORT.
	URL string
	// Kubeconfig is a kubeconfig file for the admin user (system:masters).
	Kubeconfig string
	// Config is the admin user's client configuration.
	Config *rest.Config
	// CA signs the serving and client certificates (and is the client CA).
	CA *CA
	// ClientCAFile is the PEM file of the CA that signs the API server's
	// client certificates, its kubelet client certificate among them
	// (CN kube-apiserver-kubelet-client, O system:masters): what a
	// node's kubelet API trusts for client certificates.
	ClientCAFile string
	// Dir holds the certificates, token file and logs.
	Dir string

	args     []string
	proc     *process
	etcdArgs []string
	etcdDir  string
	etcdURL  string
	etcd     *process
	restart  int
	wipes    int
}

// PIDs are the process IDs of kube-apiserver and etcd.
func (a *APIServer) PIDs() (apiserver, etcd int) {
	return a.proc.cmd.Process.Pid, a.etcd.cmd.Process.Pid
}

// auditPolicy records every request at Metadata level, so tests can count
// what a client wrote, and pod status writes with their body, so a test
// that counts them can say what each one changed.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Request
  resources:
  - group: ""
    resources: ["pods/status"]
- level: Metadata
`

// AdminToken is the bearer token of the admin user in the token file.
const AdminToken = "outpost-e2e-admin-token"

// StartAPIServer starts etcd and kube-apiserver on free loopback ports with
// a generated CA, serving certificate, service-account key and token file,
// writes an admin kubeconfig, waits for /readyz, and stops both in t's
// cleanup. kube-apiserver calls kubelets at their InternalIP with a
// client certificate from the CA (see ClientCAFile), and runs the
// aggregation layer with a front-proxy CA of its own (StartMetricsServer).
//
// With -short (make test-unit, and the ARM unit tests under qemu) it skips
// the test: starting a control plane is not a unit test.
func StartAPIServer(t testing.TB) *APIServer {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: not starting etcd and kube-apiserver")
	}
	RequireRoot(t)
	etcdBin, apiBin := lookTool(t, "etcd"), lookTool(t, "kube-apiserver")
	dir := t.TempDir()
	a := &APIServer{Dir: dir}

	ca, err := NewCA("outpost-e2e-ca")
	if err != nil {
		t.Fatal(err)
	}
	a.CA = ca
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(ca.WriteCert(filepath.Join(dir, "ca.crt")))
	servingCert, servingKey, err := ca.Issue(pkix.Name{CommonName: "kube-apiserver"}, []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")}, x509.ExtKeyUsageServerAuth)
	must(err)
	must(os.WriteFile(filepath.Join(dir, "apiserver.crt"), servingCert, 0o600))
	must(os.WriteFile(filepath.Join(dir, "apiserver.key"), servingKey, 0o600))
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	must(writeKey(filepath.Join(dir, "sa.key"), saKey))
	pub, err := x509.MarshalPKIXPublicKey(saKey.Public())
	must(err)
	must(os.WriteFile(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600))
	must(os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(AdminToken+",admin,admin-uid,system:masters\n"), 0o600))
	// The client certificate kube-apiserver presents to kubelets (logs,
	// exec, port-forward), as kubeadm issues it.
	a.ClientCAFile = filepath.Join(dir, "ca.crt")
	kubeletCert, kubeletKey, err := ca.Issue(pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}}, nil, nil, x509.ExtKeyUsageClientAuth)
	must(err)
	must(os.WriteFile(filepath.Join(dir, "apiserver-kubelet-client.crt"), kubeletCert, 0o600))
	must(os.WriteFile(filepath.Join(dir, "apiserver-kubelet-client.key"), kubeletKey, 0o600))
	// The aggregation layer's front proxy: a CA of its own, whose client
	// certificate kube-apiserver presents to extension API servers
	// (metrics-server) with the user in X-Remote-* headers.
	frontCA, err := NewCA("outpost-e2e-front-proxy-ca")
	must(err)
	must(frontCA.WriteCert(filepath.Join(dir, "front-proxy-ca.crt")))
	proxyCert, proxyKey, err := frontCA.Issue(pkix.Name{CommonName: "front-proxy-client"}, nil, nil, x509.ExtKeyUsageClientAuth)
	must(err)
	must(os.WriteFile(filepath.Join(dir, "front-proxy-client.crt"), proxyCert, 0o600))
	must(os.WriteFile(filepath.Join(dir, "front-proxy-client.key"), proxyKey, 0o600))

	// etcd
	clientPort, peerPort := FreePort(t), FreePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	a.etcdDir, a.etcdURL = filepath.Join(dir, "etcd"), etcdURL
	a.etcdArgs = []string{etcdBin,
		"--name", "e2e", "--data-dir", a.etcdDir,
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "e2e=" + peerURL, "--log-level", "warn", "--unsafe-no-fsync"}
	a.startEtcd(t, "etcd")
	// kube-apiserver
	port := FreePort(t)
	a.URL = fmt.Sprintf("https://127.0.0.1:%d", port)
	must(os.WriteFile(filepath.Join(dir, "audit-policy.yaml"), []byte(auditPolicy), 0o600))
	a.args = []string{apiBin,
		"--audit-policy-file", filepath.Join(dir, "audit-policy.yaml"),
		"--audit-log-path", filepath.Join(dir, "audit.log"),
		"--audit-log-mode", "blocking",
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", fmt.Sprint(port),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--tls-cert-file", filepath.Join(dir, "apiserver.crt"), "--tls-private-key-file", filepath.Join(dir, "apiserver.key"),
		"--client-ca-file", filepath.Join(dir, "ca.crt"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range", "10.0.0.0/24",
		"--authorization-mode", "Node,RBAC",
		// What a real cluster runs, so the agent is tested with a node
		// identity as it is limited in production.
		"--enable-admission-plugins", "NodeRestriction",
		"--enable-priority-and-fairness=false",
		// No kubernetes Service endpoints for a loopback address.
		"--endpoint-reconciler-type", "none",
		"--profiling=false",
		// kube-apiserver to kubelet, as a real cluster runs it; the
		// node's serving certificate is self-signed, so no
		// --kubelet-certificate-authority.
		"--kubelet-client-certificate", filepath.Join(dir, "apiserver-kubelet-client.crt"),
		"--kubelet-client-key", filepath.Join(dir, "apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types", "InternalIP",
		// The aggregation layer, for metrics-server. Requests go to the
		// endpoint's address: no kube-proxy serves ClusterIPs here.
		"--requestheader-client-ca-file", filepath.Join(dir, "front-proxy-ca.crt"),
		"--proxy-client-cert-file", filepath.Join(dir, "front-proxy-client.crt"),
		"--proxy-client-key-file", filepath.Join(dir, "front-proxy-client.key"),
		"--requestheader-allowed-names", "front-proxy-client",
		"--requestheader-extra-headers-prefix", "X-Remote-Extra-",
		"--requestheader-group-headers", "X-Remote-Group",
		"--requestheader-username-headers", "X-Remote-User",
		"--enable-aggregator-routing=true",
	}
	a.Start(t)

	a.Config = &rest.Config{Host: a.URL, BearerToken: AdminToken, TLSClientConfig: rest.TLSClientConfig{CAData: ca.CertPEM()}}
	a.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	must(WriteKubeconfig(a.Kubeconfig, a.URL, ca.CertPEM(), "admin", AdminToken, nil, nil))
	return a
}

// Start (re)starts kube-apiserver on the same port, against the same etcd,
// and waits until it is ready. StartAPIServer calls it once.
func (a *APIServer) Start(t testing.TB) {
	t.Helper()
	name := "kube-apiserver"
	if a.restart > 0 {
		name = fmt.Sprintf("kube-apiserver-%d", a.restart)
	}
	a.restart++
	a.proc = start(t, a.Dir, name, a.args...)
	caPool := x509.NewCertPool()
	caPool.AddCert(a.CA.Cert)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig(caPool)}}
	waitReady(t, a.proc, 90*time.Second, func() error { return httpOK(client, a.URL+"/readyz", AdminToken) })
}

// Stop stops kube-apiserver (etcd keeps running): clients see refused
// connections until Start.
func (a *APIServer) Stop() { a.proc.stop() }

// startEtcd starts etcd with its log in Dir/<name>.log and waits until it
// is healthy.
func (a *APIServer) startEtcd(t testing.TB, name string) {
	t.Helper()
	a.etcd = start(t, a.Dir, name, a.etcdArgs...)
	waitReady(t, a.etcd, 30*time.Second, func() error { return httpOK(http.DefaultClient, a.etcdURL+"/health", "") })
}

// Wipe stops kube-apiserver and etcd, removes etcd's data and starts both
// again on the same ports with the same certificates, CA and token file:
// an API server rebuilt from nothing, that knows no Node, pod or RBAC
// binding but its own defaults, and accepts the same credentials. The
// audit log goes on in the same file.
func (a *APIServer) Wipe(t testing.TB) {
	t.Helper()
	a.proc.stop()
	a.etcd.stop()
	if err := os.RemoveAll(a.etcdDir); err != nil {
		t.Fatalf("wipe etcd data: %v", err)
	}
	a.wipes++
	a.startEtcd(t, fmt.Sprintf("etcd-%d", a.wipes))
	a.Start(t)
}

// AuditEvent is one request as the audit log recorded it.
type AuditEvent struct {
	Verb string `json:"verb"`
	User struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	Stage string `json:"stage"`
	// Received is when the API server got the request.
	Received time.Time `json:"requestReceivedTimestamp"`
	// RequestObject is the request's body, for the requests the policy
	// records at Request level (pod status writes).
	RequestObject json.RawMessage `json:"requestObject,omitempty"`
}

// AuditEvents returns the completed requests the audit log holds so far
// (one event per request: the ResponseComplete stage, or Panic).
func (a *APIServer) AuditEvents(t testing.TB) []AuditEvent {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(a.Dir, "audit.log"))
	if err != nil {
		t.Fatal(err)
	}
	var evs []AuditEvent
	for _, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var e AuditEvent
		if err := json.Unmarshal(line, &e); err != nil {
			t.Fatalf("audit log line %q: %v", line, err)
		}
		if e.Stage == "ResponseComplete" || e.Stage == "Panic" {
			evs = append(evs, e)
		}
	}
	return evs
}

// NodeKubeconfig writes a kubeconfig for the node identity of node (user
// system:node:NODE in group system:nodes, a client certificate from the
// CA), as the Node authorizer and NodeRestriction admission limit it, and
// returns its path.
func (a *APIServer) NodeKubeconfig(t testing.TB, node string) string {
	t.Helper()
	certPEM, keyPEM, err := a.CA.Issue(pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}, nil, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), node+".kubeconfig")
	if err := WriteKubeconfig(path, a.URL, a.CA.CertPEM(), "system:node:"+node, "", certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	return path
}

// WriteKubeconfig writes a kubeconfig for server with either a bearer token
// or a client certificate and key (PEM).
func WriteKubeconfig(path, server string, caPEM []byte, user, token string, certPEM, keyPEM []byte) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token, ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: user}
	cfg.CurrentContext = "e2e"
	return clientcmd.WriteToFile(*cfg, path)
}

func httpOK(c *http.Client, url, token string) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// CA is a test certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA makes a self-signed CA valid for a day.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return &CA{Cert: cert, Key: key}, err
}

// CertPEM returns the CA certificate in PEM.
func (c *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Cert.Raw})
}

// WriteCert writes the CA certificate to path.
func (c *CA) WriteCert(path string) error { return os.WriteFile(path, c.CertPEM(), 0o644) }

// WriteKey writes the CA's private key (PKCS #8 PEM) to path, readable
// by its owner only, for a command that issues certificates of its own
// (test/fleetsim).
func (c *CA) WriteKey(path string) error {
	der, err := x509.MarshalPKCS8PrivateKey(c.Key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

// Issue returns a certificate and key (PEM) for subject, signed by c.
func (c *CA) Issue(subject pkix.Name, dns []string, ips []net.IP, usage ...x509.ExtKeyUsage) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: subject, DNSNames: dns, IPAddresses: ips,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: usage,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.Cert, key.Public(), c.Key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// Kubectl runs kubectl with the admin kubeconfig and returns its output.
func (a *APIServer) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	cmd := exec.Command(lookTool(t, "kubectl"), append([]string{"--kubeconfig", a.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// SignNodeCSRs plays kube-controller-manager's csrapproving and
// csrsigning controllers for node client certificates, which the test
// environment does not run: until ctx ends it approves every pending
// request for the kubernetes.io/kube-apiserver-client-kubelet signer and
// issues its certificate from the CA, valid for validity.
func (a *APIServer) SignNodeCSRs(ctx context.Context, t testing.TB, validity time.Duration) {
	scheme := runtime.NewScheme()
	if err := certsv1.AddToScheme(scheme); err != nil {
		t.Error(err)
		return
	}
	c := rest.CopyConfig(a.Config)
	c.GroupVersion = &certsv1.SchemeGroupVersion
	c.APIPath = "/apis"
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		t.Error(err)
		return
	}
	for ctx.Err() == nil {
		var list certsv1.CertificateSigningRequestList
		if err := rc.Get().Resource("certificatesigningrequests").Do(ctx).Into(&list); err == nil {
			for i := range list.Items {
				a.signCSR(ctx, rc, &list.Items[i], validity)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (a *APIServer) signCSR(ctx context.Context, rc *rest.RESTClient, csr *certsv1.CertificateSigningRequest, validity time.Duration) {
	if csr.Spec.SignerName != certsv1.KubeAPIServerClientKubeletSignerName || len(csr.Status.Certificate) > 0 {
		return
	}
	approved := false
	for _, c := range csr.Status.Conditions {
		approved = approved || c.Type == certsv1.CertificateApproved
		if c.Type == certsv1.CertificateDenied || c.Type == certsv1.CertificateFailed {
			return
		}
	}
	if !approved {
		csr.Status.Conditions = append(csr.Status.Conditions, certsv1.CertificateSigningRequestCondition{
			Type: certsv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "E2EApprove", Message: "approved by the test environment",
		})
		if err := rc.Put().Resource("certificatesigningrequests").Name(csr.Name).SubResource("approval").Body(csr).Do(ctx).Into(csr); err != nil {
			return
		}
	}
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil {
		return
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: req.Subject,
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(validity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.CA.Cert, req.PublicKey, a.CA.Key)
	if err != nil {
		return
	}
	csr.Status.Certificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	rc.Put().Resource("certificatesigningrequests").Name(csr.Name).SubResource("status").Body(csr).Do(ctx).Error()
}

// StartControllerManager runs kube-controller-manager against a, with only
// the node lifecycle and taint eviction controllers: it marks a node
// whose Lease stops being renewed for nodeGrace unreachable, taints it
// NoExecute, and evicts the pods that do not tolerate that. It is stopped
// in t's cleanup.
func (a *APIServer) StartControllerManager(t testing.TB, nodeGrace time.Duration) {
	t.Helper()
	bin := lookTool(t, "kube-controller-manager")
	p := start(t, a.Dir, "kube-controller-manager", bin,
		"--kubeconfig", a.Kubeconfig,
		"--controllers", "node-lifecycle-controller,taint-eviction-controller",
		"--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false",
		"--node-monitor-period", "1s", "--node-monitor-grace-period", nodeGrace.String(),
		"--node-startup-grace-period", nodeGrace.String(),
	)
	// It has no health endpoint without a secure port: give it a moment
	// and make sure it did not exit.
	time.Sleep(2 * time.Second)
	if p.exited() {
		t.Fatalf("kube-controller-manager exited; log:\n%s", tail(p.log, 40))
	}
}

// StartEndpointSliceController runs kube-controller-manager against a
// with only the EndpointSlice controller, which writes the slices of
// Services with a selector from their pods' addresses and readiness as the
// node reports them. It is stopped in t's cleanup.
func (a *APIServer) StartEndpointSliceController(t testing.TB) {
	t.Helper()
	bin := lookTool(t, "kube-controller-manager")
	p := start(t, a.Dir, "kube-controller-manager", bin,
		"--kubeconfig", a.Kubeconfig,
		"--controllers", "endpointslice-controller",
		"--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false",
		"--concurrent-service-endpoint-syncs", "2", "--endpointslice-updates-batch-period", "0s",
	)
	time.Sleep(2 * time.Second)
	if p.exited() {
		t.Fatalf("kube-controller-manager exited; log:\n%s", tail(p.log, 40))
	}
}
