package prober

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Kind says which of a container's probes a worker runs.
type Kind int

// The three kinds of container probe.
const (
	Liveness Kind = iota
	Readiness
	Startup
)

// String returns "liveness", "readiness" or "startup".
func (k Kind) String() string {
	switch k {
	case Liveness:
		return "liveness"
	case Readiness:
		return "readiness"
	case Startup:
		return "startup"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// field returns the container field holding a probe of this kind.
func (k Kind) field() string { return k.String() + "Probe" }

// Result is the outcome of a probe attempt, or a worker's thresholded
// result.
type Result int

// Probe results. Unknown from Do means the attempt errored (a bad probe,
// a failing runtime, a cancelled context) and says nothing about the
// container; a worker discards such attempts, as kubelet does.
const (
	Unknown Result = iota
	Success
	Failure
)

// String returns "unknown", "success" or "failure".
func (r Result) String() string {
	switch r {
	case Unknown:
		return "unknown"
	case Success:
		return "success"
	case Failure:
		return "failure"
	}
	return "Result(" + strconv.Itoa(int(r)) + ")"
}

// Target says how to reach one container.
type Target struct {
	// Host is the pod IP, or the host IP for hostNetwork pods. httpGet
	// (unless the probe sets a host), tcpSocket (likewise) and grpc
	// connect to it.
	Host string
	// Ports are the container's ports, to resolve named probe ports.
	Ports []corev1.ContainerPort
	// Exec runs cmd in the container and returns its exit code and
	// combined output. It must return when ctx ends. err is for failures
	// to run the command at all, not for a non-zero exit code.
	Exec func(ctx context.Context, cmd []string) (exitCode int, output []byte, err error)
}

// Defaults kubelet applies to unset probe fields.
const (
	defaultTimeout          = time.Second
	defaultPeriod           = 10 * time.Second
	defaultSuccessThreshold = 1
	defaultFailureThreshold = 3
)

// maxOutput bounds how much of an HTTP body or a command's output a probe
// reads, like kubelet's 10 KiB.
const maxOutput = 10 << 10

// userAgent is sent by httpGet and grpc probes unless the probe sets one.
const userAgent = "kube-probe/outpost"

// Do runs one attempt of p against t, bounded by p.TimeoutSeconds (default
// 1s) and by ctx, and returns the result and a short kubelet-like message
// such as "HTTP probe failed with statuscode: 503". A bad probe definition
// or a cancelled ctx gives Unknown.
func Do(ctx context.Context, p *corev1.Probe, t Target) (Result, string) {
	run, err := resolve("probe", p, t)
	if err != nil {
		return Unknown, err.Error()
	}
	actx, cancel := context.WithTimeout(ctx, secondsOr(p.TimeoutSeconds, defaultTimeout))
	defer cancel()
	r, msg := run(actx)
	if r != Success && errors.Is(ctx.Err(), context.Canceled) {
		return Unknown, "probe cancelled"
	}
	return r, msg
}

// attempt runs one probe attempt under a context that carries its timeout.
type attempt func(ctx context.Context) (Result, string)

// resolve checks p's handler against t and returns the attempt to run.
// Errors name fields below root, e.g. "probe.httpGet.port".
func resolve(root string, p *corev1.Probe, t Target) (attempt, error) {
	if p == nil {
		return nil, bad(root, "is required")
	}
	h := p.ProbeHandler
	var n int
	for _, set := range []bool{h.Exec != nil, h.HTTPGet != nil, h.TCPSocket != nil, h.GRPC != nil} {
		if set {
			n++
		}
	}
	switch {
	case n == 0:
		return nil, bad(root, "must specify a handler (exec, httpGet, tcpSocket or grpc)")
	case n > 1:
		return nil, bad(root, "may not specify more than one handler")
	}
	switch {
	case h.Exec != nil:
		return resolveExec(root+".exec", h.Exec, t)
	case h.HTTPGet != nil:
		return resolveHTTP(root+".httpGet", h.HTTPGet, t)
	case h.TCPSocket != nil:
		return resolveTCP(root+".tcpSocket", h.TCPSocket, t)
	default:
		return resolveGRPC(root+".grpc", h.GRPC, t)
	}
}

// resolvePort turns a probe's port into a number, looking names up in the
// container's ports; like kubelet, a name that is not a port name but
// parses as a number is taken as that number.
func resolvePort(path string, port intstr.IntOrString, ports []corev1.ContainerPort) (int, error) {
	n := -1
	switch port.Type {
	case intstr.Int:
		n = int(port.IntVal)
	case intstr.String:
		found := false
		for _, p := range ports {
			if p.Name != "" && p.Name == port.StrVal {
				n, found = int(p.ContainerPort), true
				break
			}
		}
		if !found {
			v, err := strconv.Atoi(port.StrVal)
			if err != nil {
				return 0, bad(path, "no container port named %q", port.StrVal)
			}
			n = v
		}
	}
	if n < 1 || n > 65535 {
		return 0, bad(path, "%d is not a valid port number (1-65535)", n)
	}
	return n, nil
}

// hostPort returns host:port, taking the host from the probe or, when the
// probe sets none, from the target.
func hostPort(path, probeHost string, t Target, port int) (string, error) {
	host := probeHost
	if host == "" {
		host = t.Host
	}
	if host == "" {
		return "", bad(path, "is empty and the target has no pod IP")
	}
	return net.JoinHostPort(host, strconv.Itoa(port)), nil
}

// dial connects like kubelet's probe dialer: with SO_LINGER of one second,
// so frequent probes do not pile up sockets in TIME_WAIT.
func dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(1) // best effort; the probe works without it
	}
	return c, nil
}

// secondsOr returns s seconds, or def when s is not positive.
func secondsOr(s int32, def time.Duration) time.Duration {
	if s <= 0 {
		return def
	}
	return time.Duration(s) * time.Second
}

// fieldError is a bad value at a field path.
type fieldError struct {
	path, msg string
}

func (e *fieldError) Error() string { return e.path + ": " + e.msg }

func bad(path, format string, args ...any) error {
	return &fieldError{path: path, msg: fmt.Sprintf(format, args...)}
}
