// Package agent runs the node's pods from the store: it records the
// static manifests into the store, runs one worker per pod on the
// Runtime (containerd) with its network, volumes and probes, journals
// their status, and answers status queries on a local unix socket
// (docs/architecture.md draws the flow).
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/outpost-edge/outpost/agent/staticpods"
	"github.com/outpost-edge/outpost/arm"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/report"
	"github.com/outpost-edge/outpost/store"
	corev1 "k8s.io/api/core/v1"
)

// Config is what the agent needs from the configuration file.
type Config struct {
	NodeName    string
	ManifestDir string
	// SocketPath is the local status socket; empty serves none.
	SocketPath string
	// ManifestInterval is how often the manifest directory is looked at
	// while it cannot be watched through inotify (default 1s).
	ManifestInterval time.Duration
	// Version is reported in status.
	Version string
	// Board is what the board said about itself at start.
	Board arm.Facts
	// Pods configures running pods; used when Deps.Pods.Runtime is set.
	Pods PodConfig
}

// Deps are the agent's collaborators.
type Deps struct {
	Store *store.Store
	Clock clock.Clock
	Log   *slog.Logger
	// Pods runs the pods; with no Runtime the agent only records them.
	Pods PodDeps
	// BoardHealth reads the board's sensors for status; nil shows what
	// Config.Board had at start.
	BoardHealth func() arm.Readings
	// Link reports the API server or MQTT broker connection for status;
	// nil when the agent runs standalone.
	Link func() report.Link
	// Proxy reports the service proxy's syncs for status; nil when there
	// is none.
	Proxy func() report.Proxy
}

// Agent owns the node's desired-state loop.
type Agent struct {
	cfg     Config
	deps    Deps
	started time.Time

	pods      *podManager
	manifests staticpods.Reader

	ready     chan struct{} // closed once Run serves and has read the manifests
	heartbeat atomic.Int64  // unix nanoseconds of the main loop's last turn

	mu             sync.Mutex
	manifestErrors []string
	lastSync       time.Time
	manifestPrint  string

	storeWrites StoreWrites // under mu; kept by watchStore
	// statfs, if set before Run (tests), replaces statfs(2) for
	// watchStore.
	statfs func(path string) (FSStats, error)

	watchErr string // why the manifest dir is not watched; owned by Run
	// manifestEvent, if set before Run (tests), is told of every event
	// the manifest watch reads: the name, and whether it woke the loop.
	manifestEvent func(name string, woke bool)
}

// New checks cfg and returns an agent; it starts nothing.
func New(cfg Config, deps Deps) (*Agent, error) {
	if deps.Store == nil || deps.Clock == nil || deps.Log == nil {
		return nil, errors.New("agent: store, clock and logger are required")
	}
	if cfg.NodeName == "" {
		return nil, errors.New("agent: node name is required")
	}
	if cfg.ManifestInterval == 0 {
		cfg.ManifestInterval = time.Second
	}
	a := &Agent{cfg: cfg, deps: deps, ready: make(chan struct{}), storeWrites: StoreWrites{Writable: true}}
	if deps.Pods.Runtime != nil {
		cfg.Pods.NodeName = cfg.NodeName
		a.pods = newPodManager(cfg.Pods, deps.Pods, deps.Store, deps.Clock, deps.Log)
	}
	return a, nil
}

