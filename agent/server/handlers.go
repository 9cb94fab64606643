package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"

	"github.com/outpost-edge/outpost/agent/crilog"
	"github.com/outpost-edge/outpost/internal/promtext"
)

func (s *Server) routes() {
	m := http.NewServeMux()
	for _, r := range s.endpoints() {
		m.HandleFunc(r.pattern, r.h)
	}
	s.mux = m
}

// endpoint is one endpoint of the kubelet API: its pattern (method and
// path, as http.ServeMux reads them) and handler.
type endpoint struct {
	pattern string
	h       http.HandlerFunc
}

// endpoints are what the kubelet API serves.
func (s *Server) endpoints() []endpoint {
	var es []endpoint
	add := func(h http.HandlerFunc, methods string, paths ...string) {
		for _, p := range paths {
			for _, m := range strings.Fields(methods) {
				es = append(es, endpoint{m + " " + p, h})
			}
		}
	}
	add(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }, "GET", "/healthz")
	add(s.pods, "GET", "/pods", "/pods/")
	add(s.containerLogs, "GET", "/containerLogs/{ns}/{pod}/{container}")
	add(s.exec, "GET POST", "/exec/{ns}/{pod}/{container}", "/exec/{ns}/{pod}/{uid}/{container}")
	add(s.attach, "GET POST", "/attach/{ns}/{pod}/{container}", "/attach/{ns}/{pod}/{uid}/{container}")
	add(s.portForward, "GET POST", "/portForward/{ns}/{pod}", "/portForward/{ns}/{pod}/{uid}")
	add(s.run, "POST", "/run/{ns}/{pod}/{container}", "/run/{ns}/{pod}/{uid}/{container}")
	add(s.metrics, "GET", "/metrics")
	add(s.resource, "GET", "/metrics/resource")
	add(s.summary, "GET", "/stats/summary", "/stats/summary/")
	return es
}

// Endpoints are the patterns (method and path, as http.ServeMux reads
// them) of every endpoint the kubelet API serves: what a test of who
// gets in must cover.
func Endpoints() []string {
	var out []string
	for _, e := range (&Server{}).endpoints() {
		out = append(out, e.pattern)
	}
	return out
}

// pods answers /pods: a PodList of the node's pods with their status.
func (s *Server) pods(w http.ResponseWriter, r *http.Request) {
	list := corev1.PodList{}
	list.Kind, list.APIVersion = "PodList", "v1"
	for _, p := range s.deps.Node.Pods() {
		p.Kind, p.APIVersion = "Pod", "v1"
		list.Items = append(list.Items, *p)
	}
	writeJSON(w, list)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// httpError is an error answered with its status code.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func errorf(code int, format string, args ...any) error {
	return &httpError{code, fmt.Sprintf(format, args...)}
}

