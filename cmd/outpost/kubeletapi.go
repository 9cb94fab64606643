package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/agent/server"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/config"
	"github.com/outpost-edge/outpost/sync/kube"
)

// kubeletAPI is the kubelet-style HTTPS API and, with
// server.tlsBootstrap, the serving certificate the cluster issues it.
type kubeletAPI struct {
	srv   *server.Server
	certs *kube.ServingCerts // nil unless server.tlsBootstrap applies
	// clientReady is closed once the node has a client certificate to
	// request the serving certificate with; nil when it has one from
	// the start (no bootstrap kubeconfig).
	clientReady <-chan struct{}
}

// newKubeletAPI returns the kubelet-style HTTPS API over the agent, or
// nil when server.address is empty. ks is nil when the agent runs
// standalone: then only client certificates of server.localGroups get in.
func newKubeletAPI(cfg config.Config, a *agent.Agent, ks *kubeSync, hostIP string, metrics server.Metrics, res server.Resources, clk clock.Clock, log *slog.Logger) (*kubeletAPI, error) {
	if cfg.Server.Address == "" {
		return nil, nil
	}
	// The self-signed certificate is for local clients too (in this
	// order, so an upgrade keeps it); the one the cluster issues only
	// for the names and address that reach the node from elsewhere.
	hosts := []string{cfg.NodeName, "localhost", "127.0.0.1"}
	names := []string{cfg.NodeName}
	if h, err := os.Hostname(); err == nil && strings.ToLower(h) != cfg.NodeName {
		hosts = append(hosts, strings.ToLower(h))
		names = append(names, strings.ToLower(h))
	}
	var ips []net.IP
	if hostIP != "" {
		hosts = append(hosts, hostIP)
		if ip := net.ParseIP(hostIP); ip != nil {
			ips = append(ips, ip)
		}
	}
	deps := server.Deps{Node: a, Metrics: metrics, Resources: res, Clock: clk, Log: log.With("component", "kubelet-api")}
	k := &kubeletAPI{}
	if ks != nil {
		deps.Reviewer = reviewer{ks.client}
	}
	switch {
	case !cfg.Server.TLSBootstrap:
	case ks == nil:
		log.Warn("server.tlsBootstrap ignored: no kubeconfig to request the serving certificate with")
	case cfg.Server.TLSCertFile != "":
		log.Warn("server.tlsBootstrap ignored: server.tlsCertFile is set", "file", cfg.Server.TLSCertFile)
	default:
		certs, err := kube.NewServingCerts(kube.ServingConfig{
			NodeName: cfg.NodeName, DNSNames: names, IPs: ips, CertDir: cfg.CertDir(),
		}, kube.ServingDeps{Client: ks.client, Clock: clk, Log: log.With("component", "serving-cert")})
		if err != nil {
			// The self-signed certificate serves as well.
			log.Warn("server.tlsBootstrap ignored", "err", err)
			break
		}
		k.certs, deps.ServingCert = certs, certs.Current
		if ks.boot != nil {
			k.clientReady = ks.boot.Ready()
		}
	}
	srv, err := server.New(server.Config{
		Address: cfg.Server.Address, NodeName: cfg.NodeName,
		CertFile: cfg.Server.TLSCertFile, KeyFile: cfg.Server.TLSKeyFile, CertDir: cfg.CertDir(), Hosts: hosts,
		ClientCAFile: cfg.Server.ClientCAFile, Anonymous: cfg.Server.Anonymous, LocalGroups: cfg.Server.LocalGroups,
		LogDir: cfg.LogDir,
	}, deps)
	if err != nil {
		return nil, err
	}
	k.srv = srv
	return k, nil
}

// Run serves until ctx ends. With server.tlsBootstrap it requests and
// renews the serving certificate meanwhile, once the node has a client
// certificate, and returns after that has stopped too.
func (k *kubeletAPI) Run(ctx context.Context) error {
	var ps parts
	defer ps.stop()
	if k.certs != nil {
		ps.start(ctx, func(ctx context.Context) {
			if k.clientReady != nil {
				select {
				case <-ctx.Done():
					return
				case <-k.clientReady:
				}
			}
			k.certs.Run(ctx)
		})
	}
	return k.srv.Run(ctx)
}

// reviewer asks the API server for the kubelet API's token reviews and
// access reviews.
type reviewer struct{ c *kube.Client }

func (r reviewer) ReviewToken(ctx context.Context, token string) (server.User, bool, error) {
	u, ok, err := r.c.ReviewToken(ctx, token)
	if err != nil || !ok {
		return server.User{}, ok, err
	}
	extra := map[string][]string{}
	for k, v := range u.Extra {
		extra[k] = v
	}
	return server.User{Name: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra}, true, nil
}

func (r reviewer) Authorize(ctx context.Context, u server.User, verb, subresource, node string) (bool, string, error) {
	return r.c.Authorize(ctx, kube.Access{
		User: u.Name, UID: u.UID, Groups: u.Groups, Extra: u.Extra,
		Verb: verb, Resource: "nodes", Subresource: subresource, Name: node,
	})
}
