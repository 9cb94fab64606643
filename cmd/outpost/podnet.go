package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/internal/config"
	"github.com/outpost-edge/outpost/netproxy/nft"
	"github.com/outpost-edge/outpost/netproxy/podnet"
	"github.com/outpost-edge/outpost/store"
)

// podNetwork adapts podnet.Network to agent.PodNetwork.
type podNetwork struct{ n *podnet.Network }

func (p podNetwork) Setup(ctx context.Context, uid string) (string, netip.Addr, error) {
	r, err := p.n.Setup(ctx, uid)
	return r.NetNSPath, r.IP, err
}

func (p podNetwork) Teardown(ctx context.Context, uid string) error { return p.n.Teardown(ctx, uid) }

// newPodNetwork sets up the bridge and the NAT table (egress masquerade)
// and returns the pod network with a loop that keeps hostPort rules in
// step with the store; run the loop until ctx ends.
func newPodNetwork(ctx context.Context, cfg config.Config, st *store.Store, log *slog.Logger) (agent.PodNetwork, func(context.Context), error) {
	cidr, err := netip.ParsePrefix(cfg.Network.PodCIDR)
	if err != nil {
		return nil, nil, fmt.Errorf("network.podCIDR: %w", err)
	}
	n, err := podnet.New(podnet.Config{PodCIDR: cidr}, podnet.Deps{Store: st, Log: log})
	if err != nil {
		return nil, nil, err
	}
	if err := n.EnsureBridge(ctx); err != nil {
		return nil, nil, fmt.Errorf("pod network: %w", err)
	}
	nat, err := nft.NewNAT(nft.NATConfig{PodCIDR: cidr})
	if err != nil {
		return nil, nil, err
	}
	sync := func() ([]nft.HostPort, error) {
		hps, err := hostPorts(st)
		if err != nil {
			return nil, err
		}
		return hps, nat.Sync(hps)
	}
	if _, err := sync(); err != nil {
		return nil, nil, fmt.Errorf("pod network nat: %w", err)
	}
	loop := func(ctx context.Context) {
		changes, cancel := st.Subscribe(store.KindPod, store.KindIPAM)
		defer cancel()
		var last []nft.HostPort
		for {
			select {
			case <-ctx.Done():
				return
			case <-changes:
			}
			hps, err := hostPorts(st)
			if err != nil {
				log.Warn("hostPorts", "err", err)
				continue
			}
			if reflect.DeepEqual(hps, last) {
				continue
			}
			if err := nat.Sync(hps); err != nil {
				log.Warn("sync hostPort rules", "err", err)
				continue
			}
			last = hps
		}
	}
	return podNetwork{n}, loop, nil
}

// hostPorts lists the hostPorts of the desired pods that have an address.
func hostPorts(st *store.Store) ([]nft.HostPort, error) {
	alloc, err := st.Allocations()
	if err != nil {
		return nil, err
	}
	ipOf := map[string]netip.Addr{}
	for ip, owner := range alloc {
		if a, err := netip.ParseAddr(ip); err == nil {
			ipOf[owner] = a
		}
	}
	recs, err := st.Pods().List()
	if err != nil {
		return nil, err
	}
	var out []nft.HostPort
	for _, r := range recs {
		p := r.Object
		ip, ok := ipOf[string(p.UID)]
		if !ok || p.Spec.HostNetwork {
			continue
		}
		for _, c := range p.Spec.Containers {
			for _, port := range c.Ports {
				if port.HostPort == 0 {
					continue
				}
				hp := nft.HostPort{Protocol: string(port.Protocol), HostPort: uint16(port.HostPort), PodIP: ip, ContainerPort: uint16(port.ContainerPort)}
				if port.HostIP != "" {
					hp.HostIP, _ = netip.ParseAddr(port.HostIP)
				}
				out = append(out, hp)
			}
		}
	}
	return out, nil
}
