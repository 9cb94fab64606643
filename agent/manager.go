package agent

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/store"
)

// PodNetwork gives pods their network namespace and address; cmd wires
// netproxy/podnet to it. Setup is idempotent: after an agent restart it
// returns what an earlier call made.
type PodNetwork interface {
	Setup(ctx context.Context, podUID string) (netnsPath string, ip netip.Addr, err error)
	Teardown(ctx context.Context, podUID string) error
}

// PodCgroups removes the cgroups runc leaves; cmd wires agent/cgroups to
// it. A cgroup that still has processes is left, with an error (a
// removed pod's processes are killed first).
type PodCgroups interface {
	// RemovePod removes a pod's cgroup and its containers', in every
	// hierarchy.
	RemovePod(podUID string) error
	// RemoveContainer removes one container attempt's cgroup.
	RemoveContainer(podUID, id string) error
}

// PodConfig is what the pod manager needs to know of the node.
type PodConfig struct {
	NodeName      string
	HostIP        string
	ClusterDNS    string
	ClusterDomain string
	// PodsDir holds per-pod files (etc files, volumes), LogDir the CRI
	// logs (/var/log/pods).
	PodsDir, LogDir string
	// MemoryCapacity is the node's memory in bytes, for oom_score_adj.
	MemoryCapacity int64
	// CgroupParent holds the pods' cgroups, pod<UID> each (default
	// /outpost).
	CgroupParent string
	// SpareAfter is how long a container runs before its worker makes
	// its next attempt's container ahead, a spare (see spare.go); 0
	// makes none.
	SpareAfter time.Duration
}

// PodDeps are the pod manager's collaborators; Runtime, Store, Clock and
// Log are required.
type PodDeps struct {
	Runtime Runtime
	Network PodNetwork // nil: every pod uses the host network
	Cgroups PodCgroups // nil: cgroups are left to the runtime
	// Env builds a container's environment; nil uses literal values only.
	Env func(pod *corev1.Pod, c *corev1.Container, podIP string) ([]string, error)
	// Volumes returns a container's volume mounts, preparing the pod's
	// volumes; TeardownVolumes removes them. nil: pods with volumes fail.
	Volumes func(ctx context.Context, pod *corev1.Pod, c *corev1.Container, podIP string) ([]specs.Mount, error)
	// RefreshVolumes rewrites the content volumes (configMap, secret,
	// downwardAPI, projected) of a pod whose containers run, so they see
	// edits of their config maps and secrets; nil: never refreshed.
	RefreshVolumes  func(ctx context.Context, pod *corev1.Pod, podIP string) error
	TeardownVolumes func(podUID string) error
	Rand            func(n int64) int64
}

// podManager runs one worker per desired pod and routes events to them.
type podManager struct {
	cfg             PodConfig
	store           *store.Store
	rt              Runtime
	net             PodNetwork
	cgroups         PodCgroups
	clock           clock.Clock
	log             *slog.Logger
	env             func(pod *corev1.Pod, c *corev1.Container, podIP string) ([]string, error)
	volumes         func(ctx context.Context, pod *corev1.Pod, c *corev1.Container, podIP string) ([]specs.Mount, error)
	refreshVolumes  func(ctx context.Context, pod *corev1.Pod, podIP string) error
	teardownVolumes func(podUID string) error
	rand            func(int64) int64
	events          *eventLog
	started         time.Time
	metrics         podMetrics

	mu      sync.Mutex
	workers map[string]*worker
	wg      sync.WaitGroup
	// spareMu is held by the worker making a spare: the spares are made
	// one at a time, in the background of the pods (makeSpare).
	spareMu sync.Mutex
}

func newPodManager(cfg PodConfig, deps PodDeps, st *store.Store, clk clock.Clock, log *slog.Logger) *podManager {
	m := &podManager{
		cfg: cfg, store: st, rt: deps.Runtime, net: deps.Network, cgroups: deps.Cgroups, clock: clk, log: log,
		env: deps.Env, volumes: deps.Volumes, refreshVolumes: deps.RefreshVolumes, teardownVolumes: deps.TeardownVolumes, rand: deps.Rand,
		events: newEventLog(clk, 20), workers: map[string]*worker{},
	}
	if m.env == nil {
		m.env = literalEnv
	}
	if m.cfg.CgroupParent == "" {
		m.cfg.CgroupParent = "/outpost"
	}
	if m.rand == nil {
		m.rand = func(n int64) int64 { return rand.Int64N(n) }
	}
	return m
}

// literalEnv is the environment from value fields only.
func literalEnv(_ *corev1.Pod, c *corev1.Container, _ string) ([]string, error) {
	var env []string
	for _, e := range c.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	return env, nil
}

func (m *podManager) podDir(uid string) string { return filepath.Join(m.cfg.PodsDir, uid) }

func (m *podManager) logDir(p *corev1.Pod) string {
	return filepath.Join(m.cfg.LogDir, p.Namespace+"_"+p.Name+"_"+string(p.UID))
}

// restarted reports whether a container was already running when this
// agent started, so its probes start with jitter.
func (m *podManager) restarted(c Container) bool {
	return !c.StartedAt.IsZero() && c.StartedAt.Before(m.started)
}