func writeError(w http.ResponseWriter, err error) {
	var he *httpError
	if errors.As(err, &he) {
		http.Error(w, he.msg, he.code)
		return
	}
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

// findPod returns the pod ns/name the node runs, checking uid when the
// path gives one, and when container is not "" that it has it.
func (s *Server) findPod(r *http.Request, container string) (*corev1.Pod, error) {
	ns, name, uid := r.PathValue("ns"), r.PathValue("pod"), r.PathValue("uid")
	for _, p := range s.deps.Node.Pods() {
		if p.Namespace != ns || p.Name != name {
			continue
		}
		if uid != "" && string(p.UID) != uid {
			return nil, errorf(http.StatusNotFound, "pod %s/%s: uid %s is not the running pod's", ns, name, uid)
		}
		if container != "" && !hasContainer(p, container) {
			return nil, errorf(http.StatusNotFound, "container %q is not in pod %s/%s", container, ns, name)
		}
		return p, nil
	}
	return nil, errorf(http.StatusNotFound, "pod %s/%s is not on this node", ns, name)
}

func hasContainer(p *corev1.Pod, name string) bool {
	for _, c := range p.Spec.InitContainers {
		if c.Name == name {
			return true
		}
	}
	for _, c := range p.Spec.Containers {
		if c.Name == name {
			return true
		}
	}
	for _, c := range p.Spec.EphemeralContainers {
		if c.Name == name {
			return true
		}
	}
	return false
}

// logOptions parses containerLogs' query as kubelet reads PodLogOptions.
func logOptions(q map[string][]string, now time.Time) (opts crilog.ReadOptions, previous bool, err error) {
	get := func(k string) (string, bool) {
		v, ok := q[k]
		if !ok || len(v) == 0 {
			return "", false
		}
		return v[0], true
	}
	boolean := func(k string) (bool, error) {
		v, ok := get(k)
		if !ok || v == "" {
			return ok && v == "", nil
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, errorf(http.StatusBadRequest, "%s: %q is not true or false", k, v)
		}
		return b, nil
	}
	integer := func(k string, min int64) (int64, bool, error) {
		v, ok := get(k)
		if !ok {
			return 0, false, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, false, errorf(http.StatusBadRequest, "%s: %q is not an integer", k, v)
		}
		if n < min {
			return 0, false, errorf(http.StatusBadRequest, "%s: %d is less than %d", k, n, min)
		}
		return n, true, nil
	}
	opts.TailLines = -1
	if opts.Follow, err = boolean("follow"); err != nil {
		return
	}
	if previous, err = boolean("previous"); err != nil {
		return
	}
	if opts.Timestamps, err = boolean("timestamps"); err != nil {
		return
	}
	if n, ok, e := integer("tailLines", 0); e != nil {
		return opts, false, e
	} else if ok {
		opts.TailLines = n
	}
	if n, ok, e := integer("limitBytes", 1); e != nil {
		return opts, false, e
	} else if ok {
		opts.LimitBytes = n
	}
	secs, hasSecs, e := integer("sinceSeconds", 1)
	if e != nil {
		return opts, false, e
	}
	if hasSecs {
		opts.Since = now.Add(-time.Duration(secs) * time.Second)
	}
	if v, ok := get("sinceTime"); ok {
		if hasSecs {
			return opts, false, errorf(http.StatusBadRequest, "sinceTime: only one of sinceSeconds and sinceTime may be given")
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return opts, false, errorf(http.StatusBadRequest, "sinceTime: %q is not an RFC 3339 time", v)
		}
		opts.Since = t
	}
	return opts, previous, nil
}

// containerLogs answers /containerLogs/{ns}/{pod}/{container} from the
// container's CRI log files, across rotation, as kubectl logs asks.
func (s *Server) containerLogs(w http.ResponseWriter, r *http.Request) {
	container := r.PathValue("container")
	pod, err := s.findPod(r, container)
	if err != nil {
		writeError(w, err)
		return
	}
	opts, previous, err := logOptions(r.URL.Query(), s.deps.Clock.Now())
	if err != nil {
		writeError(w, err)
		return
	}
	path, err := s.logPath(pod, container, previous)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx := r.Context()
	if opts.Follow {
		if previous {
			opts.Follow = false
		} else {
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(ctx)
			defer cancel()
			go s.untilStopped(ctx, cancel, pod, container)
		}
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Cache-Control", "no-cache")
	f, _ := w.(http.Flusher)
	if opts.Follow {
		if err := crilog.Read(ctx, path, opts, s.deps.Clock, &flushWriter{w: w, f: f}); err != nil && ctx.Err() == nil {
			s.deps.Log.Debug("kubelet api: read log", "path", path, "err", err)
		}
		return
	}
	cw := &countWriter{w: w}
	bw := bufio.NewWriterSize(cw, 32<<10)
	if err := crilog.Read(ctx, path, opts, s.deps.Clock, bw); err != nil && ctx.Err() == nil {
		s.deps.Log.Debug("kubelet api: read log", "path", path, "err", err)
	}
	if bw.Flush() != nil || f == nil || cw.n == 0 {
		return
	}
	// The API server's websocket log stream (kubectl logs over
	// websockets) drops the data of a read that also reports the end of
	// the body: a response with a Content-Length, or whose last chunk and
	// end arrive together, reaches such a client empty. So the log goes
	// chunked, and its end a moment after its last byte, as kubelet's
	// happens to.
	f.Flush()
	t := s.deps.Clock.NewTimer(logEndPause)
	defer t.Stop()
	select {
	case <-t.C():
	case <-ctx.Done():
	}
}

// logEndPause is how long a finished log response waits after its last
// byte before it ends (see containerLogs).
const logEndPause = 10 * time.Millisecond

// countWriter counts the bytes written through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// untilStopped cancels a followed log once its container no longer runs
// as the attempt it was, a moment later, so its last lines are read.
func (s *Server) untilStopped(ctx context.Context, cancel context.CancelFunc, pod *corev1.Pod, container string) {
	id := containerID(pod, container)
	tick := s.deps.Clock.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
		running := false
		for _, p := range s.deps.Node.Pods() {
			if p.UID == pod.UID {
				running = containerID(p, container) == id && id != ""
			}
		}
		if !running {
			t := s.deps.Clock.NewTimer(time.Second)
			select {
			case <-ctx.Done():
			case <-t.C():
			}
			t.Stop()
			cancel()
			return
		}
	}
}

// containerID is the ID of the running container name of p, "" when it
// is not running.
func containerID(p *corev1.Pod, name string) string {
	for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses, p.Status.EphemeralContainerStatuses} {
		for _, cs := range list {
			if cs.Name == name && cs.State.Running != nil {
				return cs.ContainerID
			}
		}
	}
	return ""
}

type flushWriter struct {
	w io.Writer
	f http.Flusher
}

func (f *flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if f.f != nil {
		f.f.Flush()
	}
	return n, err
}

