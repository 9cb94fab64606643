package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/agent/cgroups"
	ctrd "github.com/outpost-edge/outpost/agent/containerd"
	"github.com/outpost-edge/outpost/agent/crilog"
	"github.com/outpost-edge/outpost/agent/podenv"
	"github.com/outpost-edge/outpost/agent/stats"
	"github.com/outpost-edge/outpost/agent/volume"
	"github.com/outpost-edge/outpost/arm"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/config"
	"github.com/outpost-edge/outpost/internal/memtrim"
	"github.com/outpost-edge/outpost/internal/sdnotify"
	"github.com/outpost-edge/outpost/netproxy/proxy"
	"github.com/outpost-edge/outpost/store"
)

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	level.UnmarshalText([]byte(cfg.Log.Level)) // validated by config
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// agentGCPercent is the agent's GOGC unless the environment sets one,
// and agentIdleGCPercent its GOGC once the pods have been quiet for
// trimQuiet (internal/memtrim.GC).
const (
	agentGCPercent     = 50
	agentIdleGCPercent = 20
)

// agentMaxProcs is the agent's GOMAXPROCS unless the environment sets
// one. The agent mostly waits: on containerd, the API server, the
// kernel's nftables commits (a thread in a system call holds no P). Each
// P keeps a span of its own for every size class it allocates from and
// a cache of stacks, which stay partly used once the pods are quiet: one
// P instead of two left 0.3 MiB less anonymous memory with 30 pods on a
// 2-core machine (docs/testing.md), and a 4-core board has more to lose.
const agentMaxProcs = 1

// spareAfter is how long a container runs before the agent makes its next
// attempt's container ahead (agent/spare.go): past a start's burst, and
// past a container that ends at once.
const spareAfter = 10 * time.Second

// trimQuiet is how long the desired pods go unchanged (after the agent's
// start, or their last change) before the agent gives back the memory
// the busy time touched (internal/memtrim).
const trimQuiet = 10 * time.Second

