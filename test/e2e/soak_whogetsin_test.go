package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/outpost-edge/outpost/agent/server"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

func init() { addSoakTrial(80, "WhoGetsIn", soakWhoGetsIn) }

// whoStatsRole lets user stats-reader get and create (POST) nodes/stats,
// and nothing else of a node.
const whoStatsRole = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: soak-node-stats}
rules:
- apiGroups: [""]
  resources: [nodes/stats]
  verbs: [get, create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: soak-node-stats}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: soak-node-stats}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: stats-reader}
`

// whoEndpoint is one endpoint of the kubelet API, as a client calls it;
// a path's ID is replaced by a marker name unique to the attempt.
type whoEndpoint struct {
	method, path string
	hdr          []string
}

// whoIdentity is who a request comes as, and the answer kubelet gives it
// on every endpoint (but those in except), and why.
type whoIdentity struct {
	name            string
	certPEM, keyPEM []byte
	token           string
	want            int
	except          map[string]int
	why             string
}

// soakWhoGetsIn is trial 8 of docs/soak.md: every endpoint of the
// kubelet API, asked as each identity kubelet refuses (no credentials, a
// certificate of another CA, an expired one, a certificate or token of a
// user with no rights on the node, a token the API server rejects, and
// with the API server stopped a certificate and a token it never decided
// on), answers as kubelet does (401, 403, 500), and no exec or run ever
// leaves its marker file; a user allowed nodes/stats reads stats only,
// and cannot reach /run through a path with "..". The status socket
// serves root and refuses uid 65534.
func soakWhoGetsIn(t *testing.T, sc soakScale, r *soakResult) {
	rounds := sc.n(2, 10)
	api := env.StartAPIServer(t)
	adm := newAdmin(t, api)
	n := newNode(t, "soak-who")
	ip := n.hostLink()
	n.connect(api)
	n.appendConfig(fmt.Sprintf("server:\n  clientCAFile: %s\n", api.ClientCAFile))
	marker := newMarkerDir(t, n.dir)
	n.start()
	healthyNode(t, adm, n.name)
	pod := apiPod("who", n.name, "echo hello; exec sleep 3600")
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "marker", MountPath: "/marker"}}
	dirType := corev1.HostPathDirectory
	pod.Spec.Volumes = []corev1.Volume{{Name: "marker", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: marker.dir, Type: &dirType}}}}
	adm.create("pods", pod)
	within(90*time.Second).For(t, "pod who running", func() (bool, string) {
		p, err := adm.pod("who")
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning, asJSON(p.Status)
	})
	api.Kubectl(t, "apply", "-f", writeTemp(t, "stats-role.yaml", whoStatsRole))
	addr := net.JoinHostPort(ip, "10250")

	// The status socket first: root is served, uid 65534 is refused by
	// the socket's own mode (its directories are opened to it here).
	socketLine := whoStatusSocket(t, n)
	r.set("status socket: %s", socketLine)

	// The controls: the API server's own kubelet client certificate
	// (system:masters) runs /run and a streamed exec, which leave their
	// markers; so a marker left by anyone else would show.
	kubeletCert, err := os.ReadFile(filepath.Join(api.Dir, "apiserver-kubelet-client.crt"))
	if err != nil {
		t.Fatal(err)
	}
	kubeletKey, err := os.ReadFile(filepath.Join(api.Dir, "apiserver-kubelet-client.key"))
	if err != nil {
		t.Fatal(err)
	}
	control := whoIdentity{name: "kube-apiserver", certPEM: kubeletCert, keyPEM: kubeletKey}
	if code, body, err := control.ask(t, addr, "POST", "/run/default/who/main?cmd=touch+/marker/control-run"); err != nil || code != 200 {
		t.Fatalf("control /run: %d %q %v", code, body, err)
	}
	if err := whoExec(control, addr, "control-exec"); err != nil {
		t.Fatalf("control exec: %v", err)
	}
	marker.want(t, "control-exec", "control-run")

	certOf := func(ca *env.CA, cn string, groups ...string) ([]byte, []byte) {
		c, k, err := ca.Issue(pkix.Name{CommonName: cn, Organization: groups}, nil, nil, x509.ExtKeyUsageClientAuth)
		if err != nil {
			t.Fatal(err)
		}
		return c, k
	}
	otherCA, err := env.NewCA("soak-who-other-ca")
	if err != nil {
		t.Fatal(err)
	}
	strangerCert, strangerKey := certOf(otherCA, "kube-apiserver-kubelet-client", "system:masters")
	expiredCert, expiredKey := expiredClientCert(t, api.CA, "expired-admin", "system:masters")
	nobodyCert, nobodyKey := certOf(api.CA, "no-rights")
	statsCert, statsKey := certOf(api.CA, "stats-reader")
	lateCert, lateKey := certOf(api.CA, "late-dev", "devs")
	saToken := strings.TrimSpace(api.Kubectl(t, "create", "token", "default", "-n", "default"))
	laterToken := strings.TrimSpace(api.Kubectl(t, "create", "token", "default", "-n", "default", "--duration", "2h"))

	// kubelet's answers, the table this trial checks against (kubelet's
	// server.go InstallAuthFilter: an authentication error or no user is
	// 401 "Unauthorized"; an authorizer error 500 "Authorization error";
	// a denial 403 "Forbidden"). Its client certificates are asked for
	// (tls.RequestClientCert) and verified by its x509 authenticator, so
	// a certificate that does not verify is a 401, not a failed
	// handshake.
	online := []whoIdentity{
		{name: "no credentials", want: 401,
			why: "anonymous is off (kubelet --anonymous-auth=false): no authenticator names a user"},
		{name: "certificate of an unknown CA", certPEM: strangerCert, keyPEM: strangerKey, want: 401,
			why: "the x509 authenticator cannot verify it (the name and group it claims are the API server's own)"},
		{name: "expired certificate", certPEM: expiredCert, keyPEM: expiredKey, want: 401,
			why: "the x509 authenticator finds it expired (its group, system:masters, would be allowed)"},
		{name: "certificate, no rights on nodes", certPEM: nobodyCert, keyPEM: nobodyKey, want: 403,
			why: "authenticated; the SubjectAccessReview for nodes/<subresource> is denied"},
		{name: "token the API server rejects", token: "soak-who-not-a-token", want: 401,
			why: "the TokenReview says not authenticated"},
		{name: "service account token, no nodes/proxy", token: saToken, want: 403,
			why: "the TokenReview names system:serviceaccount:default:default; the SubjectAccessReview is denied"},
		{name: "certificate, nodes/stats only", certPEM: statsCert, keyPEM: statsKey, want: 403,
			except: map[string]int{"GET /stats/summary": 200, "GET /stats/summary/": 200, "POST /stats/../run": 400, "POST /stats/%2E%2E/run": 400, "POST /stats/..%2Frun": 400},
			why:    "allowed nodes/stats, denied the other subresources; a path with .. is refused (400) after the stats check, never served as /run"},
	}
	// With the API server stopped, for credentials it never decided on.
	offline := []whoIdentity{
		{name: "API server away: new certificate user", certPEM: lateCert, keyPEM: lateKey, want: 500,
			why: "authenticated locally; the SubjectAccessReview cannot be made: kubelet's authorizer error, 500"},
		{name: "API server away: new token", token: laterToken, want: 401,
			why: "the TokenReview cannot be made: an authentication error, 401"},
		{name: "API server away: no credentials", want: 401, why: "as online"},
	}

	p, err := adm.pod("who")
	if err != nil {
		t.Fatal(err)
	}
	uid := string(p.UID)
	spdy := func(proto string) []string {
		return []string{"Connection: Upgrade", "Upgrade: SPDY/3.1", "X-Stream-Protocol-Version: " + proto}
	}
	ws := func(proto string) []string {
		return []string{"Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol: " + proto}
	}
	const touch = "command=touch&command=/marker/ID&output=1&error=1"
	eps := []whoEndpoint{
		{"GET", "/healthz", nil},
		{"GET", "/pods", nil},
		{"GET", "/pods/", nil},
		{"GET", "/metrics", nil},
		{"GET", "/metrics/resource", nil},
		{"GET", "/stats/summary", nil},
		{"GET", "/stats/summary/", nil},
		{"GET", "/containerLogs/default/who/main", nil},
		{"POST", "/run/default/who/main?cmd=touch+/marker/ID", nil},
		{"POST", "/run/default/who/" + uid + "/main?cmd=touch+/marker/ID", nil},
		{"POST", "/exec/default/who/main?" + touch, spdy("v4.channel.k8s.io")},
		{"POST", "/exec/default/who/" + uid + "/main?" + touch, spdy("v4.channel.k8s.io")},
		{"GET", "/exec/default/who/main?" + touch, ws("v4.channel.k8s.io")},
		{"GET", "/exec/default/who/" + uid + "/main?" + touch, ws("v4.channel.k8s.io")},
		{"POST", "/attach/default/who/main?output=1", spdy("v4.channel.k8s.io")},
		{"POST", "/attach/default/who/" + uid + "/main?output=1", spdy("v4.channel.k8s.io")},
		{"GET", "/attach/default/who/main?output=1", ws("v4.channel.k8s.io")},
		{"GET", "/attach/default/who/" + uid + "/main?output=1", ws("v4.channel.k8s.io")},
		{"POST", "/portForward/default/who", spdy("portforward.k8s.io")},
		{"POST", "/portForward/default/who/" + uid, spdy("portforward.k8s.io")},
		{"GET", "/portForward/default/who?ports=80", ws("v4.channel.k8s.io")},
		{"GET", "/portForward/default/who/" + uid + "?ports=80", ws("v4.channel.k8s.io")},
		// Paths that would reach /run if a .. were followed.
		{"POST", "/stats/../run/default/who/main?cmd=touch+/marker/ID", nil},
		{"POST", "/stats/%2E%2E/run/default/who/main?cmd=touch+/marker/ID", nil},
		{"POST", "/stats/..%2Frun/default/who/main?cmd=touch+/marker/ID", nil},
	}
	// Every endpoint the server serves is in the matrix.
	mux, covered := http.NewServeMux(), map[string]bool{}
	for _, pat := range server.Endpoints() {
		mux.HandleFunc(pat, func(http.ResponseWriter, *http.Request) {})
	}
	for _, ep := range eps {
		_, pat := mux.Handler(httptest.NewRequest(ep.method, ep.path, nil))
		covered[pat] = true
	}
	for _, pat := range server.Endpoints() {
		if !covered[pat] {
			t.Errorf("endpoint %s is not in the matrix", pat)
		}
	}
	requests, execs, codes := 0, 0, map[int]int{}
	rCounts := func() string {
		return fmt.Sprintf("%d identities × %d endpoints, %d requests; answers %s; %d streamed execs tried; status socket: %s",
			len(online)+len(offline)+2, len(eps), requests, codesLine(codes), execs, socketLine)
	}
	line := func(stage string) {
		r.set("%s; %s; %d commands ran", stage, rCounts(), len(marker.extra("control-exec", "control-run")))
	}
	matrix := func(ids []whoIdentity, round int) {
		for i, id := range ids {
			for j, ep := range eps {
				path := strings.Replace(ep.path, "ID", fmt.Sprintf("r%d-id%d-ep%d", round, i, j), 1)
				code, body, err := id.ask(t, addr, ep.method, path, ep.hdr...)
				requests++
				codes[code]++
				want, ok := id.except[ep.key()]
				if !ok {
					want = id.want
				}
				if err != nil || code != want {
					t.Errorf("%s, %s %s: %d %q %v; kubelet answers %d: %s", id.name, ep.method, ep.path, code, strings.TrimSpace(body), err, want, id.why)
				}
				if code >= 400 && strings.TrimSpace(body) == "" {
					t.Errorf("%s, %s %s: %d with no message", id.name, ep.method, ep.path, code)
				}
			}
			// A real client, as kubectl streams an exec: refused.
			execs++
			if err := whoExec(id, addr, fmt.Sprintf("r%d-id%d-spdy", round, i)); err == nil {
				t.Errorf("%s: a streamed exec ran", id.name)
			}
		}
	}
	for round := 1; round <= rounds; round++ {
		matrix(online, round)
		line(fmt.Sprintf("online %d of %d rounds", round, rounds))
	}

	api.Stop()
	for round := 1; round <= rounds; round++ {
		matrix(offline, round)
		line(fmt.Sprintf("online %d rounds, offline %d of %d", rounds, round, rounds))
	}
	// Offline, an operator's certificate of server.localGroups still gets
	// in (outpost's offline rule; kubelet would answer 500).
	opCert, opKey := certOf(api.CA, "operator", "system:masters")
	op := whoIdentity{name: "operator", certPEM: opCert, keyPEM: opKey}
	if code, body, err := op.ask(t, addr, "GET", "/pods"); err != nil || code != 200 {
		t.Errorf("offline, operator certificate of server.localGroups: %d %q %v, want 200", code, body, err)
	}
	// The API server back: the same new credentials are now decided on.
	api.Start(t)
	late := whoIdentity{certPEM: lateCert, keyPEM: lateKey}
	within(60*time.Second).For(t, "the agent asking the API server again", func() (bool, string) {
		code, body, err := late.ask(t, addr, "GET", "/healthz")
		return err == nil && code == 403, fmt.Sprintf("%d %q %v", code, body, err)
	})
	back := []whoIdentity{
		{name: "API server back: the new certificate user", certPEM: lateCert, keyPEM: lateKey, want: 403,
			why: "the SubjectAccessReview can be made again, and denies"},
		{name: "API server back: the new token", token: laterToken, want: 403,
			why: "the TokenReview names the service account; the SubjectAccessReview denies"},
	}
	matrix(back, 1)
	line(fmt.Sprintf("online and offline %d rounds each, then the API server back", rounds))
	if ran := marker.extra("control-exec", "control-run"); len(ran) > 0 {
		t.Errorf("commands ran: markers %v", ran)
		r.set("FOUND: %d commands ran (%v); %s", len(ran), ran, rCounts())
	}
}

// key is how an identity's except names the endpoint: method and path
// up to its pod.
func (ep whoEndpoint) key() string {
	p := ep.path
	for _, cut := range []string{"/default/", "?"} {
		if i := strings.Index(p, cut); i >= 0 {
			p = p[:i]
		}
	}
	return ep.method + " " + p
}

// client is a kubelet API client with id's certificate (its token goes
// in each request's headers).
func (id whoIdentity) client(t testing.TB, addr string) kapi {
	t.Helper()
	cfg := &tls.Config{InsecureSkipVerify: true}
	if id.certPEM != nil {
		c, err := tls.X509KeyPair(id.certPEM, id.keyPEM)
		if err != nil {
			t.Fatalf("%s: %v", id.name, err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return kapi{pod: "who", addr: addr, tls: cfg}
}

// ask sends one request as id, its token (if any) in the headers, and
// returns the answer's status and body.
func (id whoIdentity) ask(t testing.TB, addr, method, path string, hdr ...string) (int, string, error) {
	t.Helper()
	if id.token != "" {
		hdr = append(slices.Clip(hdr), "Authorization: Bearer "+id.token)
	}
	k := id.client(t, addr)
	return k.do(k.req(method, path, hdr...))
}

// whoExec streams an exec of touch /marker/<name> as kubectl does (SPDY,
// through client-go) as id; nil when it ran.
func whoExec(id whoIdentity, addr, name string) error {
	cfg := &rest.Config{Host: "https://" + addr, BearerToken: id.token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true, CertData: id.certPEM, KeyData: id.keyPEM}}
	q := url.Values{"command": {"touch", "/marker/" + name}, "output": {"1"}, "error": {"1"}}
	u, _ := url.Parse(cfg.Host + "/exec/default/who/main?" + q.Encode())
	ex, err := remotecommand.NewSPDYExecutor(cfg, "POST", u)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &out})
}

// expiredClientCert is a client certificate from ca that expired an hour
// ago.
func expiredClientCert(t testing.TB, ca *env.CA, cn string, groups ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn, Organization: groups},
		NotBefore: time.Now().Add(-3 * time.Hour), NotAfter: time.Now().Add(-time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// whoStatusSocket checks the agent's status socket: root gets the
// status, uid 65534 (nobody) cannot connect. The socket's directories
// are opened to others for the check (and closed again), so only the
// socket's own mode refuses.
func whoStatusSocket(t *testing.T, n *node) string {
	t.Helper()
	sock := filepath.Join(n.dir, "state", "outpost.sock")
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatalf("status socket: %v", err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("status socket %s: mode %v, want a socket for its owner only", sock, fi.Mode())
	}
	var opened []string
	for d := filepath.Dir(sock); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm()&0o001 == 0 {
			os.Chmod(d, st.Mode().Perm()|0o001)
			opened = append(opened, d)
			defer os.Chmod(d, st.Mode().Perm())
		}
	}
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Fatalf("the status socket check needs curl: %v", err)
	}
	get := func(asNobody bool) (string, error) {
		args := []string{curl, "-sS", "--max-time", "10", "--unix-socket", sock, "http://agent/status"}
		if asNobody {
			args = append([]string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}, args...)
		}
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		return string(out), err
	}
	if out, err := get(false); err != nil || !strings.Contains(out, `"pods"`) {
		t.Errorf("status socket as root: %v %q", err, out)
	}
	// nobody sees the socket (the directories let it through) ...
	if out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "test", "-S", sock).CombinedOutput(); err != nil {
		t.Fatalf("uid 65534 cannot even see the socket (%v %s): the check would prove nothing", err, out)
	}
	// ... and cannot connect to it.
	out, err := get(true)
	if err == nil || strings.Contains(out, `"pods"`) {
		t.Errorf("status socket as uid 65534: %v %q, want refused", err, out)
	}
	t.Logf("status socket as uid 65534: %s (directories opened for the check: %d)", strings.TrimSpace(out), len(opened))
	return "root served, uid 65534 refused"
}
