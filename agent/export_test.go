package agent

import (
	"context"
	"log/slog"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/store"
)

// The pod worker tests live in package agent_test: agent/runtimetest
// imports agent, so a test in package agent cannot import it. These
// names let them drive the pod manager the way Agent.Run does.

// PodManager is the pod manager.
type PodManager = podManager

// NewPodManager is newPodManager.
func NewPodManager(cfg PodConfig, deps PodDeps, st *store.Store, clk clock.Clock, log *slog.Logger) *PodManager {
	return newPodManager(cfg, deps, st, clk, log)
}

// Run is run.
func (m *podManager) Run(ctx context.Context) { m.run(ctx) }

// Views is views.
func (m *podManager) Views() map[string]PodView { return m.views() }

// WakeAll is wakeAll.
func (m *podManager) WakeAll() { m.wakeAll() }

// Events returns the pod events kept for uid.
func (m *podManager) Events(uid string) []Event { return m.events.list(uid) }

// PullPolicy is pullPolicy.
func PullPolicy(c *corev1.Container) corev1.PullPolicy { return pullPolicy(c) }

// ContainerID is containerID.
func ContainerID(podUID, name string, attempt int) string { return containerID(podUID, name, attempt) }

// Exiting returns how many workers have removed their pod and not yet
// exited: such a worker stops its timer only as it exits, after its last
// sync.
func (m *podManager) Exiting() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, w := range m.workers {
		if w.getState() == LifecycleRemoved {
			n++
		}
	}
	return n
}