// Run records the manifests, then keeps them in sync and serves status
// until ctx ends. It returns after every goroutine it started has exited.
func (a *Agent) Run(ctx context.Context) error {
	a.started = a.deps.Clock.Now()
	a.mu.Lock()
	a.storeWrites.Since = a.started
	a.mu.Unlock()
	var srv *http.Server
	if a.cfg.SocketPath != "" {
		ln, err := listenUnix(a.cfg.SocketPath)
		if err != nil {
			return err
		}
		srv = &http.Server{Handler: a.handler(), ReadHeaderTimeout: 5 * time.Second}
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(ln) }()
		defer func() {
			shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			srv.Shutdown(shutdownCtx)
			<-errc
			os.Remove(a.cfg.SocketPath)
		}()
	}
	a.deps.Log.Info("agent started", "node", a.cfg.NodeName, "manifestDir", a.cfg.ManifestDir, "store", a.deps.Store.Path())
	// The manifest directory is watched through inotify: a change is read
	// once its burst of events has settled, and every fullResync the
	// files are read anyway. While it cannot be watched (it does not
	// exist yet, or inotify is out of watches) it is looked at every
	// ManifestInterval.
	var watch *manifestWatch
	defer func() {
		if watch != nil {
			watch.Close()
		}
	}()
	watch = a.watchManifests()
	timer := a.deps.Clock.NewTimer(a.manifestWait(watch))
	defer timer.Stop()
	// A write the disk refuses, or one it takes again, is looked at at
	// once; while writes fail the loop also turns every storeCheckEvery.
	storeChanged, cancelStore := a.deps.Store.Subscribe(store.KindWrite)
	defer cancelStore()
	a.checkStore(false)
	if err := a.syncManifests(false); err != nil {
		a.logSyncError(err)
	}
	a.beat()
	close(a.ready)
	if a.pods != nil {
		podsCtx, stopPods := context.WithCancel(ctx)
		podsDone := make(chan struct{})
		go func() { a.pods.run(podsCtx); close(podsDone) }()
		defer func() { stopPods(); <-podsDone }()
	}
	for {
		var changed, ended <-chan struct{}
		if watch != nil {
			changed, ended = watch.changed, watch.done
		}
		force := false
		select {
		case <-ctx.Done():
			a.deps.Log.Info("agent stopping")
			return nil
		case <-timer.C():
			// Watched, this is the full resync: it also finds edits that
			// raise no event here (the target of a symlinked manifest).
			force = watch != nil
		case <-changed:
			if !a.settle(ctx) {
				continue
			}
			select {
			case <-changed:
			default:
			}
			force = true
		case <-ended:
			// The directory was removed or renamed: poll until it is back.
			watch.Close()
			watch = nil
			force = true
		case <-storeChanged:
			// When writes work again, what could not be written is.
			if !a.checkStore(false) {
				timer.Reset(a.manifestWait(watch)) // sooner while writes fail
				continue
			}
			force = true
		}
		if a.checkStore(true) {
			force = true
		}
		if watch == nil {
			if watch = a.watchManifests(); watch != nil {
				force = true // what changed before the watch began
			}
		}
		if err := a.syncManifests(force); err != nil {
			a.logSyncError(err)
		}
		a.beat()
		timer.Reset(a.manifestWait(watch))
	}
}

// logSyncError logs a failed manifest sync: at Debug when the store
// refused the write, which watchStore reports once per change instead of
// once per retry.
func (a *Agent) logSyncError(err error) {
	if store.IsWriteFailure(err) {
		a.deps.Log.Debug("sync manifests", "err", err)
		return
	}
	a.deps.Log.Error("sync manifests", "err", err)
}

// manifestSettle is how long the agent lets a burst of inotify events
// (an editor's save: write, close, rename) settle before reading.
const manifestSettle = 100 * time.Millisecond

