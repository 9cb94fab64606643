package bridge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/sync/mqtt"
	"github.com/outpost-edge/outpost/sync/mqtt/tunnel"
)

// KubeletAPI is the kubelet API the bridge serves for its MQTT nodes: a
// port of the bridge per node, which the node's Node names
// (status.daemonEndpoints.kubeletEndpoint.port, with the bridge's
// Address as its first InternalIP), so the API server's logs, exec,
// attach, port-forward and proxy requests for the node reach the bridge.
// The bridge lets a request in as the node would (Check: kubelet's
// authentication and authorization, agent/server's Guard) and carries it
// to the node's own kubelet API over MQTT (sync/mqtt/tunnel).
type KubeletAPI struct {
	// Address is the IP address the API server reaches this bridge at.
	// Empty: the kubelet API is not served.
	Address string
	// Listen is the address the ports are bound on; empty binds
	// Address.
	Listen string
	// FirstPort and LastPort are the ports for nodes, one each.
	FirstPort, LastPort int
	// Certificate is the serving certificate.
	Certificate tls.Certificate
	// Check authenticates and authorizes a request for node: 0 lets it
	// in, else the status and message to answer.
	Check func(r *http.Request, node string) (status int, msg string)
	// OpenTimeout is how long a node has to take a stream (default 10 s).
	OpenTimeout time.Duration
	// IdleTimeout ends a stream idle that long (default 4 h, kubelet's).
	IdleTimeout time.Duration
}

func (k *KubeletAPI) enabled() bool { return k.Address != "" }

// front is a node's kubelet API at the bridge: its port.
type front struct {
	port int
}

// kubeletServer is the kubelet API of every node the bridge serves: one
// HTTPS server on a port set (ports.go), which tells the nodes apart by
// the port a connection came to.
type kubeletServer struct {
	ports *portSet
	srv   *http.Server
	done  chan struct{}
	// transport carries HTTP over the tunnel, and proxy the requests
	// let in, to the node their context names.
	transport *http.Transport
	proxy     *httputil.ReverseProxy
}

// startKubelet starts the nodes' kubelet API server, with no port yet,
// and the tunnel to them.
func (b *Bridge) startKubelet() error {
	k := b.cfg.Kubelet
	host := k.Listen
	if host == "" {
		host = k.Address
	}
	ps, err := newPortSet(net.ParseIP(host))
	if err != nil {
		return fmt.Errorf("kubelet api: %w", err)
	}
	tc := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{k.Certificate},
		// Certificates are checked by Check, so one that does not
		// verify is a 401 with a reason, as the agent answers it.
		ClientAuth: tls.RequestClientCert,
		NextProtos: []string{"http/1.1"},
	}
	b.tunnel = b.newTunnel()
	ks := &kubeletServer{ports: ps, done: make(chan struct{}), transport: b.newTunnelTransport()}
	ks.proxy = b.newKubeletProxy(ks.transport)
	ks.srv = &http.Server{
		Handler:           http.HandlerFunc(b.serveKubelet),
		ReadHeaderTimeout: 10 * time.Second,
		// As the agent's: a kept-alive connection is not kept forever.
		IdleTimeout:    90 * time.Second,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(b.log.Handler(), slog.LevelDebug),
	}
	b.kubelet = ks
	go func() {
		defer close(ks.done)
		ks.srv.Serve(tls.NewListener(ps, tc))
	}()
	return nil
}

// stopKubelet stops the server and its ports.
func (b *Bridge) stopKubelet() {
	ks := b.kubelet
	if ks == nil {
		return
	}
	ks.srv.Close()
	ks.ports.Close()
	<-ks.done
	b.tunnel.Close()
	ks.transport.CloseIdleConnections()
}

