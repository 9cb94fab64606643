// Package proxy is outpost's kube-proxy: one loop that reads Services,
// EndpointSlices, pods and their addresses from the store, together with
// the readiness of this node's pods as the agent sees it now, builds the
// service model (servicemodel.Index) and keeps the nftables table equal
// to it (nft.Table), deleting stale UDP conntrack entries when endpoints
// go (staleflows.go).
//
// The store is the only source, so the rules are rebuilt after a reboot
// with no network, and local endpoints follow local readiness probes while
// the API server is unreachable.
package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/memtrim"
	"github.com/outpost-edge/outpost/internal/report"
	"github.com/outpost-edge/outpost/netproxy/nft"
	"github.com/outpost-edge/outpost/netproxy/servicemodel"
	"github.com/outpost-edge/outpost/store"
)

// Config says what the proxy programs.
type Config struct {
	// Node is this node's name (EndpointSlice endpoints of this node are
	// local).
	Node string
	// PodCIDR is the node's pod range: egress from it is masqueraded,
	// traffic to ClusterIPs from outside it is masqueraded.
	PodCIDR netip.Prefix
	// MinSyncInterval is the least time between two applies, so a burst of
	// changes becomes one batch; zero means DefaultMinSyncInterval. After
	// a sync that took longer than half of it, the pause is twice that
	// sync's time.
	MinSyncInterval time.Duration
	// SettleTimeout bounds how long the first sync waits for the agent to
	// know its pods' readiness when a table from an earlier run is still in
	// the kernel (an agent restart, not a reboot); zero means
	// DefaultSettleTimeout.
	SettleTimeout time.Duration
}

// Defaults.
const (
	DefaultMinSyncInterval = 100 * time.Millisecond
	DefaultSettleTimeout   = 15 * time.Second
	// retryInterval is how soon a failed sync is tried again.
	retryInterval = 2 * time.Second
)

// LocalPods returns this node's pods with their current readiness, and
// whether the agent has seen every pod it runs since it started (settled).
type LocalPods func() (pods []servicemodel.LocalPod, settled bool)

// Ruleset applies Txs to the outpost table: nft.Netlink, or
// nfttest.Fake in tests. It is the ruleset the proxy's nft.Table
// applies through.
type Ruleset = nft.Ruleset

var _ Ruleset = (*nft.Netlink)(nil)

// Deps are the proxy's collaborators.
type Deps struct {
	Store   *store.Store
	Ruleset Ruleset
	// LocalPods gives the readiness of local pods; nil means every pod of
	// the store that has an address counts as ready.
	LocalPods LocalPods
	// Changed, when set, is a channel that receives when LocalPods may
	// return something new (the agent's readiness changed).
	Changed <-chan struct{}
	// Conntrack deletes stale UDP flows; nil skips the cleanup.
	Conntrack Conntrack
	// Clock is the time source; nil means the real one.
	Clock clock.Clock
	Log   *slog.Logger
}

// bigSync is the Tx size (ops) past which a sync hands the memory it used
// back to the system at once (memtrim.Trim: the heap's free pages, and the
// pages of the executable and of the store's file it mapped). A cold sync
// of 10,000 Services is some 140,000 ops and their netlink messages, well
// over 100 MiB at its peak, which the Go runtime would otherwise keep as
// RSS for minutes on a board that has little to spare.
const bigSync = 20000

// bigRead is the number of Services read in one sync past which the sync
// hands the memory back at once too.
const bigRead = 2000

// Proxy keeps the table in step with the store.
type Proxy struct {
	cfg   Config
	deps  Deps
	table *nft.Table

	// syncMu serializes Syncs, which share the feed, the index and the
	// pods' decode cache.
	syncMu sync.Mutex
	// feed has the keys of the Services and EndpointSlices written since
	// the last sync, which are all the index reads again; index is nil
	// until the first sync, and after a failed read of the store, when
	// the next sync reads everything.
	feed      *store.Feed
	index     *servicemodel.Index
	podsCache *store.Cache[*corev1.Pod]
	readMany  bool // this sync read bigRead Services or more

	mu     sync.Mutex
	stats  report.Proxy
	counts syncCounts // by kind and result, for metrics
	// usable remembers each UDP service port's usable endpoints as last
	// applied, to find the flows to delete; nil before the first sync,
	// when what an earlier run applied is not known.
	usable map[string]udpPort
}

