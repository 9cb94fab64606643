// Package volume prepares a pod's volumes on the node the way kubelet does,
// and turns a container's volumeMounts into OCI mounts.
//
// # Basics
//
// Each volume of a pod lives in PodsDir/<podUID>/volumes/<kind>/<name>,
// except hostPath volumes, which are the host path itself after kubelet's
// type checks. An emptyDir is a directory, or a tmpfs for medium Memory.
// configMap, secret, downwardAPI and projected volumes are content volumes:
// Setup writes them the way kubelet's AtomicWriter does, into a timestamped
// hidden directory that a "..data" symlink points to, swapped with one
// rename, with each user-visible name a symlink into "..data/". A reader
// never sees a half-written update. Calling Setup again refreshes content
// volumes from the store, rewriting one only when its files would change.
// Secret and projected volumes are on tmpfs, as in kubelet, so secrets
// never reach the SD card through them. Teardown unmounts and removes
// everything.
//
// A projected serviceAccountToken source is a token bound to the pod that
// Deps.Tokens requests from the API server, cached in memory and refreshed
// as kubelet's token manager does (after 80% of its lifetime, or a day).
// Offline, the pod keeps the token it has: each token is also kept in
// PodsDir/<podUID>/tokens (mode 0600, on disk like the secrets in the
// store), so a pod that had one starts again after a reboot without the
// API server.
//
// # Caveats
//
// Mounts resolves a subPath when it is called: it rejects "..", absolute
// paths and symlinks leaving the volume, and returns a path free of
// symlinks. Unlike kubelet it does not bind-mount that path into a private
// directory, so a container that can write to the volume and swaps a
// directory for a symlink between Mounts and the runtime's mount could
// still redirect it. The fsGroup of the pod is applied (group ownership and
// group read bits); runAsUser, defaultUser and user fields are not, except
// that a token file belongs to the user all containers run as (kubelet's
// FsUser). An offline pod keeps its token past the expiry the API server
// gave (kubelet would drop it): whoever checks the token decides.
package volume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/store"
	corev1 "k8s.io/api/core/v1"
)

// The kinds of volume, as Volume.Kind and the directory names spell them.
const (
	KindEmptyDir    = "emptyDir"
	KindHostPath    = "hostPath"
	KindConfigMap   = "configMap"
	KindSecret      = "secret"
	KindDownwardAPI = "downwardAPI"
	KindProjected   = "projected"
)

// Config is what the volume manager needs from the configuration.
type Config struct {
	// PodsDir holds a directory per pod: PodsDir/<podUID>/volumes/<kind>/<volumeName>.
	PodsDir string
}

// Deps are the volume manager's collaborators.
type Deps struct {
	Store *store.Store
	Clock clock.Clock
	Log   *slog.Logger
	// Tokens requests service account tokens for pods from the API
	// server; nil when the agent is not connected to one.
	Tokens TokenFunc
}

// PodInfo is what Setup needs to know about a pod beyond its spec, for
// downwardAPI items and memory-backed emptyDir sizes.
type PodInfo struct {
	// PodIP and HostIP answer status.podIP(s) and status.hostIP(s); when
	// empty, the pod's status does.
	PodIP, HostIP string
	// NodeAllocatable answers resourceFieldRef limits no container sets,
	// and bounds the size of a memory-backed emptyDir, as in kubelet.
	NodeAllocatable corev1.ResourceList
}

// Volume is a volume prepared on the node.
type Volume struct {
	// Path is the volume's directory (or file, for a hostPath) on the host.
	Path string
	// ReadOnly is set for volumes containers may only read: configMap,
	// secret, downwardAPI and projected.
	ReadOnly bool
	// Kind is one of the Kind constants.
	Kind string
}

// MissingError reports a configMap or secret (or a key in one) that a
// volume refers to, that does not exist and is not optional; the caller
// shows the container as waiting with reason CreateContainerConfigError.
type MissingError struct {
	Pod    string // namespace/name
	Volume string
	Kind   string // KindConfigMap or KindSecret
	Name   string // of the configMap or secret
	Key    string // the missing key; empty when the object is missing
}