// settle waits manifestSettle; it returns false when ctx ends first.
func (a *Agent) settle(ctx context.Context) bool {
	t := a.deps.Clock.NewTimer(manifestSettle)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// manifestWait is how long the main loop waits for a change before it
// looks at the manifests again (and at the store's writes:
// storeCheckEvery at most while they fail).
func (a *Agent) manifestWait(w *manifestWatch) time.Duration {
	wait := a.cfg.ManifestInterval
	if w != nil {
		wait = fullResync
	}
	if !a.storeWritable() {
		wait = min(wait, storeCheckEvery)
	}
	return wait
}

// watchManifests starts watching the manifest directory, or returns nil
// when it cannot, logging why when that changes.
func (a *Agent) watchManifests() *manifestWatch {
	w, err := watchManifests(a.cfg.ManifestDir, a.manifestEvent)
	why := ""
	if err != nil {
		why = err.Error()
	}
	if why != a.watchErr {
		if err != nil {
			a.deps.Log.Info("manifest dir not watched; looking at it every interval", "interval", a.cfg.ManifestInterval, "err", err)
		} else if a.watchErr != "" {
			a.deps.Log.Info("manifest dir watched again", "dir", a.cfg.ManifestDir)
		}
		a.watchErr = why
	}
	return w
}

// Ready is closed once Run serves its status socket and has read the
// manifests into the store: what a service manager is told as READY=1.
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// Heartbeat is when Run's main loop last went round (at least every
// 20 s); a watchdog pets only while it is recent, so a stuck
// loop gets the agent restarted.
func (a *Agent) Heartbeat() time.Time { return time.Unix(0, a.heartbeat.Load()) }

func (a *Agent) beat() { a.heartbeat.Store(a.deps.Clock.Now().UnixNano()) }

// WakePods makes every pod worker look at its pod now instead of at its
// next deadline, as after new images were imported: a pod waiting for an
// image that is now present (ErrImageNeverPull, ImagePullBackOff) starts
// at once. It does nothing when the agent runs no pods.
func (a *Agent) WakePods() {
	if a.pods != nil {
		a.pods.wakeAll()
	}
}

// listenUnix listens on path, replacing a stale socket. Only one agent can
// hold the store, so a socket file left behind is never in use.
func listenUnix(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("status socket %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("status socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("status socket %s: %w", path, err)
	}
	return ln, nil
}

// SyncManifests reads the manifest directory once and makes the store's
// static pods, services, config maps and secrets match it. A file that
// cannot be read or parsed keeps what the store already holds from it, so
// a typo never stops a running pod; a deleted file removes its objects.
// Config maps and secrets are recorded before pods, so a new pod finds
// the ones that came with it. A kind that fails does not stop the others.
//
// A pod whose metadata is good but whose spec is bad is recorded as
// invalid: it shows as Failed with reason InvalidPod and is never run,
// and the other pods of its file are recorded as usual. When the store
// holds a good version of that pod from the same file, that one is kept
// instead, as an API server keeps a pod whose update it rejects.
func (a *Agent) SyncManifests() error { return a.syncManifests(false) }

// syncManifests is SyncManifests; force reads the files even when the
// directory's fingerprint is unchanged, as after an inotify event.
func (a *Agent) syncManifests(force bool) error {
	// Without force, re-read only when the fingerprint changed (while
	// the directory is polled every second, that keeps an idle agent
	// cheap). An edit that keeps a file's size within one mtime tick
	// does not show in the fingerprint, so every fullResync the files
	// are read anyway.
	print := manifestFingerprint(a.cfg.ManifestDir)
	a.mu.Lock()
	unchanged := !force && print == a.manifestPrint && a.deps.Clock.Since(a.lastSync) < fullResync
	a.mu.Unlock()
	if unchanged {
		return nil
	}
	m, err := a.manifests.Read(a.cfg.ManifestDir, a.cfg.NodeName)
	if err != nil {
		return err
	}
	st := a.deps.Store
	var errs []error
	pods, kept, podsErr := keepGoodPods(st.Pods().List, m.Pods)
	if podsErr != nil {
		errs = append(errs, fmt.Errorf("read stored pods: %w", podsErr))
	}
	badFiles := map[string]bool{}
	var msgs []string
	for _, e := range m.Errors {
		badFiles[e.File] = true
		msgs = append(msgs, e.Error())
	}
	for _, e := range m.Invalid {
		if kept[store.Key(e.Pod.Namespace, e.Pod.Name)] {
			msgs = append(msgs, e.Error()+" [the last good version of the pod is kept]")
		} else {
			msgs = append(msgs, e.Error()+" [pod recorded as Failed, reason "+ReasonInvalidPod+"; not run]")
		}
	}
	a.noteManifestErrors(msgs)

	n, total, err := replaceStatic(st.ConfigMaps(), badFiles, m.ConfigMaps)
	errs = append(errs, err)
	if n > 0 {
		a.deps.Log.Info("static config maps recorded", "changed", n, "configMaps", total)
	}
	n, total, err = replaceStatic(st.Secrets(), badFiles, m.Secrets)
	errs = append(errs, err)
	if n > 0 {
		a.deps.Log.Info("static secrets recorded", "changed", n, "secrets", total)
	}
	if podsErr == nil {
		n, total, err = replaceStatic(st.Pods(), badFiles, pods)
		errs = append(errs, err)
		if n > 0 {
			a.deps.Log.Info("static pods recorded", "changed", n, "pods", total)
		}
	}
	n, total, err = replaceStatic(st.Services(), badFiles, m.Services)
	errs = append(errs, err)
	if n > 0 {
		a.deps.Log.Info("static services recorded", "changed", n, "services", total)
	}
	err = errors.Join(errs...)
	a.mu.Lock()
	a.lastSync = a.deps.Clock.Now()
	if err == nil {
		a.manifestPrint = print
	}
	a.mu.Unlock()
	return err
}

// replaceStatic makes fresh, plus what the store holds from badFiles, the
// static objects of one kind. It returns how many records changed and how
// many objects the source now has; when the stored objects cannot be
// listed it changes nothing, so a broken file's objects are not deleted.
func replaceStatic[T any, P interface {
	*T
	annotated
}](c store.Collection[T, P], badFiles map[string]bool, fresh []P) (changed, total int, err error) {
	if len(badFiles) > 0 {
		fresh, err = keepFromFiles(c.List, badFiles, fresh)
		if err != nil {
			return 0, 0, err
		}
	}
	changed, err = c.Replace(store.SourceStatic, fresh)
	return changed, len(fresh), err
}

// fullResync is how often the manifests are re-read even when their
// fingerprint is unchanged, as kubelet's file source resyncs every 20 s.
const fullResync = 20 * time.Second

// manifestFingerprint sums the names, sizes, modification times and
// inodes of the manifest files.
func manifestFingerprint(dir string) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "error: " + err.Error()
	}
	var b strings.Builder
	for _, e := range entries {
		if !staticpods.IsManifest(e.Name()) {
			continue
		}
		info, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil {
			fmt.Fprintf(&b, "%s:err;", e.Name())
			continue
		}
		var ino uint64
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			ino = st.Ino
		}
		fmt.Fprintf(&b, "%s:%d:%d:%d;", e.Name(), info.Size(), info.ModTime().UnixNano(), ino)
	}
	return b.String()
}

