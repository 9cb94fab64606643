// Package server is the node's kubelet-style HTTPS API: what the API
// server calls for kubectl logs, exec, attach, port-forward and top, and
// what Prometheus and metrics-server scrape. Requests are authenticated
// (x509 client certificates, bearer tokens through TokenReview) and
// authorized (SubjectAccessReview) as kubelet does it.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/promtext"
)

// Config is the server's part of the configuration.
type Config struct {
	// Address is host:port to listen on (":10250").
	Address  string
	NodeName string
	// CertFile and KeyFile are the serving certificate; empty makes a
	// self-signed one in CertDir for Hosts (names and IP addresses).
	CertFile, KeyFile string
	CertDir           string
	Hosts             []string
	// ClientCAFile holds the CAs whose client certificates authenticate
	// (the API server's kubelet client CA); empty accepts none.
	ClientCAFile string
	// Anonymous lets requests without credentials in as system:anonymous
	// (they are still authorized).
	Anonymous bool
	// LocalGroups are the groups whose certificate users are authorized
	// when the API server cannot be asked (standalone, or offline with no
	// earlier decision).
	LocalGroups []string
	// LogDir is where the CRI logs of containers are (/var/log/pods).
	LogDir string
	// StreamIdleTimeout ends an exec, attach or port-forward session
	// idle that long (kubelet's default, 4h, when 0).
	StreamIdleTimeout time.Duration
	// StreamCreationTimeout is how long a client that upgraded an exec,
	// attach or port-forward has to open its streams (kubelet's 30 s when
	// 0).
	StreamCreationTimeout time.Duration
	// IdleTimeout closes a kept-alive connection without a request that
	// long (kubelet's 90 s when 0).
	IdleTimeout time.Duration
}

// Deps are the server's collaborators; Node, Clock and Log are required.
type Deps struct {
	Node Node
	// Reviewer checks tokens and access with the API server; nil when
	// the agent runs standalone.
	Reviewer  Reviewer
	Metrics   Metrics
	Resources Resources
	Clock     clock.Clock
	Log       *slog.Logger
	// ServingCert returns the serving certificate the cluster issued
	// (server.tlsBootstrap), asked at every handshake so a new one is
	// served at once; nil, or a nil result, serves the configured or
	// self-signed one.
	ServingCert func() *tls.Certificate
}

// Server is the kubelet-style HTTPS API.
type Server struct {
	cfg   Config
	deps  Deps
	guard *Guard
	mux   *http.ServeMux
}

// New checks cfg and returns a server; it listens on nothing yet.
func New(cfg Config, deps Deps) (*Server, error) {
	if deps.Node == nil || deps.Clock == nil || deps.Log == nil {
		return nil, errors.New("kubelet api: node, clock and logger are required")
	}
	if cfg.StreamIdleTimeout == 0 {
		cfg.StreamIdleTimeout = 4 * time.Hour
	}
	if cfg.StreamCreationTimeout == 0 {
		cfg.StreamCreationTimeout = remotecommand.DefaultStreamCreationTimeout
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 90 * time.Second
	}
	s := &Server{cfg: cfg, deps: deps}
	gc := GuardConfig{Anonymous: cfg.Anonymous, LocalGroups: cfg.LocalGroups}
	if cfg.ClientCAFile != "" {
		pool, err := loadClientCAs(cfg.ClientCAFile)
		if err != nil {
			return nil, err
		}
		gc.ClientCAs = pool
	}
	s.guard = NewGuard(gc, GuardDeps{Reviewer: deps.Reviewer, Clock: deps.Clock, Log: deps.Log})
	s.routes()
	return s, nil
}

// Run serves HTTPS on cfg.Address until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	cert, err := s.servingCert()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.cfg.Address)
	if err != nil {
		return fmt.Errorf("kubelet api: %w", err)
	}
	return s.Serve(ctx, ln, cert)
}