func (e *MissingError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("pod %s: volume %q: %s %q not found", e.Pod, e.Volume, e.Kind, e.Name)
	}
	return fmt.Sprintf("pod %s: volume %q: %s %q: key %q not found", e.Pod, e.Volume, e.Kind, e.Name, e.Key)
}

// Manager sets up and tears down pod volumes. Its methods are safe for
// concurrent use; calls for the same pod are serialized.
type Manager struct {
	cfg  Config
	deps Deps

	mu   sync.Mutex
	pods map[string]*podLock

	tokMu  sync.Mutex
	tokens map[tokenKey]*podToken
}

type podLock struct {
	mu   sync.Mutex
	refs int
}

// New checks cfg and returns a manager; it starts nothing and touches no
// file.
func New(cfg Config, deps Deps) (*Manager, error) {
	if cfg.PodsDir == "" || !filepath.IsAbs(cfg.PodsDir) {
		return nil, fmt.Errorf("volume manager: podsDir %q must be an absolute path", cfg.PodsDir)
	}
	if deps.Store == nil {
		return nil, errors.New("volume manager: no store")
	}
	if deps.Clock == nil {
		return nil, errors.New("volume manager: no clock")
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	cfg.PodsDir = filepath.Clean(cfg.PodsDir)
	return &Manager{cfg: cfg, deps: deps, pods: map[string]*podLock{}, tokens: map[tokenKey]*podToken{}}, nil
}

// lock serializes work on one pod and returns the unlock func.
func (m *Manager) lock(uid string) func() {
	m.mu.Lock()
	l := m.pods[uid]
	if l == nil {
		l = &podLock{}
		m.pods[uid] = l
	}
	l.refs++
	m.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		m.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(m.pods, uid)
		}
		m.mu.Unlock()
	}
}

// podDir returns PodsDir/<uid>, refusing a uid that is not one plain path
// element (UIDs from MQTT or manifests are not validated by an API server).
func (m *Manager) podDir(uid string) (string, error) {
	if err := checkElem(uid); err != nil {
		return "", fmt.Errorf("pod uid %q: %w", uid, err)
	}
	return filepath.Join(m.cfg.PodsDir, uid), nil
}

// checkElem reports an error unless name is a single, plain path element.
func checkElem(name string) error {
	switch {
	case name == "":
		return errors.New("must not be empty")
	case name == "." || name == "..":
		return errors.New("must not be . or ..")
	case strings.ContainsAny(name, "/\x00"):
		return errors.New("must not contain / or NUL")
	}
	return nil
}

func podName(pod *corev1.Pod) string { return pod.Namespace + "/" + pod.Name }

// volErr returns an error naming the pod and volume.
func volErr(pod *corev1.Pod, vol string, format string, args ...any) error {
	return fmt.Errorf("pod %s: volume %q: "+format, append([]any{podName(pod), vol}, args...)...)
}

// Setup prepares every volume of the pod and returns them by name. It is
// safe to call again: directories and mounts that exist are kept, and
// content volumes are refreshed from the store (rewritten only when their
// content changed) and service account tokens refreshed when due. A
// volume that cannot be set up is left out of the map and reported in the
// error, which wraps a *MissingError when a configMap or secret is
// missing; the other volumes are still set up.
func (m *Manager) Setup(ctx context.Context, pod *corev1.Pod, info PodInfo) (map[string]Volume, error) {
	dir, err := m.podDir(string(pod.UID))
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w", podName(pod), err)
	}
	unlock := m.lock(string(pod.UID))
	defer unlock()

	vols := make(map[string]Volume, len(pod.Spec.Volumes))
	var errs []error
	seen := make(map[string]bool, len(pod.Spec.Volumes))
	for i := range pod.Spec.Volumes {
		if err := ctx.Err(); err != nil {
			return vols, fmt.Errorf("pod %s: set up volumes: %w", podName(pod), err)
		}
		v := &pod.Spec.Volumes[i]
		if err := checkElem(v.Name); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: volumes[%d]: name %q: %w", podName(pod), i, v.Name, err))
			continue
		}
		if seen[v.Name] {
			errs = append(errs, volErr(pod, v.Name, "duplicate volume name"))
			continue
		}
		seen[v.Name] = true
		vol, err := m.setupVolume(ctx, dir, pod, v, info)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		vols[v.Name] = vol
	}
	if len(errs) == 1 {
		return vols, errs[0]
	}
	return vols, errors.Join(errs...)
}