// New checks cfg and returns a Proxy; it does not touch the kernel.
func New(cfg Config, deps Deps) (*Proxy, error) {
	if cfg.Node == "" {
		return nil, errors.New("new proxy: node name is not set")
	}
	if !cfg.PodCIDR.IsValid() {
		return nil, errors.New("new proxy: pod CIDR is not set")
	}
	if deps.Store == nil || deps.Ruleset == nil {
		return nil, errors.New("new proxy: store and ruleset are required")
	}
	cfg.MinSyncInterval = cmp.Or(cfg.MinSyncInterval, DefaultMinSyncInterval)
	cfg.SettleTimeout = cmp.Or(cfg.SettleTimeout, DefaultSettleTimeout)
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.Clock == nil {
		deps.Clock = clock.Real{}
	}
	table := nft.NewTable(deps.Ruleset)
	table.ShareServicePorts() // the Index builds new ones
	return &Proxy{
		cfg: cfg, deps: deps, table: table,
		feed:      deps.Store.Feed(store.KindService, store.KindEndpointSlice),
		podsCache: store.NewCache[*corev1.Pod](),
	}, nil
}

// Stats returns what the syncs did so far, for status and metrics.
func (p *Proxy) Stats() report.Proxy {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Sync reads what changed in the store since the last sync and applies
// the difference to the table. The first sync, and one after a failed
// read or too many changes, reads every Service and EndpointSlice; one
// after a failed apply syncs the whole table. Otherwise what a sync
// costs depends on what changed, not on how many Services there are.
func (p *Proxy) Sync() error {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	start := p.deps.Clock.Now()
	full := p.table.Full()
	ops, err := p.sync()
	p.record(start, full, ops, err)
	if ops >= bigSync || p.readMany {
		p.readMany = false
		p.trim()
	}
	return err // "sync table outpost: …"
}

func (p *Proxy) sync() (int, error) {
	keys, all := p.feed.Take()
	reload := all || p.index == nil
	have, err := p.read(keys, reload)
	if err != nil {
		p.index = nil // read everything next time
		return 0, err
	}
	pods, err := p.deps.Store.Pods().ListCached(p.podsCache)
	if err != nil {
		return 0, fmt.Errorf("read pods: %w", err)
	}
	alloc, err := p.deps.Store.Allocations()
	if err != nil {
		return 0, fmt.Errorf("read pod addresses: %w", err)
	}
	ipOf := make(map[string]netip.Addr, len(alloc))
	for ip, owner := range alloc {
		if a, err := netip.ParseAddr(ip); err == nil {
			ipOf[owner] = a
		}
	}
	var local []servicemodel.LocalPod
	if p.deps.LocalPods != nil {
		local, _ = p.deps.LocalPods()
	} else {
		for _, r := range pods {
			if ip, ok := ipOf[string(r.Object.UID)]; ok {
				local = append(local, servicemodel.LocalPod{Pod: r.Object, IPs: []netip.Addr{ip}, Ready: true})
			}
		}
	}
	changes, errs, err := p.build(local, have)
	if err != nil {
		p.index = nil
		return 0, err
	}
	for _, err := range errs {
		p.deps.Log.Debug("service skipped", "err", err)
	}
	hps, errs := hostPorts(pods, ipOf)
	for _, err := range errs {
		p.deps.Log.Debug("hostPort skipped", "err", err)
	}
	if reload || p.table.Full() {
		ports := p.index.Ports()
		ops, err := p.table.Sync(nft.State{PodCIDR: p.cfg.PodCIDR, HostPorts: hps, Services: ports})
		if err != nil {
			return 0, err
		}
		udp := map[string]udpPort{}
		for i := range ports {
			if u, ok := udpOf(&ports[i]); ok {
				udp[ports[i].String()] = u
			}
		}
		p.cleanConntrack(udp, true)
		return ops, nil
	}
	ops, err := p.table.Update(hps, changes)
	if err != nil {
		return 0, err
	}
	udp := map[string]udpPort{}
	for _, c := range changes {
		u, _ := udpOf(c.Port)
		udp[c.Key] = u // the zero udpPort: gone, or not UDP
	}
	p.cleanConntrack(udp, false)
	return ops, nil
}

// read brings the index up to date with the store: every Service and
// EndpointSlice when reload is set, else those under keys. It returns the
// objects it decoded on the way, which build need not read again.
func (p *Proxy) read(keys map[store.Kind][]string, reload bool) (servicemodel.Objects, error) {
	st := p.deps.Store
	var have servicemodel.Objects
	var err error
	if reload {
		svcs, err := st.Services().Keys()
		if err != nil {
			return have, fmt.Errorf("read services: %w", err)
		}
		eps, err := st.EndpointSlices().List()
		if err = p.skipBad(eps == nil, err); err != nil {
			return have, fmt.Errorf("read endpoint slices: %w", err)
		}
		p.index = servicemodel.NewIndex(p.cfg.Node)
		for _, k := range svcs {
			p.index.ServiceChanged(k, true)
		}
		have.Slices = make(map[string]store.Record[*discoveryv1.EndpointSlice], len(eps))
		for _, r := range eps {
			k := store.Key(r.Object.Namespace, r.Object.Name)
			have.Slices[k] = r
			p.index.SliceChanged(k, servicemodel.SliceOwner(r.Object))
		}
		return have, nil
	}
	if svcs := keys[store.KindService]; len(svcs) > 0 {
		have.Services, err = st.Services().GetKeys(svcs)
		if err = p.skipBad(have.Services == nil, err); err != nil {
			return have, fmt.Errorf("read services: %w", err)
		}
		for _, k := range svcs {
			_, ok := have.Services[k]
			p.index.ServiceChanged(k, ok)
		}
	}
	if eps := keys[store.KindEndpointSlice]; len(eps) > 0 {
		have.Slices, err = st.EndpointSlices().GetKeys(eps)
		if err = p.skipBad(have.Slices == nil, err); err != nil {
			return have, fmt.Errorf("read endpoint slices: %w", err)
		}
		for _, k := range eps {
			p.index.SliceChanged(k, servicemodel.SliceOwner(have.Slices[k].Object))
		}
	}
	return have, nil
}

// build builds the Services the index has pending, reading from the
// store those of them and of their EndpointSlices that read did not
// (have).
func (p *Proxy) build(local []servicemodel.LocalPod, have servicemodel.Objects) ([]servicemodel.PortChange, []error, error) {
	svcKeys, sliceKeys := p.index.Pending(local)
	objs := have
	var err error
	if objs.Services, err = getMissing(p, p.deps.Store.Services(), svcKeys, have.Services); err != nil {
		return nil, nil, fmt.Errorf("read services: %w", err)
	}
	if objs.Slices, err = getMissing(p, p.deps.Store.EndpointSlices(), sliceKeys, have.Slices); err != nil {
		return nil, nil, fmt.Errorf("read endpoint slices: %w", err)
	}
	changes, errs := p.index.Build(objs)
	// Every Service was read (a start, a relist, a local pod that came
	// or went): the sync gives the decoded objects' pages back.
	p.readMany = len(svcKeys) >= bigRead
	return changes, errs, nil
}

// getMissing returns have with the objects under keys that have lacks
// read from c (a key not in the map after that is not stored).
func getMissing[T any, P interface {
	*T
	store.Object
}](p *Proxy, c store.Collection[T, P], keys []string, have map[string]store.Record[P]) (map[string]store.Record[P], error) {
	var missing []string
	for _, k := range keys {
		if _, ok := have[k]; !ok {
			missing = append(missing, k)
		}
	}
	got, err := c.GetKeys(missing)
	if err = p.skipBad(got == nil, err); err != nil {
		return nil, err
	}
	if len(have) == 0 {
		return got, nil
	}
	maps.Copy(got, have)
	return got, nil
}

// skipBad returns err when the read failed (failed), else logs it: the
// values that did not decode, each named with its key, are left out as
// if not stored, so that one bad record does not stop every sync.
func (p *Proxy) skipBad(failed bool, err error) error {
	if err == nil || failed {
		return err
	}
	p.deps.Log.Warn("stored object skipped", "err", err)
	return nil
}

// trim gives back the memory a big sync touched.
func (p *Proxy) trim() {
	if _, err := memtrim.Trim(p.deps.Store); err != nil {
		p.deps.Log.Debug("trim memory", "err", err)
	}
}

func (p *Proxy) record(start time.Time, full bool, ops int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.Syncs++
	p.stats.Last = p.deps.Clock.Now()
	p.stats.LastDuration = p.stats.Last.Sub(start)
	p.counts.add(full, p.stats.LastDuration, err)
	p.stats.LastOps = ops
	p.stats.LastError = ""
	if err != nil {
		p.stats.Failures++
		p.stats.LastError = err.Error()
		return
	}
	p.stats.Services = p.index.Len()
	p.stats.Chains, p.stats.Rules, p.stats.Elements = p.table.Counts()
}

// Run syncs at start and after every change until ctx ends. When the
// kernel still holds the table of an earlier run (an agent restart), the
// first sync waits until the agent knows its pods' readiness, up to
// SettleTimeout, so a restart never takes ready endpoints out.
func (p *Proxy) Run(ctx context.Context) {
	changes, cancel := p.deps.Store.Subscribe(store.KindService, store.KindEndpointSlice, store.KindPod, store.KindIPAM)
	defer cancel()
	defer p.feed.Close()
	if c, ok := p.deps.Ruleset.(io.Closer); ok {
		defer c.Close() // the netlink socket kept between syncs
	}
	p.settle(ctx, changes)
	dirty := true
	retry := p.deps.Clock.NewTimer(retryInterval)
	retry.Stop()
	defer retry.Stop()
	pause := p.deps.Clock.NewTimer(p.cfg.MinSyncInterval)
	defer pause.Stop()
	for {
		if dirty {
			dirty = false
			retry.Stop()
			if err := p.Sync(); err != nil {
				p.deps.Log.Warn("sync service rules", "err", err)
				retry.Reset(retryInterval)
			}
			// Coalesce whatever arrives during the pause into the next
			// sync. The pause is at least twice the sync's own time, so
			// a stream of changes (a relist of thousands of Services on
			// a slow board) takes at most a third of a core.
			pause.Reset(max(p.cfg.MinSyncInterval, 2*p.Stats().LastDuration))
			select {
			case <-ctx.Done():
				return
			case <-pause.C():
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-changes:
			dirty = true
		case <-p.deps.Changed:
			dirty = true
		case <-retry.C():
			dirty = true
		}
	}
}

// settle waits before the first sync while an earlier run's table is in
// the kernel and the agent has not yet seen all its pods.
func (p *Proxy) settle(ctx context.Context, changes <-chan struct{}) {
	if p.deps.LocalPods == nil {
		return
	}
	if c, err := p.deps.Ruleset.List(); err != nil || len(c.Chains) == 0 {
		return // a reboot or a first start: nothing to keep
	}
	deadline := p.deps.Clock.NewTimer(p.cfg.SettleTimeout)
	defer deadline.Stop()
	tick := p.deps.Clock.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, settled := p.deps.LocalPods(); settled {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C():
			p.deps.Log.Warn("pod readiness not known yet; syncing service rules anyway", "waited", p.cfg.SettleTimeout)
			return
		case <-tick.C():
		case <-changes:
		case <-p.deps.Changed:
		}
	}
}

// hostPorts lists the hostPorts of the desired pods that have an
// address, and one error per hostPort it skipped, naming the pod and
// field. What the table cannot render is skipped here, so that one pod's
// hostPort (a host IP of the other family than the pod's address passes
// the API server's validation) does not fail every sync and leave the
// node without Services; a host IP that does not parse is skipped rather
// than taken to mean every address.
func hostPorts(pods []store.Record[*corev1.Pod], ipOf map[string]netip.Addr) ([]nft.HostPort, []error) {
	var out []nft.HostPort
	var errs []error
	for _, r := range pods {
		pod := r.Object
		ip, ok := ipOf[string(pod.UID)]
		if !ok || pod.Spec.HostNetwork {
			continue
		}
		ip = ip.Unmap()
		for i, c := range pod.Spec.Containers {
			for j, port := range c.Ports {
				if port.HostPort == 0 {
					continue
				}
				hp, err := hostPort(port, ip)
				if err != nil {
					errs = append(errs, fmt.Errorf("pod %s: spec.containers[%d].ports[%d]: %w", store.Key(pod.Namespace, pod.Name), i, j, err))
					continue
				}
				out = append(out, hp)
			}
		}
	}
	return out, errs
}

// hostPort is port of a pod with address podIP, or why the table cannot
// have it.
func hostPort(port corev1.ContainerPort, podIP netip.Addr) (nft.HostPort, error) {
	proto := cmp.Or(port.Protocol, corev1.ProtocolTCP)
	switch proto {
	case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
	default:
		return nft.HostPort{}, fmt.Errorf("protocol %q is not TCP, UDP or SCTP", port.Protocol)
	}
	if port.HostPort < 1 || port.HostPort > 65535 {
		return nft.HostPort{}, fmt.Errorf("hostPort %d is not from 1 to 65535", port.HostPort)
	}
	if port.ContainerPort < 1 || port.ContainerPort > 65535 {
		return nft.HostPort{}, fmt.Errorf("containerPort %d is not from 1 to 65535", port.ContainerPort)
	}
	hp := nft.HostPort{Protocol: string(proto), HostPort: uint16(port.HostPort), PodIP: podIP, ContainerPort: uint16(port.ContainerPort)}
	if port.HostIP != "" {
		a, err := netip.ParseAddr(port.HostIP)
		if err != nil || a.Zone() != "" {
			return nft.HostPort{}, fmt.Errorf("hostIP %q is not an IP address", port.HostIP)
		}
		if a = a.Unmap(); !a.IsUnspecified() && a.Is4() != podIP.Is4() {
			return nft.HostPort{}, fmt.Errorf("hostIP %s is not of the family of the pod's address %s", a, podIP)
		}
		hp.HostIP = a
	}
	return hp, nil
}