// Serve serves HTTPS on ln until ctx ends, with the certificate
// Deps.ServingCert returns at each handshake, or cert when it returns
// none.
func (s *Server) Serve(ctx context.Context, ln net.Listener, cert tls.Certificate) error {
	tlsCfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Not Certificates: with it, GetCertificate is asked only when
		// the client sends a server name.
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if s.deps.ServingCert != nil {
				if c := s.deps.ServingCert(); c != nil {
					return c, nil
				}
			}
			return &cert, nil
		},
		// Certificates are checked by authenticate, so one that does not
		// verify is a 401 with a reason instead of a failed handshake.
		ClientAuth: tls.RequestClientCert,
		NextProtos: []string{"http/1.1"},
	}
	srv := &http.Server{
		Handler:   s,
		TLSConfig: tlsCfg,
		// Also the TLS handshake's limit: a client that trickles its
		// handshake or headers is cut off.
		ReadHeaderTimeout: 10 * time.Second,
		// Without it a kept-alive connection waits forever for its next
		// request: enough idle clients use up the agent's descriptors.
		IdleTimeout:    s.cfg.IdleTimeout,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(s.deps.Log.Handler(), slog.LevelDebug),
		BaseContext:    func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(tls.NewListener(ln, tlsCfg)) }()
	s.deps.Log.Info("kubelet api serving", "address", ln.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("kubelet api: %w", err)
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shut); err != nil {
		srv.Close()
	}
	<-errc
	return nil
}

// ServeHTTP authenticates and authorizes the request, then serves it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if status, msg := s.guard.Check(r, s.cfg.NodeName); status != 0 {
		http.Error(w, msg, status)
		return
	}
	s.serve(w, r)
}

// serve serves an authorized request.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if msg := uncleanPath(r.URL.Path); msg != "" {
		http.Error(w, msg, http.StatusBadRequest)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// uncleanPath says what is wrong with a path that has empty, . or ..
// segments, "" for a clean one. No endpoint has such paths; the mux
// would answer them with a redirect to the cleaned path (which the Guard
// has not seen), kubelet with a 404.
func uncleanPath(p string) string {
	segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for i, seg := range segs {
		switch {
		case seg == "." || seg == "..":
			return fmt.Sprintf("path %q: a %q segment", p, seg)
		case seg == "" && i < len(segs)-1:
			return fmt.Sprintf("path %q: an empty segment (//)", p)
		}
	}
	return ""
}

// Authorized serves requests that someone this node trusts already
// authenticated and authorized: the bridge, for a node it reaches over
// MQTT (the tunnel's frames come only from the bridge).
func (s *Server) Authorized() http.Handler { return http.HandlerFunc(s.serve) }

// Node is what the server reads and drives on the node. agent implements
// it over its pod workers and runtime.
type Node interface {
	// Pods returns the pods the node runs, each with its current status.
	Pods() []*corev1.Pod
	// Exec runs cmd in a running container of the pod with this UID,
	// copying its streams, and returns the command's exit code.
	Exec(ctx context.Context, podUID, container string, cmd []string, s Streams) (int, error)
	// Attach joins the running container's own stdin and output until ctx
	// ends or the container exits.
	Attach(ctx context.Context, podUID, container string, s Streams) error
	// PortForward copies between stream and a connection to port on the
	// pod's loopback address, inside the pod's network namespace.
	PortForward(ctx context.Context, podUID string, port int32, stream io.ReadWriteCloser) error
}

// Streams are a streaming session's ends. Nil ends are not requested.
type Streams struct {
	Stdin          io.Reader
	Stdout, Stderr io.WriteCloser
	TTY            bool
	// Resize delivers terminal size changes with TTY; nil without.
	Resize <-chan TermSize
}

// TermSize is a terminal's size.
type TermSize struct{ Width, Height uint16 }

// Metrics write the agent's Prometheus families for /metrics.
type Metrics func(p *promtext.Writer)

// Resources serve the resource usage endpoints.
type Resources interface {
	// WriteResource writes /metrics/resource: node, pod and container CPU
	// and memory in the text format metrics-server reads.
	WriteResource(w io.Writer, pods []*corev1.Pod) error
	// Summary returns /stats/summary's JSON document.
	Summary(pods []*corev1.Pod) (any, error)
}