// newTunnel makes the bridge's end of the nodes' streams: frames go out
// on each node's down topic, signed when the bridge has a signer.
func (b *Bridge) newTunnel() *tunnel.Dialer {
	k := b.cfg.Kubelet
	return tunnel.NewDialer(tunnel.DialerConfig{
		Publish: func(ctx context.Context, node string, frame []byte) error {
			b.mu.Lock()
			conn := b.conn
			b.mu.Unlock()
			if conn == nil {
				return errors.New("the bridge is not connected to the broker")
			}
			topic := mqtt.RPCDownTopic(node)
			payload := b.seal(topic, mqtt.FrameEnvelope(frame))
			return b.request(ctx, func(ctx context.Context) error { return conn.Publish(ctx, topic, false, payload) })
		},
		Clock:       b.deps.Clock,
		Log:         b.log.With("part", "tunnel"),
		OpenTimeout: k.OpenTimeout,
		IdleTimeout: k.IdleTimeout,
	})
}

// rpc hands a frame a node sent to the tunnel, on the MQTT client's
// goroutine, ahead of the inbox: a stream's data does not wait behind
// the fleet's statuses.
func (b *Bridge) rpc(m mqtt.Message) {
	if m.Ack != nil {
		defer m.Ack()
	}
	if b.tunnel == nil {
		return
	}
	t, err := mqtt.ParseTopic(m.Topic)
	if err != nil || t.RPC != "up" {
		b.reject(m.Topic, "topic", fmt.Errorf("not a node's rpc/up topic: %v", err))
		return
	}
	// Every replica hears every node; the streams of a node are its
	// server's. Another replica's would be answered as unknown streams,
	// and closed.
	b.mu.Lock()
	n := b.nodes[t.Node]
	b.mu.Unlock()
	if n == nil || n.front == nil {
		return
	}
	frame, err := mqtt.OpenFrame(nil, m.Topic, m.Payload)
	if err != nil {
		b.reject(m.Topic, "invalid", err)
		return
	}
	b.tunnel.Handle(t.Node, frame)
}

// isRPCUp says whether topic is a node's rpc/up topic, cheaply.
func isRPCUp(topic string) bool {
	const suffix = "/rpc/up"
	return len(topic) > len(suffix) && topic[len(topic)-len(suffix):] == suffix
}

// preferredPort is where a node's port is looked for first: the port its
// Node had (known), else one from a hash of its name, so a node keeps
// its port across restarts and replicas as long as no other takes it.
func (b *Bridge) preferredPort(name string) int {
	k := b.cfg.Kubelet
	if p := b.knownPorts[name]; p >= k.FirstPort && p <= k.LastPort {
		return p
	}
	return k.FirstPort + ShardOf(name, k.LastPort-k.FirstPort+1)
}

// openFront gives node a port of its own; b.mu is held.
func (b *Bridge) openFront(n *node) error {
	k := b.cfg.Kubelet
	size := k.LastPort - k.FirstPort + 1
	first := b.preferredPort(n.name)
	var err error
	for i := 0; i < size; i++ {
		p := k.FirstPort + (first-k.FirstPort+i)%size
		if _, taken := b.ports[p]; taken {
			continue
		}
		if err = b.kubelet.ports.add(p); err == nil {
			b.ports[p] = n.name
			n.front = &front{port: p}
			return nil
		}
	}
	return fmt.Errorf("kubelet api of node %s: no free port in %d-%d (last error: %v)", n.name, k.FirstPort, k.LastPort, err)
}

// closeFront stops listening on node's port and ends its streams; b.mu
// is not held.
func (b *Bridge) closeFront(n *node) {
	b.mu.Lock()
	f := n.front
	n.front = nil
	if f != nil {
		delete(b.ports, f.port)
	}
	b.mu.Unlock()
	if f == nil {
		return
	}
	b.kubelet.ports.remove(f.port)
	b.tunnel.Reset(n.name, errors.New("another bridge replica serves the node now"))
}

// nodeKey is the context key of the node a request is for.
type nodeKey struct{}