func (m *Manager) setupVolume(ctx context.Context, podDir string, pod *corev1.Pod, v *corev1.Volume, info PodInfo) (Volume, error) {
	kindDir := func(kind string) (string, error) {
		d := filepath.Join(podDir, "volumes", kind)
		if err := os.MkdirAll(d, 0o750); err != nil {
			return "", volErr(pod, v.Name, "%w", err)
		}
		return filepath.Join(d, v.Name), nil
	}
	gid := fsGroup(pod)
	switch {
	case v.HostPath != nil:
		return setupHostPath(pod, v)
	case v.EmptyDir != nil:
		dir, err := kindDir(KindEmptyDir)
		if err != nil {
			return Volume{}, err
		}
		return m.setupEmptyDir(dir, pod, v, info, gid)
	case v.ConfigMap != nil, v.Secret != nil, v.DownwardAPI != nil, v.Projected != nil:
		kind, tmpfs := KindConfigMap, false
		switch {
		case v.Secret != nil:
			kind, tmpfs = KindSecret, true
		case v.DownwardAPI != nil:
			kind = KindDownwardAPI
		case v.Projected != nil:
			kind, tmpfs = KindProjected, true
		}
		files, err := m.payload(ctx, podDir, pod, v, info)
		if err != nil {
			return Volume{}, err
		}
		dir, err := kindDir(kind)
		if err != nil {
			return Volume{}, err
		}
		if err := m.writeContent(dir, pod, v.Name, kind, files, tmpfs, gid); err != nil {
			return Volume{}, err
		}
		return Volume{Path: dir, ReadOnly: true, Kind: kind}, nil
	}
	name := sourceName(&v.VolumeSource)
	if name == "" {
		return Volume{}, volErr(pod, v.Name, "no volume source is set")
	}
	return Volume{}, volErr(pod, v.Name, "%s volumes are not supported", name)
}

// sourceName returns the JSON name of the volume source that is set, ""
// for none.
func sourceName(vs *corev1.VolumeSource) string {
	rv := reflect.ValueOf(vs).Elem()
	for i := range rv.NumField() {
		if f := rv.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			name, _, _ := strings.Cut(rv.Type().Field(i).Tag.Get("json"), ",")
			return name
		}
	}
	return ""
}

func fsGroup(pod *corev1.Pod) int {
	if sc := pod.Spec.SecurityContext; sc != nil && sc.FSGroup != nil && *sc.FSGroup >= 0 {
		return int(*sc.FSGroup)
	}
	return -1
}

// Teardown unmounts the pod's tmpfs volumes (and anything else mounted
// below its directory) and removes PodsDir/<podUID>. It is idempotent: a
// pod without a directory is done. It removes nothing while a mount below
// the directory remains.
func (m *Manager) Teardown(podUID string) error {
	dir, err := m.podDir(podUID)
	if err != nil {
		return fmt.Errorf("tear down volumes: %w", err)
	}
	unlock := m.lock(podUID)
	defer unlock()

	real, err := filepath.EvalSymlinks(dir)
	if errors.Is(err, os.ErrNotExist) {
		m.forgetTokens(podUID)
		return nil
	}
	if err != nil {
		return fmt.Errorf("tear down pod uid %s: %w", podUID, err)
	}
	if err := unmountBelow(real); err != nil {
		return fmt.Errorf("tear down pod uid %s: %w", podUID, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("tear down pod uid %s: %w", podUID, err)
	}
	m.forgetTokens(podUID)
	m.deps.Log.Debug("pod volumes removed", "uid", podUID)
	return nil
}
