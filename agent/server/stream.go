package server

import (
	"context"
	"fmt"
	"io"
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