func runAgent(ctx context.Context, args []string, stderr io.Writer) error {
	fs, path := newFlags("agent")
	noPods := fs.Bool("record-only", false, "record manifests into the store without running pods (no containerd needed)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(*path)
	if err != nil {
		return err
	}
	log := newLogger(cfg, stderr)
	// On a board the heap's size matters more than the collector's CPU:
	// the agent's live heap is a few MiB, so collecting at 50 % growth
	// instead of 100 % keeps RSS down for a negligible cost, and at 20 %
	// once the pods are quiet, when it allocates slowly. GOGC in the
	// environment still wins, busy or idle.
	var gc memtrim.GC
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(agentGCPercent)
		gc = memtrim.GC{Busy: agentGCPercent, Idle: agentIdleGCPercent}
	}
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(agentMaxProcs)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	// The agent's parts start in the order below and stop in reverse,
	// also when one fails to start: the store closes last, after
	// everything that uses it.
	var ps parts
	defer ps.stop()
	st, err := store.Open(cfg.StorePath(), store.Options{NodeName: cfg.NodeName})
	if err != nil {
		return err
	}
	ps.onStop(func() { st.Close() })
	board := arm.Read("/")
	clk := clock.Real{}
	// The agent and the runtime are made below; the Node's facts are
	// read from them once the sync runs, which is after.
	var a *agent.Agent
	var running atomic.Pointer[agent.Agent] // for the proxy, once made
	var rt *ctrd.Runtime
	nf := &nodeFacts{cfg: cfg, clk: clk, board: board, health: func() arm.Readings { return arm.Health("/") }}
	ksync, err := newKubeSync(cfg, st, clk, log, nf.facts)
	if err != nil {
		return err
	}
	msync, err := newMQTTSync(cfg, st, clk, log, nf.facts)
	if err != nil {
		return err
	}
	if err := board.MemoryCgroupError(); err != nil {
		log.Warn("board check", "err", err, "cgroup", board.Cgroup)
	}
	acfg := agent.Config{
		Board:       board,
		NodeName:    cfg.NodeName,
		ManifestDir: cfg.ManifestDir,
		SocketPath:  cfg.SocketPath(),
		Version:     version,
		Pods: agent.PodConfig{
			HostIP:         hostIP(),
			ClusterDNS:     cfg.Network.ClusterDNS,
			ClusterDomain:  cfg.Network.ClusterDomain,
			PodsDir:        filepath.Join(cfg.StateDir, "pods"),
			LogDir:         cfg.LogDir,
			MemoryCapacity: memTotal(),
			CgroupParent:   cfg.Containerd.CgroupParent,
			SpareAfter:     spareAfter,
		},
	}
	deps := agent.Deps{Store: st, Clock: clk, Log: log, BoardHealth: func() arm.Readings { return arm.Health("/") }}
	var tokens volume.TokenFunc // the pods' service account tokens
	switch {
	case ksync != nil:
		deps.Link, tokens = ksync.link, ksync.PodToken
	case msync != nil:
		deps.Link, tokens = msync.Link, msync.PodToken
	}
	var images *imageDir
	var px *proxy.Proxy // nil with --record-only
	if !*noPods {
		oci, err := lookOCIRuntime(ctx, cfg.Containerd.OCIRuntime)
		if err != nil {
			return err
		}
		rt, err = connectRuntime(ctx, cfg, oci, clk, log)
		if err != nil {
			return err
		}
		// The pods' workers all list their containers as they start:
		// one listing, taken now, serves each one's first.
		rt.Prime(ctx)
		ps.onStop(func() { rt.Close() })
		// Pods start with no registry in reach: their images are
		// imported before the first pod runs, and later ones as they come.
		images = newImageDir(cfg.ImageDir, rt, log)
		images.importAll(ctx)
		if deps.Pods, err = newPodDeps(cfg, st, clk, log, rt, acfg.Pods, tokens); err != nil {
			return err
		}
		var nw agent.PodNetwork
		nw, px, err = newPodNetwork(ctx, cfg, st, acfg.Pods.HostIP, &running, log)
		if err != nil {
			return err
		}
		deps.Pods.Network = nw
		deps.Proxy = px.Stats
		// The proxy starts before the pods, so the rules are in place
		// before any network is needed.
		ps.start(ctx, px.Run)
	}
	a, err = agent.New(acfg, deps)
	if err != nil {
		return err
	}
	running.Store(a)
	if ksync != nil || msync != nil {
		nf.agent, nf.rt, nf.hostIP = a, rt, acfg.Pods.HostIP
		if rt != nil {
			nf.version, _ = rt.Version(ctx)
		}
	}
	if ksync != nil {
		a.OnEvent(func(p *corev1.Pod, e agent.Event) { ksync.Event(p, e.Type, e.Reason, e.Message, e.Time) })
		ps.start(ctx, ksync.run)
	}
	if msync != nil {
		a.OnEvent(func(p *corev1.Pod, e agent.Event) { msync.Event(p, e.Type, e.Reason, e.Message, e.Time) })
		ps.start(ctx, msync.run)
	}
	api, err := newKubeletAPI(cfg, a, ksync, acfg.Pods.HostIP, metricsWriter(a, st, ksync, msync, px, deps.BoardHealth), stats.New(stats.Options{NodeName: cfg.NodeName, CgroupParent: cfg.Containerd.CgroupParent, Clock: clk}), clk, log)
	if err != nil {
		return err
	}
	if api != nil {
		ps.start(ctx, func(ctx context.Context) {
			// The pods keep running without the API: a port in use is
			// logged, not fatal.
			if err := api.Run(ctx); err != nil {
				log.Error("kubelet api stopped", "err", err)
			}
		})
		if msync != nil && msync.tunnel != nil {
			ps.start(ctx, func(ctx context.Context) { serveTunnel(ctx, msync.tunnel, api.srv.Authorized(), log) })
		}
	}
	if images != nil {
		images.onImport = a.WakePods
		ps.start(ctx, func(ctx context.Context) { images.watch(ctx, clk, imagePollInterval) })
	}
	// What starting the agent and its pods touched and idling does not
	// use goes back to the kernel once the pods have been quiet a while.
	podChanges, unsubscribe := st.Subscribe(store.KindPod)
	ps.onStop(unsubscribe)
	ps.start(ctx, func(ctx context.Context) { memtrim.Run(ctx, podChanges, clk, trimQuiet, log, gc, st) })
	ps.start(ctx, func(ctx context.Context) { notifyServiceManager(ctx, a, clk, log) })
	// The pods run in this goroutine; once they stop, the parts above
	// stop in reverse order.
	return a.Run(ctx)
}

// newPodDeps returns what the agent's pods run on, but their network:
// the runtime, the cgroup tree, the containers' environment and their
// volumes, with service account tokens from tokens (nil: none).
func newPodDeps(cfg config.Config, st *store.Store, clk clock.Clock, log *slog.Logger, rt *ctrd.Runtime, pods agent.PodConfig, tokens volume.TokenFunc) (agent.PodDeps, error) {
	vols, err := volume.New(volume.Config{PodsDir: pods.PodsDir}, volume.Deps{Store: st, Clock: clk, Log: log, Tokens: tokens})
	if err != nil {
		return agent.PodDeps{}, err
	}
	sources := podenv.StoreSources(st)
	sources.HostIP = pods.HostIP
	// The downward API's limits.cpu and limits.memory of a container
	// that sets none are the node's allocatable, as with kubelet.
	alloc := agent.NodeStatus(agent.NodeConfig{MaxPods: cfg.Node.MaxPods, StorageDir: cfg.StateDir}, agent.NodeDeps{Clock: clk}).Allocatable
	sources.NodeAllocatable = alloc
	podInfo := func(podIP string) volume.PodInfo {
		return volume.PodInfo{PodIP: podIP, HostIP: pods.HostIP, NodeAllocatable: alloc}
	}
	return agent.PodDeps{
		Runtime: rt,
		Cgroups: cgroups.Tree{Parent: cfg.Containerd.CgroupParent},
		Env: func(pod *corev1.Pod, c *corev1.Container, podIP string) ([]string, error) {
			s := sources
			s.PodIP = podIP
			return podenv.Env(pod, c, s)
		},
		Volumes: func(ctx context.Context, pod *corev1.Pod, c *corev1.Container, podIP string) ([]specs.Mount, error) {
			vs, err := vols.Setup(ctx, pod, podInfo(podIP))
			if err != nil {
				return nil, err
			}
			return volume.Mounts(pod, c, vs)
		},
		RefreshVolumes: func(ctx context.Context, pod *corev1.Pod, podIP string) error {
			_, err := vols.Setup(ctx, pod, podInfo(podIP))
			return err
		},
		TeardownVolumes: vols.Teardown,
	}, nil
}