// run keeps a worker per desired pod until ctx ends, then waits for them.
func (m *podManager) run(ctx context.Context) {
	m.started = m.clock.Now()
	// Pods and the objects their volumes and env refer to are watched
	// apart: a pod's change wakes only that pod's worker, and a config
	// map's or secret's wakes every worker.
	pods, cancelPods := m.store.Subscribe(store.KindPod)
	defer cancelPods()
	refs, cancelRefs := m.store.Subscribe(store.KindConfigMap, store.KindSecret)
	defer cancelRefs()
	exits := m.rt.Exits(ctx)
	m.syncDesired(ctx, true, false)
	for {
		select {
		case <-ctx.Done():
			m.wg.Wait()
			return
		case <-pods:
			m.syncDesired(ctx, false, false)
		case <-refs:
			m.syncDesired(ctx, false, true)
		case id, ok := <-exits:
			if !ok {
				exits = nil
				continue
			}
			if id == "" {
				m.wakeAll()
				continue
			}
			m.wakeByContainer(id)
		}
	}
}

// syncDesired hands every worker whose pod changed its newest pod, starts
// workers for new pods and tells workers of removed pods to clean up;
// with refsChanged (a config map or secret changed) it wakes the workers
// of unchanged pods too. At start it also finds containers of pods the
// store no longer has. A woken worker syncs its pod with containerd (a
// list, a task state per container), so another pod's change wakes no
// worker: 30 pods created one after another would cost 30 × 30 syncs.
func (m *podManager) syncDesired(ctx context.Context, first, refsChanged bool) {
	recs, err := m.store.Pods().List()
	if err != nil {
		m.log.Error("read desired pods", "err", err)
	}
	desired := map[string]*corev1.Pod{}
	for _, r := range recs {
		desired[string(r.Object.UID)] = r.Object
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for uid, p := range desired {
		if w, ok := m.workers[uid]; ok {
			w.mu.Lock()
			same := reflect.DeepEqual(w.desired, p)
			w.mu.Unlock()
			if !same {
				w.update(p)
			} else if refsChanged {
				w.poke()
			}
			continue
		}
		m.startWorker(ctx, p)
	}
	for uid, w := range m.workers {
		if _, ok := desired[uid]; !ok {
			w.update(nil)
		}
	}
	if !first {
		return
	}
	cs, err := m.rt.List(ctx, "")
	if err != nil {
		m.log.Warn("list containers for orphans", "err", err)
		return
	}
	for _, c := range cs {
		uid := c.Labels[LabelPodUID]
		if _, ok := m.workers[uid]; ok || uid == "" {
			continue
		}
		m.removeOrphan(ctx, uid, c.Labels[LabelPodNamespace], c.Labels[LabelPodName])
	}
	// Pods that left no container but their directory (a crash or a
	// power cut while they were removed): the agent made that directory
	// before their first container, so their network, volumes and
	// cgroups are its own to finish removing. Nothing is removed of a
	// pod the agent has no record of.
	entries, err := os.ReadDir(m.cfg.PodsDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		m.log.Warn("list pod directories for orphans", "err", err)
	}
	for _, e := range entries {
		uid := e.Name()
		if _, ok := m.workers[uid]; ok || !e.IsDir() {
			continue
		}
		m.removeOrphan(ctx, uid, "", "")
	}
}

// removeOrphan starts a worker that removes what is left of a pod the
// store no longer has; m.mu is held.
func (m *podManager) removeOrphan(ctx context.Context, uid, namespace, name string) {
	orphan := &corev1.Pod{}
	orphan.UID = types.UID(uid)
	orphan.Namespace, orphan.Name = namespace, name
	m.startWorker(ctx, orphan).update(nil)
}

func (m *podManager) startWorker(ctx context.Context, p *corev1.Pod) *worker {
	w := newWorker(m, p)
	m.workers[w.uid] = w
	m.wg.Go(func() {
		w.run(ctx)
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.workers[w.uid] != w {
			return
		}
		delete(m.workers, w.uid)
		// The pod came back while it was being removed (a static pod
		// whose manifest was put back has the same UID): run it afresh.
		w.mu.Lock()
		back := w.desired
		w.mu.Unlock()
		if back != nil && ctx.Err() == nil {
			m.startWorker(ctx, back)
		}
	})
	return w
}

// wakeAll makes every worker sync now.
func (m *podManager) wakeAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, w := range m.workers {
		w.poke()
	}
}

func (m *podManager) wakeByContainer(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for uid, w := range m.workers {
		if len(id) > 12 && id[:12] == uidPrefix(uid) {
			w.poke()
		}
	}
}

// PodView is one pod as the agent last saw it.
type PodView struct {
	Pod    *corev1.Pod
	Status corev1.PodStatus
	State  Lifecycle
	Events []Event
	// NetNS is the pod's network namespace, "" for the host's or before
	// the pod's network is set up.
	NetNS string
}

// views returns the workers' current pods and statuses.
func (m *podManager) views() map[string]PodView {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]PodView, len(m.workers))
	for uid, w := range m.workers {
		w.mu.Lock()
		if w.desired != nil {
			out[uid] = PodView{Pod: w.desired, Status: *w.status.DeepCopy(), State: w.state, Events: m.events.list(uid), NetNS: w.netnsPath}
		}
		w.mu.Unlock()
	}
	return out
}
