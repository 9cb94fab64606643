package bridge

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/internal/clock"
)

func insecure() *tls.Config { return &tls.Config{InsecureSkipVerify: true} }

func kubeletBridge(t *testing.T, first, last int) *Bridge {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: clock.Real{}.Now().Add(-time.Hour), NotAfter: clock.Real{}.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	b := &Bridge{
		cfg: Config{Kubelet: KubeletAPI{Address: "127.0.0.1", FirstPort: first, LastPort: last, Certificate: cert,
			Check: func(_ *http.Request, node string) (int, string) { return http.StatusUnauthorized, "no " + node }}},
		deps: Deps{Clock: clock.Real{}}, log: slog.New(slog.DiscardHandler),
		ports: map[int]string{}, knownPorts: map[string]int{}, nodes: map[string]*node{},
	}
	if err := b.startKubelet(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.stopKubelet)
	return b
}

// freeRange finds n consecutive ports nobody listens on, from the
// kernel's choice of one.
func freeRange(t *testing.T, n int) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		first := l.Addr().(*net.TCPAddr).Port
		l.Close()
		ok := first+n <= 65535
		for p := first; ok && p < first+n; p++ {
			if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err != nil {
				ok = false
			} else {
				l.Close()
			}
		}
		if ok {
			return first
		}
	}
	t.Fatal("no free range of ports")
	return 0
}

// TestFrontPorts: a node gets the port its Node had when it is free,
// never a port another node of the bridge holds or another process
// listens on, and its port goes back when it is handed over.
func TestFrontPorts(t *testing.T) {
	first := freeRange(t, 4)
	b := kubeletBridge(t, first, first+3)
	busy, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(first+2))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	b.knownPorts["a"] = first + 1
	nodes := map[string]*node{}
	for _, name := range []string{"a", "b", "c"} {
		n := &node{b: b, name: name}
		b.mu.Lock()
		b.nodes[name] = n
		err := b.openFront(n)
		b.mu.Unlock()
		if err != nil {
			t.Fatalf("node %s: %v", name, err)
		}
		nodes[name] = n
	}
	if p := nodes["a"].front.port; p != first+1 {
		t.Errorf("node a: port %d, want the one its Node had, %d", p, first+1)
	}
	seen := map[int]bool{}
	for name, n := range nodes {
		if n.front.port == first+2 || seen[n.front.port] || n.front.port < first || n.front.port > first+3 {
			t.Errorf("node %s: port %d (range %d-%d, %d busy, taken %v)", name, n.front.port, first, first+3, first+2, seen)
		}
		seen[n.front.port] = true
	}
	d := &node{b: b, name: "d"}
	b.mu.Lock()
	err = b.openFront(d)
	b.mu.Unlock()
	if err == nil {
		t.Errorf("a fourth node got port %d of a range with three free", d.front.port)
	}
	// Requests are checked before anything reaches the node, each
	// for the node of the port it came to.
	for name, n := range nodes {
		resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: insecure()}}).Get("https://127.0.0.1:" + strconv.Itoa(n.front.port) + "/pods")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || string(body) != "no "+name+"\n" {
			t.Errorf("node %s: unchecked request: %d %q, want 401 naming the node", name, resp.StatusCode, body)
		}
	}
	bPort := nodes["b"].front.port
	b.closeFront(nodes["b"])
	if _, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(bPort)); err == nil {
		t.Errorf("port %d still listens after b was handed over", bPort)
	}
	e := &node{b: b, name: "e"}
	b.mu.Lock()
	err = b.openFront(e)
	b.mu.Unlock()
	if err != nil || e.front.port != bPort {
		t.Errorf("after b was handed over: e got %v, %v; want b's port %d", e.front, err, bPort)
	}
	for _, n := range []*node{nodes["a"], nodes["c"], e} {
		b.closeFront(n)
	}
}

// TestKubeletFacts: the bridge's address is the Node's first InternalIP,
// no Hostname address is left for the API server to prefer, and the
// port is the node's at the bridge.
func TestKubeletFacts(t *testing.T) {
	b := kubeletBridge(t, 20000, 20009)
	st := corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "192.168.1.7"},
		{Type: corev1.NodeHostName, Address: "pi-7"},
		{Type: corev1.NodeInternalIP, Address: "127.0.0.1"},
	}}
	st.DaemonEndpoints.KubeletEndpoint.Port = 10250
	got := b.kubeletFacts(st, 20003)
	want := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeInternalIP, Address: "192.168.1.7"}}
	if len(got.Addresses) != len(want) || got.Addresses[0] != want[0] || got.Addresses[1] != want[1] || got.DaemonEndpoints.KubeletEndpoint.Port != 20003 {
		t.Errorf("facts: %v port %d, want %v port 20003", got.Addresses, got.DaemonEndpoints.KubeletEndpoint.Port, want)
	}
	if st.Addresses[1].Type != corev1.NodeHostName {
		t.Error("kubeletFacts changed the node's own status")
	}
}
