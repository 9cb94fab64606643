package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent/server"
)

// StreamIO are the ends of an exec or attach session.
type StreamIO = server.Streams

// TermSize is a terminal's size.
type TermSize = server.TermSize

// Streamer is the part of a runtime that streams to a client: exec with
// the client's stdin, output and terminal, and attach to a running
// container. agent/containerd implements it.
type Streamer interface {
	ExecStream(ctx context.Context, id string, cmd []string, s StreamIO) (int, error)
	Attach(ctx context.Context, id string, s StreamIO) error
}

// ErrNotRunning is returned for a container that is not running.
var ErrNotRunning = errors.New("container is not running")

// Pods returns the pods the agent runs, each with its current status,
// sorted by namespace and name: /pods of the kubelet API.
func (a *Agent) Pods() []*corev1.Pod {
	views := a.PodViews()
	out := make([]*corev1.Pod, 0, len(views))
	for _, v := range views {
		p := v.Pod.DeepCopy()
		p.Status = v.Status
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// runningContainer returns the runtime ID of the running container name
// of the pod with this UID.
func (a *Agent) runningContainer(podUID, name string) (string, error) {
	v, ok := a.PodViews()[podUID]
	if !ok {
		return "", fmt.Errorf("pod %s: %w", podUID, ErrNotFound)
	}
	pod := v.Pod.Namespace + "/" + v.Pod.Name
	for _, list := range [][]corev1.ContainerStatus{v.Status.ContainerStatuses, v.Status.InitContainerStatuses, v.Status.EphemeralContainerStatuses} {
		for _, cs := range list {
			if cs.Name != name {
				continue
			}
			if cs.State.Running == nil {
				return "", fmt.Errorf("pod %s: container %s: %w", pod, name, ErrNotRunning)
			}
			_, id, _ := strings.Cut(cs.ContainerID, "://")
			return id, nil
		}
	}
	return "", fmt.Errorf("pod %s: container %s: %w", pod, name, ErrNotFound)
}

func (a *Agent) streamer() (Streamer, error) {
	if a.pods == nil {
		return nil, errors.New("the agent runs no pods")
	}
	s, ok := a.pods.rt.(Streamer)
	if !ok {
		return nil, errors.New("the runtime cannot stream")
	}
	return s, nil
}

// Exec runs cmd in the pod's running container with the client's
// streams and returns its exit code.
func (a *Agent) Exec(ctx context.Context, podUID, container string, cmd []string, s StreamIO) (int, error) {
	st, err := a.streamer()
	if err != nil {
		return 0, err
	}
	id, err := a.runningContainer(podUID, container)
	if err != nil {
		return 0, err
	}
	return st.ExecStream(ctx, id, cmd, s)
}

// Attach joins the pod's running container's stdin and output.
func (a *Agent) Attach(ctx context.Context, podUID, container string, s StreamIO) error {
	st, err := a.streamer()
	if err != nil {
		return err
	}
	id, err := a.runningContainer(podUID, container)
	if err != nil {
		return err
	}
	return st.Attach(ctx, id, s)
}

// PortForward connects to port on the pod's loopback address, inside
// its network namespace (the host's for a hostNetwork pod), and copies
// between that connection and stream until either side ends.
func (a *Agent) PortForward(ctx context.Context, podUID string, port int32, stream io.ReadWriteCloser) error {
	v, ok := a.PodViews()[podUID]
	if !ok {
		return fmt.Errorf("pod %s: %w", podUID, ErrNotFound)
	}
	if v.NetNS == "" && !v.Pod.Spec.HostNetwork && a.pods.net != nil {
		return fmt.Errorf("pod %s/%s: its network is not set up", v.Pod.Namespace, v.Pod.Name)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
	conn, err := dialInNetNS(ctx, v.NetNS, addr)
	if err != nil {
		return fmt.Errorf("pod %s/%s: port %d: %w", v.Pod.Namespace, v.Pod.Name, port, err)
	}
	defer conn.Close()
	errc := make(chan error, 2)
	go func() {
		_, err := io.Copy(conn, stream)
		if tc, ok := conn.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		errc <- err
	}()
	go func() {
		_, err := io.Copy(stream, conn)
		errc <- err
	}()
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	return err
}

// dialInNetNS dials addr over TCP from the network namespace at path; ""
// dials from the agent's own. The socket is made on a thread that has
// entered the namespace, and keeps it after the thread leaves.
func dialInNetNS(ctx context.Context, path, addr string) (net.Conn, error) {
	var d net.Dialer
	if path == "" {
		return d.DialContext(ctx, "tcp", addr)
	}
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		defer self.Close()
		target, err := os.Open(path)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("enter %s: %w", path, err)}
			return
		}
		c, err := d.DialContext(ctx, "tcp", addr)
		// A thread that cannot go back stays locked, so it exits with
		// this goroutine instead of serving others in the pod's network.
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- result{c, err}
	}()
	r := <-done
	return r.c, r.err
}