// noteManifestErrors logs manifest problems when they change, not on every
// re-read.
func (a *Agent) noteManifestErrors(msgs []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if slices.Equal(msgs, a.manifestErrors) {
		return
	}
	for _, m := range msgs {
		if !slices.Contains(a.manifestErrors, m) {
			a.deps.Log.Warn("bad manifest", "problem", m)
		}
	}
	a.manifestErrors = msgs
}

// keepGoodPods returns fresh with each invalid pod replaced by the good
// pod of the same namespace and name that the store holds from the same
// manifest file, if there is one, and the store keys of the pods so kept.
// The store is read only when there is an invalid pod.
func keepGoodPods(list func() ([]store.Record[*corev1.Pod], error), fresh []*corev1.Pod) ([]*corev1.Pod, map[string]bool, error) {
	out := slices.Clone(fresh)
	kept := map[string]bool{}
	var stored map[string]*corev1.Pod
	for i, p := range out {
		if _, invalid := staticpods.Invalid(p); !invalid {
			continue
		}
		if stored == nil {
			recs, err := list()
			if err != nil {
				return nil, nil, err
			}
			stored = map[string]*corev1.Pod{}
			for _, r := range recs {
				if r.Source == store.SourceStatic {
					stored[store.Key(r.Object.Namespace, r.Object.Name)] = r.Object
				}
			}
		}
		key := store.Key(p.Namespace, p.Name)
		old, ok := stored[key]
		if _, oldInvalid := staticpods.Invalid(old); ok && !oldInvalid && old.Annotations[staticpods.AnnotationFile] == p.Annotations[staticpods.AnnotationFile] {
			out[i] = old
			kept[key] = true
		}
	}
	return out, kept, nil
}

type annotated interface {
	store.Object
	GetAnnotations() map[string]string
}

// keepFromFiles adds to fresh the stored static objects that came from the
// given files.
func keepFromFiles[P annotated](list func() ([]store.Record[P], error), files map[string]bool, fresh []P) ([]P, error) {
	recs, err := list()
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if r.Source == store.SourceStatic && files[r.Object.GetAnnotations()[staticpods.AnnotationFile]] {
			fresh = append(fresh, r.Object)
		}
	}
	return fresh, nil
}

// podImages lists a pod's container images, init containers first.
func podImages(p *corev1.Pod) string {
	var out []string
	for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		out = append(out, c.Image)
	}
	return strings.Join(out, ",")
}
