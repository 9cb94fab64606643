package main

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/config"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/sync/kube"
	"github.com/outpost-edge/outpost/sync/mqtt"
	"github.com/outpost-edge/outpost/sync/mqtt/tunnel"
)

// mqttSync is the MQTT sync and the byte counter of its connections.
type mqttSync struct {
	*mqtt.Syncer
	wire *mqtt.ByteCounter
	// tunnel brings the kubelet API requests the bridge carries over
	// MQTT; nil when the node serves no kubelet API (server.address).
	tunnel *tunnel.Listener
}

// newMQTTSync reads the mqtt section's files and returns the MQTT sync,
// or nil when the node does not use MQTT. A file that cannot be used is
// a usage error (exit 2) naming the field and the file; an unreachable
// broker is not an error at all.
func newMQTTSync(cfg config.Config, st *store.Store, clk clock.Clock, log *slog.Logger, facts func() kube.NodeFacts) (*mqttSync, error) {
	m := cfg.MQTT
	if !m.Enabled() {
		return nil, nil
	}
	tc, err := mqttTLS(m)
	if err != nil {
		return nil, usageError{err}
	}
	if cn := certCN(tc); cn != "" && cn != cfg.NodeName {
		// mosquitto acknowledges what its ACL denies and drops it: with
		// use_identity_as_username (packaging/mosquitto) such a node
		// would publish into nothing, forever, without an error.
		log.Warn("mqtt.certFile's CN is not nodeName; a broker that takes the CN as the username (packaging/mosquitto) drops every message of this node",
			"cn", cn, "nodeName", cfg.NodeName, "file", m.CertFile)
	}
	password, err := mqttPassword(m)
	if err != nil {
		return nil, usageError{err}
	}
	clientID := m.ClientID
	if clientID == "" {
		clientID = cfg.NodeName
	}
	wire := &mqtt.ByteCounter{}
	dial := mqtt.PahoDialer(mqtt.PahoConfig{
		Brokers: m.Brokers, TLS: tc, ClientID: clientID, Username: m.Username, Password: password,
		KeepAlive: m.KeepaliveDuration(), Counter: wire,
	})
	var keys []ed25519.PublicKey
	for i, k := range m.TrustedKeys {
		pub, err := mqtt.ParsePublicKey(k)
		if err != nil {
			return nil, usageError{fmt.Errorf("mqtt.trustedKeys[%d]: %w", i, err)}
		}
		keys = append(keys, pub)
	}
	if len(keys) > 0 {
		ids := make([]string, len(keys))
		for i, k := range keys {
			ids[i] = mqtt.KeyIDOf(k).String()
		}
		log.Info("mqtt: desired state is taken only when signed by a trusted key", "keys", ids)
	} else {
		log.Warn("mqtt.trustedKeys is empty: desired state from the broker is not checked, so whoever can publish to it can run containers here (docs/mqtt.md, signed desired state)")
	}
	// A node that cannot keep a seal key still runs its pods: it takes
	// no sealed Secret until it can.
	seal, err := mqtt.LoadSealKey(filepath.Join(cfg.CertDir(), mqtt.SealKeyFile))
	if err != nil {
		log.Error("mqtt: no seal key, so no sealed Secret can be opened here", "err", err)
		seal = nil
	}
	ms := &mqttSync{wire: wire}
	var tun mqtt.Tunnel
	if cfg.Server.Address != "" {
		ms.tunnel = tunnel.NewListener(tunnel.Config{
			Publish:    func(ctx context.Context, frame []byte) error { return ms.PublishFrame(ctx, frame) },
			Clock:      clk,
			Log:        log.With("component", "mqtt-tunnel"),
			MaxStreams: m.MaxStreams,
		})
		tun = ms.tunnel
	}
	s, err := mqtt.New(mqtt.Config{
		NodeName: cfg.NodeName, Broker: m.Brokers[0], KeepAlive: m.KeepaliveDuration(), MaxMessageBytes: m.MaxMessageBytes,
		TrustedKeys: keys, SealKey: seal,
	}, mqtt.Deps{
		Dial: dial, Store: st, Clock: clk, Log: log.With("component", "mqtt"), Wire: wire, Tunnel: tun,
		NodeFacts: func() mqtt.NodeFacts {
			f := facts()
			return mqtt.NodeFacts{Labels: f.Labels, Status: f.Status}
		},
	})
	if err != nil {
		return nil, err
	}
	ms.Syncer = s
	return ms, nil
}

// serveTunnel serves h, the kubelet API the bridge already let the
// request into, on the streams the bridge opens over MQTT, until ctx
// ends.
func serveTunnel(ctx context.Context, ln *tunnel.Listener, h http.Handler, log *slog.Logger) {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	<-ctx.Done()
	srv.Close()
	ln.Close()
	<-done
}

// mqttPassword reads mqtt.passwordFile, if set.
func mqttPassword(m config.MQTT) (string, error) {
	if m.PasswordFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(m.PasswordFile)
	if err != nil {
		return "", fmt.Errorf("mqtt.passwordFile: %w", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// mqttTLS is the TLS configuration of the mqtt section: its CAs (else
// the system's) and the node's client certificate. It is made for a
// metered link: X25519 and P-256 only unless mqtt.postQuantumTLS is set
// (Go's default also sends an X25519MLKEM768 key share, 1.2 KiB more in
// each handshake), and a session cache, so a reconnect resumes the TLS
// session (TLS 1.3 PSK with a fresh key exchange) and sends neither
// certificate again: about 2 KiB instead of 3.5.
func mqttTLS(m config.MQTT) (*tls.Config, error) {
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ClientSessionCache: tls.NewLRUClientSessionCache(max(4, len(m.Brokers))),
	}
	if !m.PostQuantumTLS {
		tc.CurvePreferences = []tls.CurveID{tls.X25519, tls.CurveP256}
	}
	if m.CAFile != "" {
		pem, err := os.ReadFile(m.CAFile)
		if err != nil {
			return nil, fmt.Errorf("mqtt.caFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("mqtt.caFile %s: no PEM certificate in it", m.CAFile)
		}
		tc.RootCAs = pool
	}
	if m.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(m.CertFile, m.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("mqtt.certFile %s, mqtt.keyFile %s: %w", m.CertFile, m.KeyFile, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// certCN is the common name of tc's client certificate, or "".
func certCN(tc *tls.Config) string {
	if len(tc.Certificates) == 0 || len(tc.Certificates[0].Certificate) == 0 {
		return ""
	}
	leaf, err := x509.ParseCertificate(tc.Certificates[0].Certificate[0])
	if err != nil {
		return ""
	}
	return leaf.Subject.CommonName
}

// run runs the sync until ctx ends and returns after it stopped.
func (m *mqttSync) run(ctx context.Context) { m.Syncer.Run(ctx) }
