package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
)

// streamer adapts Node to the streaming server's Executor, Attacher and
// PortForwarder for one pod.
type streamer struct {
	s   *Server
	pod *corev1.Pod
}

// ExecInContainer implements remotecommand.Executor.
func (st *streamer) ExecInContainer(ctx context.Context, _, _, container string, cmd []string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize, _ time.Duration) error {
	code, err := st.s.deps.Node.Exec(ctx, string(st.pod.UID), container, cmd, streams(ctx, in, out, errOut, tty, resize))
	if err != nil {
		return err
	}
	if code != 0 {
		return exitError(code)
	}
	return nil
}

// AttachContainer implements remotecommand.Attacher.
func (st *streamer) AttachContainer(ctx context.Context, _, _, container string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize) error {
	return st.s.deps.Node.Attach(ctx, string(st.pod.UID), container, streams(ctx, in, out, errOut, tty, resize))
}

// PortForward implements portforward.PortForwarder.
func (st *streamer) PortForward(ctx context.Context, _, _ string, port int32, stream io.ReadWriteCloser) error {
	if port <= 0 || port > 65535 {
		return fmt.Errorf("port %d: not a port number", port)
	}
	return st.s.deps.Node.PortForward(ctx, string(st.pod.UID), port, stream)
}

// streams converts the streaming server's ends to Streams; the resize
// channel is relayed until ctx ends.
func streams(ctx context.Context, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize) Streams {
	s := Streams{Stdin: in, Stdout: out, Stderr: errOut, TTY: tty}
	if tty && resize != nil {
		sizes := make(chan TermSize, 1)
		go func() {
			for {
				select {
				case sz, ok := <-resize:
					if !ok {
						return
					}
					select {
					case sizes <- TermSize{Width: sz.Width, Height: sz.Height}:
					case <-ctx.Done():
						return
					}
				case <-ctx.Done():
					return
				}
			}
		}()
		s.Resize = sizes
	}
	return s
}

// exitError is a command's non-zero exit, in the shape the streaming
// server reports as NonZeroExitCode (k8s.io/utils/exec.ExitError).
type exitError int

func (e exitError) Error() string   { return fmt.Sprintf("command terminated with exit code %d", int(e)) }
func (e exitError) String() string  { return e.Error() }
func (e exitError) Exited() bool    { return true }
func (e exitError) ExitStatus() int { return int(e) }

// streamed runs serve, a streaming handler, and closes the connection it
// took over (hijacked) when it returns. The streaming code leaves the
// connection of a client that upgraded but never opened its streams
// open, until the stream idle timeout (hours): an upgrade and silence
// would hold a descriptor and goroutines that long.
func streamed(w http.ResponseWriter, serve func(http.ResponseWriter)) {
	h := &hijackTracker{ResponseWriter: w}
	defer h.close()
	serve(h)
}

// hijackTracker remembers the connection taken over through it.
type hijackTracker struct {
	http.ResponseWriter
	conn net.Conn
}

// Hijack implements http.Hijacker.
func (h *hijackTracker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := h.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("kubelet api: this connection cannot be taken over for a stream")
	}
	c, rw, err := hj.Hijack()
	h.conn = c
	return c, rw, err
}

// Flush implements http.Flusher.
func (h *hijackTracker) Flush() {
	if f, ok := h.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (h *hijackTracker) close() {
	if h.conn != nil {
		h.conn.Close()
	}
}

// wsProtocols are the WebSocket subprotocols exec and attach speak
// (k8s.io/cri-streaming's; "" is a client that asks for none).
var wsProtocols = []string{"", "channel.k8s.io", "base64.channel.k8s.io", "v4.channel.k8s.io", "v4.base64.channel.k8s.io"}

// badWebSocketProtocol says what is wrong with a WebSocket request that
// asks only for subprotocols exec and attach do not speak, which the
// streaming code answers with a bare 403; "" for any other request.
func badWebSocketProtocol(r *http.Request) string {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return ""
	}
	var asked []string
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if p = strings.TrimSpace(p); p != "" {
				asked = append(asked, p)
			}
		}
	}
	if len(asked) == 0 || slices.ContainsFunc(asked, func(p string) bool { return slices.Contains(wsProtocols, p) }) {
		return ""
	}
	return fmt.Sprintf("Sec-WebSocket-Protocol: %s: not supported; the server speaks %s",
		strings.Join(asked, ", "), strings.Join(wsProtocols[1:], ", "))
}
