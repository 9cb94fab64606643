package main

import (
	"context"
	"log/slog"
	"os"
	"strings"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/agent/server"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/config"
	"github.com/outpost-edge/outpost/sync/kube"
)

// newKubeletAPI returns the kubelet-style HTTPS API over the agent, or
// nil when server.address is empty. ks is nil when the agent runs
// standalone: then only client certificates of server.localGroups get in.
func newKubeletAPI(cfg config.Config, a *agent.Agent, ks *kubeSync, hostIP string, metrics server.Metrics, res server.Resources, clk clock.Clock, log *slog.Logger) (*server.Server, error) {
	if cfg.Server.Address == "" {
		return nil, nil
	}
	hosts := []string{cfg.NodeName, "localhost", "127.0.0.1"}
	if h, err := os.Hostname(); err == nil && strings.ToLower(h) != cfg.NodeName {
		hosts = append(hosts, strings.ToLower(h))
	}
	if hostIP != "" {
		hosts = append(hosts, hostIP)
	}
	deps := server.Deps{Node: a, Metrics: metrics, Resources: res, Clock: clk, Log: log.With("component", "kubelet-api")}
	if ks != nil {
		deps.Reviewer = reviewer{ks.client}
	}
	return server.New(server.Config{
		Address: cfg.Server.Address, NodeName: cfg.NodeName,
		CertFile: cfg.Server.TLSCertFile, KeyFile: cfg.Server.TLSKeyFile, CertDir: cfg.CertDir(), Hosts: hosts,
		ClientCAFile: cfg.Server.ClientCAFile, Anonymous: cfg.Server.Anonymous, LocalGroups: cfg.Server.LocalGroups,
		LogDir: cfg.LogDir,
	}, deps)
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
