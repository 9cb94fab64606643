package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/internal/config"
	"github.com/outpost-edge/outpost/netproxy/nft"
	"github.com/outpost-edge/outpost/netproxy/podnet"
	"github.com/outpost-edge/outpost/netproxy/proxy"
	"github.com/outpost-edge/outpost/netproxy/servicemodel"
	"github.com/outpost-edge/outpost/store"
)

// podNetwork adapts podnet.Network to agent.PodNetwork.
type podNetwork struct{ n *podnet.Network }

func (p podNetwork) Setup(ctx context.Context, uid string) (string, netip.Addr, error) {
	r, err := p.n.Setup(ctx, uid)
	return r.NetNSPath, r.IP, err
}

func (p podNetwork) Teardown(ctx context.Context, uid string) error { return p.n.Teardown(ctx, uid) }

// newPodNetwork sets up the bridge and returns the pod network with the
// service proxy, which keeps the outpost nftables table (pod egress
// masquerade, hostPorts, Services) in step with the store; run the proxy
// until ctx ends. Until the agent is set in ag, the proxy knows no pod's
// readiness.
func newPodNetwork(ctx context.Context, cfg config.Config, st *store.Store, hostIP string, ag *atomic.Pointer[agent.Agent], log *slog.Logger) (agent.PodNetwork, *proxy.Proxy, error) {
	cidr, err := netip.ParsePrefix(cfg.Network.PodCIDR)
	if err != nil {
		return nil, nil, fmt.Errorf("network.podCIDR: %w", err)
	}
	n, err := podnet.New(podnet.Config{PodCIDR: cidr, NetnsPrefix: cfg.Network.NetnsPrefix}, podnet.Deps{Store: st, Log: log})
	if err != nil {
		return nil, nil, err
	}
	if err := n.EnsureBridge(ctx); err != nil {
		return nil, nil, fmt.Errorf("pod network: %w", err)
	}
	node, _ := netip.ParseAddr(hostIP)
	changed, _ := st.Subscribe(store.KindJournal) // readiness changes are journaled
	px, err := proxy.New(proxy.Config{Node: cfg.NodeName, PodCIDR: cidr}, proxy.Deps{
		Store:     st,
		Ruleset:   nft.NewNetlink(0),
		LocalPods: localPods(st, ag, node),
		Changed:   changed,
		Conntrack: podnet.Conntrack{},
		Log:       log.With("component", "proxy"),
	})
	if err != nil {
		return nil, nil, err
	}
	return podNetwork{n}, px, nil
}

// localPods gives the proxy this node's pods with the readiness the agent
// sees now. It is settled once every stored pod has a status computed
// since the agent started.
func localPods(st *store.Store, ag *atomic.Pointer[agent.Agent], node netip.Addr) proxy.LocalPods {
	return func() ([]servicemodel.LocalPod, bool) {
		a := ag.Load()
		if a == nil {
			return nil, false
		}
		views := a.PodViews()
		recs, err := st.Pods().List()
		if err != nil {
			return nil, false
		}
		alloc, err := st.Allocations()
		if err != nil {
			return nil, false
		}
		ipOf := make(map[string]netip.Addr, len(alloc))
		for ip, owner := range alloc {
			if a, err := netip.ParseAddr(ip); err == nil {
				ipOf[owner] = a
			}
		}
		settled := true
		out := make([]servicemodel.LocalPod, 0, len(recs))
		for _, r := range recs {
			v, ok := views[string(r.Object.UID)]
			if !ok || v.Status.Phase == "" {
				settled = false
				continue
			}
			lp := servicemodel.LocalPod{Pod: v.Pod}
			switch ip, ok := ipOf[string(r.Object.UID)]; {
			case v.Pod.Spec.HostNetwork && node.IsValid():
				lp.IPs = []netip.Addr{node}
			case ok:
				lp.IPs = []netip.Addr{ip}
			}
			for _, c := range v.Status.Conditions {
				if c.Type == corev1.PodReady {
					lp.Ready = c.Status == corev1.ConditionTrue
				}
			}
			out = append(out, lp)
		}
		return out, settled
	}
}