// logPath is the log file of the container's newest attempt, or of the
// one before with previous: <logDir>/<ns>_<pod>_<uid>/<container>/<n>.log.
func (s *Server) logPath(pod *corev1.Pod, container string, previous bool) (string, error) {
	dir := filepath.Join(s.cfg.LogDir, pod.Namespace+"_"+pod.Name+"_"+string(pod.UID), container)
	attempts := crilog.Attempts(dir)
	i := 0
	if previous {
		i = 1
	}
	if len(attempts) <= i {
		if previous {
			return "", errorf(http.StatusBadRequest, "previous terminated container %q in pod %s/%s not found", container, pod.Namespace, pod.Name)
		}
		return "", errorf(http.StatusBadRequest, "container %q in pod %s/%s has no log yet", container, pod.Namespace, pod.Name)
	}
	return filepath.Join(dir, strconv.Itoa(attempts[i])+".log"), nil
}

// exec answers /exec with the streaming protocols kubelet speaks (SPDY
// and WebSocket), through Kubernetes' own streaming server code.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	container := r.PathValue("container")
	pod, err := s.findPod(r, container)
	if err != nil {
		writeError(w, err)
		return
	}
	cmd := r.URL.Query()["command"]
	if len(cmd) == 0 {
		http.Error(w, "command: missing: give the command to run", http.StatusBadRequest)
		return
	}
	opts, err := remotecommand.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if msg := badWebSocketProtocol(r); msg != "" {
		http.Error(w, msg, http.StatusForbidden)
		return
	}
	streamed(w, func(w http.ResponseWriter) {
		remotecommand.ServeExec(w, r, &streamer{s: s, pod: pod}, pod.Namespace+"/"+pod.Name, string(pod.UID), container, cmd,
			opts, s.cfg.StreamIdleTimeout, s.cfg.StreamCreationTimeout, remotecommand.SupportedStreamingProtocols)
	})
}

// attach answers /attach.
func (s *Server) attach(w http.ResponseWriter, r *http.Request) {
	container := r.PathValue("container")
	pod, err := s.findPod(r, container)
	if err != nil {
		writeError(w, err)
		return
	}
	opts, err := remotecommand.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if msg := badWebSocketProtocol(r); msg != "" {
		http.Error(w, msg, http.StatusForbidden)
		return
	}
	streamed(w, func(w http.ResponseWriter) {
		remotecommand.ServeAttach(w, r, &streamer{s: s, pod: pod}, pod.Namespace+"/"+pod.Name, string(pod.UID), container,
			opts, s.cfg.StreamIdleTimeout, s.cfg.StreamCreationTimeout, remotecommand.SupportedStreamingProtocols)
	})
}

// portForward answers /portForward.
func (s *Server) portForward(w http.ResponseWriter, r *http.Request) {
	pod, err := s.findPod(r, "")
	if err != nil {
		writeError(w, err)
		return
	}
	opts, err := portforward.NewV4Options(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	streamed(w, func(w http.ResponseWriter) {
		portforward.ServePortForward(w, r, &streamer{s: s, pod: pod}, pod.Namespace+"/"+pod.Name, string(pod.UID),
			opts, s.cfg.StreamIdleTimeout, s.cfg.StreamCreationTimeout, portforward.SupportedProtocols)
	})
}

// run answers /run: the command in cmd (split at spaces, as kubelet
// does) run in the container, its output the answer.
func (s *Server) run(w http.ResponseWriter, r *http.Request) {
	container := r.PathValue("container")
	pod, err := s.findPod(r, container)
	if err != nil {
		writeError(w, err)
		return
	}
	cmd := strings.Fields(r.URL.Query().Get("cmd"))
	if len(cmd) == 0 {
		http.Error(w, "cmd: missing: give the command to run", http.StatusBadRequest)
		return
	}
	out := &capped{max: 1 << 20}
	code, err := s.deps.Node.Exec(r.Context(), string(pod.UID), container, cmd, Streams{Stdout: out, Stderr: out})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if code != 0 {
		w.Header().Set("X-Exit-Code", strconv.Itoa(code))
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Write(out.b)
}

// capped keeps at most max bytes.
type capped struct {
	b   []byte
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - len(c.b); room > 0 {
		c.b = append(c.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (c *capped) Close() error { return nil }

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", promtext.ContentType)
	p := promtext.New(w)
	if s.deps.Metrics != nil {
		s.deps.Metrics(p)
	}
	p.Flush()
}

func (s *Server) resource(w http.ResponseWriter, r *http.Request) {
	if s.deps.Resources == nil {
		http.Error(w, "resource metrics are not available on this node", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", promtext.ContentType)
	if err := s.deps.Resources.WriteResource(w, s.deps.Node.Pods()); err != nil {
		s.deps.Log.Warn("kubelet api: resource metrics", "err", err)
	}
}

func (s *Server) summary(w http.ResponseWriter, r *http.Request) {
	if s.deps.Resources == nil {
		http.Error(w, "stats are not available on this node", http.StatusNotFound)
		return
	}
	sum, err := s.deps.Resources.Summary(s.deps.Node.Pods())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSON(w, sum)
}