// notifyServiceManager tells systemd (a Type=notify unit) that the agent
// is ready once it serves and has read its manifests, pets the watchdog
// (WatchdogSec) while the agent's main loop keeps turning, and says
// STOPPING=1 when ctx ends. Under no service manager it does nothing.
func notifyServiceManager(ctx context.Context, a *agent.Agent, clk clock.Clock, log *slog.Logger) {
	select {
	case <-ctx.Done():
		return
	case <-a.Ready():
	}
	sent, err := sdnotify.Notify(sdnotify.Ready)
	if err != nil {
		log.Warn("tell systemd the agent is ready", "err", err)
	}
	if !sent {
		return
	}
	defer sdnotify.Notify(sdnotify.Stopping)
	interval, ok := sdnotify.WatchdogInterval()
	if !ok {
		<-ctx.Done()
		return
	}
	tick := clk.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
		// A loop that has not turned for a whole interval is stuck: let
		// systemd restart the agent (the unit's KillMode=process leaves
		// the containers running).
		if age := clk.Since(a.Heartbeat()); age > interval {
			log.Warn("agent main loop stalled; not petting the watchdog", "since", age.Round(time.Second))
			continue
		}
		if _, err := sdnotify.Notify(sdnotify.Watchdog); err != nil {
			log.Warn("pet the systemd watchdog", "err", err)
		}
	}
}

// connectRuntime connects to containerd, waiting for it (it may start
// after the agent at boot) until ctx ends.
func connectRuntime(ctx context.Context, cfg config.Config, oci ociRuntime, clk clock.Clock, log *slog.Logger) (*ctrd.Runtime, error) {
	backoff := time.Second
	shim := shimStart(log)
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		rt, err := ctrd.New(cctx, ctrd.Config{
			Address: cfg.Containerd.Address, Namespace: cfg.Containerd.Namespace,
			FIFODir: filepath.Join(cfg.RunDir, "fifo"), ShimGroups: cfg.Containerd.ShimGroups, ShimStart: shim,
			OCIRuntime: oci.path, SpecVersion: oci.specVersion, AgentVersion: version,
			Log: crilog.Options{MaxBytes: cfg.ContainerLogMaxBytes(), MaxFiles: cfg.ContainerLogMaxFiles},
		}, ctrd.Deps{Clock: clk, Log: log})
		cancel()
		if err == nil {
			v, _ := rt.Version(ctx)
			log.Info("connected to containerd", "address", cfg.Containerd.Address, "version", v, "namespace", cfg.Containerd.Namespace, "ociRuntime", cmp.Or(oci.path, "runc"))
			return rt, nil
		}
		log.Warn("containerd not reachable; retrying", "address", cfg.Containerd.Address, "err", err, "in", backoff)
		t := clk.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, errors.Join(err, ctx.Err())
		case <-t.C():
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// hostIP is the first global unicast IPv4 address of an interface that is
// up, the node's InternalIP.
func hostIP() string {
	ifaces, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, i := range ifaces {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 || strings.HasPrefix(i.Name, "outpost") || strings.HasPrefix(i.Name, "vo") {
			continue
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && ipn.IP.IsGlobalUnicast() {
				return ipn.IP.String()
			}
		}
	}
	return ""
}

// memTotal is the node's memory in bytes.
func memTotal() int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}

// shimStartBinary is the runtime binary outpost hands containerd for its
// tasks when it is installed beside outpost (cmd/containerd-shim-outpost-v2).
const shimStartBinary = "containerd-shim-outpost-v2"

// shimStart returns the path of shimStartBinary beside this executable,
// or "" when it is not there: then containerd starts tasks with the
// runc shim alone, only slower.
func shimStart(log *slog.Logger) string {
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(self), shimStartBinary)
	if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		log.Debug("no shim start binary beside outpost; tasks start through the runc shim", "path", p)
		return ""
	}
	return p
}
