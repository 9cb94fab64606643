package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/outpost-edge/outpost/agent"
	ctrd "github.com/outpost-edge/outpost/agent/containerd"
	"github.com/outpost-edge/outpost/arm"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/config"
	"github.com/outpost-edge/outpost/internal/report"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/sync/kube"
)

// kubeSync is the API server sync and, when bootstrapping, the client
// certificate it runs on.
type kubeSync struct {
	*kube.Syncer
	boot   *kube.Bootstrapper // nil without bootstrapKubeconfig
	client *kube.Client
}

// newKubeSync reads the kubeconfig (or the bootstrap credentials) and
// returns the API server sync, or nil when the agent runs standalone. A
// kubeconfig that cannot be used is a usage error (exit 2) naming the file
// and what is wrong; an unreachable API server is not an error at all.
func newKubeSync(cfg config.Config, st *store.Store, clk clock.Clock, log *slog.Logger, facts func() kube.NodeFacts) (*kubeSync, error) {
	if cfg.Kubeconfig == "" {
		return nil, nil
	}
	k := &kubeSync{}
	var rc *rest.Config
	if cfg.BootstrapKubeconfig != "" {
		boot, err := kube.NewBootstrapper(kube.BootstrapConfig{
			NodeName: cfg.NodeName, Kubeconfig: cfg.Kubeconfig, BootstrapKubeconfig: cfg.BootstrapKubeconfig,
			CertDir: cfg.CertDir(), UserAgent: "outpost/" + version,
		}, kube.BootstrapDeps{Clock: clk, Log: log.With("component", "bootstrap")})
		if err != nil {
			return nil, usageError{err}
		}
		k.boot, rc = boot, boot.Config()
	} else {
		var err error
		if rc, err = kube.LoadKubeconfig(cfg.Kubeconfig); err != nil {
			return nil, usageError{err}
		}
	}
	client, err := kube.NewClient(rc, "outpost/"+version)
	if err != nil {
		return nil, usageError{fmt.Errorf("kubeconfig %s: %w", cfg.Kubeconfig, err)}
	}
	k.client = client
	taints := make([]corev1.Taint, len(cfg.Node.Taints))
	for i, t := range cfg.Node.Taints {
		taints[i] = corev1.Taint{Key: t.Key, Value: t.Value, Effect: corev1.TaintEffect(t.Effect)}
	}
	k.Syncer, err = kube.New(kube.Config{
		NodeName: cfg.NodeName, Labels: cfg.Node.Labels, Taints: taints,
		WriteQPS: cfg.API.WriteQPS, WriteBurst: cfg.API.WriteBurst,
		EventQPS: cfg.API.EventQPS, EventBurst: cfg.API.EventBurst,
	}, kube.Deps{Client: client, Store: st, NodeFacts: facts, Clock: clk, Log: log.With("component", "kube")})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// run runs the sync until ctx ends and returns after it stopped. When
// bootstrapping, the sync starts once the node has a certificate (the
// pods run meanwhile) and the bootstrapper keeps renewing it.
func (k *kubeSync) run(ctx context.Context) {
	var ps parts
	defer ps.stop()
	if k.boot != nil {
		ps.start(ctx, func(ctx context.Context) { k.boot.Run(ctx) })
		select {
		case <-ctx.Done():
			return
		case <-k.boot.Ready():
		}
	}
	k.Syncer.Run(ctx)
}

// link is the syncer's link state with the static pods that have no
// mirror pod and, when bootstrapping, the client certificate.
func (k *kubeSync) link() report.Link {
	l := k.Link()
	l.MirrorErrors = k.MirrorErrors()
	if k.boot != nil {
		c := k.boot.State()
		l.Certificate = &c
	}
	return l
}

// nodeFacts gathers what the Node's status says from the agent, the
// runtime and the board. Its fields are set before the sync starts.
type nodeFacts struct {
	cfg   config.Config
	clk   clock.Clock
	board arm.Facts
	// hostIP is the InternalIP the pods were given as status.hostIP, so
	// the Node says the same.
	hostIP string
	agent  *agent.Agent
	rt     *ctrd.Runtime // nil with --record-only
	// health reads the board's sensors, whose conditions (UnderVoltage,
	// Throttled, HighTemperature) join the Node's; nil leaves them out.
	health func() arm.Readings

	// Only the sync's node loop calls facts, so these need no lock.
	version   string
	checked   time.Time
	healthErr error
}

// runtimeCheckEvery bounds how often the Node's Ready condition asks
// containerd whether it answers.
const runtimeCheckEvery = 10 * time.Second

func (n *nodeFacts) facts() kube.NodeFacts {
	deps := agent.NodeDeps{Clock: n.clk, Heartbeat: n.agent.Heartbeat, StoreWrites: n.agent.StoreWrites}
	if n.rt != nil {
		deps.RuntimeHealth = n.runtimeHealth
	}
	st := agent.NodeStatus(agent.NodeConfig{
		Hostname: n.cfg.NodeName, HostIP: n.hostIP, MaxPods: n.cfg.Node.MaxPods,
		StorageDir: n.cfg.StateDir, RuntimeVersion: n.version, KubeletPort: kubeletPort(n.cfg),
	}, deps)
	if n.health != nil {
		st.Conditions = append(st.Conditions, boardConditions(n.health())...)
	}
	return kube.NodeFacts{Labels: n.board.Labels(), Status: st}
}

// boardConditions turns the board's sensor readings into node conditions,
// with a reason and a message that says what to do.
func boardConditions(r arm.Readings) []corev1.NodeCondition {
	var out []corev1.NodeCondition
	for _, c := range arm.Conditions(r) {
		status := corev1.ConditionFalse
		if c.Status {
			status = corev1.ConditionTrue
		}
		out = append(out, corev1.NodeCondition{Type: corev1.NodeConditionType(c.Type), Status: status, Reason: c.Reason, Message: c.Message})
	}
	return out
}

// runtimeHealth asks containerd for its version at most every
// runtimeCheckEvery and returns the last answer.
func (n *nodeFacts) runtimeHealth() error {
	if !n.checked.IsZero() && n.clk.Since(n.checked) < runtimeCheckEvery {
		return n.healthErr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v, err := n.rt.Version(ctx)
	if err == nil && v != "" {
		n.version = v
	}
	n.checked, n.healthErr = n.clk.Now(), err
	return err
}

// kubeletPort is the port of server.address, published as the Node's
// kubelet endpoint.
func kubeletPort(cfg config.Config) int32 {
	_, port, err := net.SplitHostPort(cfg.Server.Address)
	if err != nil {
		return 0
	}
	p, _ := strconv.Atoi(port)
	return int32(p)
}