// serveKubelet serves a node's kubelet API, the node found by the port
// the request came to: Check, then the request carried to the node.
func (b *Bridge) serveKubelet(w http.ResponseWriter, r *http.Request) {
	addr, _ := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr)
	var n *node
	b.mu.Lock()
	if addr != nil {
		n = b.nodes[b.ports[addr.Port]]
	}
	b.mu.Unlock()
	if n == nil {
		http.Error(w, "no mqtt node is served on this port now", http.StatusNotFound)
		return
	}
	if status, msg := b.cfg.Kubelet.Check(r, n.name); status != 0 {
		http.Error(w, msg, status)
		return
	}
	n.mu.Lock()
	online := n.online
	n.mu.Unlock()
	if !online {
		http.Error(w, fmt.Sprintf("node %s is not connected to the mqtt broker", n.name), http.StatusServiceUnavailable)
		return
	}
	b.kubelet.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), nodeKey{}, n.name)))
}

// newKubeletProxy carries requests to the node their context names.
func (b *Bridge) newKubeletProxy(transport *http.Transport) *httputil.ReverseProxy {
	nodeOf := func(r *http.Request) string { s, _ := r.Context().Value(nodeKey{}).(string); return s }
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			node := nodeOf(pr.In)
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", node
			pr.Out.Host = node
			// The node trusts the bridge's word: credentials meant for
			// the bridge stay here.
			pr.Out.Header.Del("Authorization")
		},
		Transport:     transport,
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			if resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Request.URL.Path, "/containerLogs/") {
				resp.Body = &saysWhyBody{ReadCloser: resp.Body, node: nodeOf(resp.Request)}
			}
			return nil
		},
		ErrorLog: slog.NewLogLogger(b.log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			node := nodeOf(r)
			b.log.Info("kubelet api request to mqtt node failed", "node", node, "path", r.URL.Path, "err", err)
			http.Error(w, fmt.Sprintf("node %s over mqtt: %v", node, err), http.StatusBadGateway)
		},
	}
}

// newTunnelTransport is the HTTP transport over the tunnel, for every
// node: the request's host is the node's name.
func (b *Bridge) newTunnelTransport() *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			node, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			return b.tunnel.Dial(ctx, node)
		},
		// A scrape every 15 s (metrics-server) reuses its stream; a
		// stream idle longer goes.
		MaxIdleConnsPerHost:   1,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0,
		ForceAttemptHTTP2:     false,
	}
}

// kubeletFacts are a node's facts as the API server must see them when
// the bridge serves its kubelet API: the bridge's address first among
// its InternalIPs and no Hostname address (the API server prefers it by
// default), and the node's port at the bridge.
func (b *Bridge) kubeletFacts(st corev1.NodeStatus, port int) corev1.NodeStatus {
	addrs := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: b.cfg.Kubelet.Address}}
	for _, a := range st.Addresses {
		if a.Type == corev1.NodeHostName || (a.Type == corev1.NodeInternalIP && a.Address == b.cfg.Kubelet.Address) {
			continue
		}
		addrs = append(addrs, a)
	}
	st.Addresses = addrs
	st.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
	return st
}

// saysWhyBody ends a log stream cut short by the link with a line that
// says so: the API server ends its own response cleanly whatever ended
// the node's, so kubectl logs -f would otherwise stop as if the
// container had.
type saysWhyBody struct {
	io.ReadCloser
	node string
	why  *strings.Reader
}

func (s *saysWhyBody) Read(p []byte) (int, error) {
	if s.why != nil {
		return s.why.Read(p)
	}
	n, err := s.ReadCloser.Read(p)
	if err != nil && err != io.EOF && n == 0 {
		s.why = strings.NewReader(fmt.Sprintf("\n[outpost bridge: the log stream of node %s ended: %v]\n", s.node, err))
		return s.why.Read(p)
	}
	return n, err
}
