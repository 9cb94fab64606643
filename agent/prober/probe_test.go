package prober

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// hostPortOf splits a listener's or server's address into host and port.

// redirectBody is what http.Redirect writes for a GET.
const redirectBody = "<a href=\"http://elsewhere.invalid/ok\">Moved Permanently</a>.\n\n"

func hostPortOf(t *testing.T, addr string) (string, int) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return host, n
}

// closedPort returns a 127.0.0.1 port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port := hostPortOf(t, l.Addr().String())
	l.Close()
	return port
}

func httpGet(path string, port intstr.IntOrString, headers ...corev1.HTTPHeader) *corev1.Probe {
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
		Path: path, Port: port, HTTPHeaders: headers,
	}}}
}

// probeServer answers the paths the HTTP tests use.
func probeServer() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "fine") })
	mux.HandleFunc("/fail", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "down", http.StatusServiceUnavailable) })
	mux.HandleFunc("/notfound", http.NotFound)
	mux.HandleFunc("/to-ok", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ok", http.StatusFound) })
	mux.HandleFunc("/to-fail", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/fail", http.StatusFound) })
	mux.HandleFunc("/to-elsewhere", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://elsewhere.invalid/ok", http.StatusMovedPermanently)
	})
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/loop", http.StatusFound) })
	mux.HandleFunc("/headers", func(w http.ResponseWriter, r *http.Request) {
		var bad []string
		if got := r.Header.Get("User-Agent"); got != "kube-probe/outpost" {
			bad = append(bad, "User-Agent="+got)
		}
		if got := r.Header.Get("X-Probe"); got != "yes" {
			bad = append(bad, "X-Probe="+got)
		}
		if r.Host != "app.example" {
			bad = append(bad, "Host="+r.Host)
		}
		if r.URL.RawQuery != "q=1" {
			bad = append(bad, "query="+r.URL.RawQuery)
		}
		if len(bad) > 0 {
			http.Error(w, strings.Join(bad, " "), http.StatusBadRequest)
		}
	})
	mux.HandleFunc("/agent", func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get("User-Agent"); got != "custom/1" {
			http.Error(w, "User-Agent="+got, http.StatusBadRequest)
		}
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(strings.Repeat("x", 1<<20)))
	})
	mux.HandleFunc("/hang", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	return mux
}

func TestDoHTTP(t *testing.T) {
	srv := httptest.NewServer(probeServer())
	defer srv.Close()
	host, port := hostPortOf(t, srv.Listener.Addr().String())
	target := Target{Host: host, Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: int32(port)}}}
	p := intstr.FromInt32(int32(port))

	tests := []struct {
		name    string
		probe   *corev1.Probe
		want    Result
		wantMsg string // substring of the message
	}{
		{"200", httpGet("/ok", p), Success, ""},
		{"503", httpGet("/fail", p), Failure, "HTTP probe failed with statuscode: 503"},
		{"404", httpGet("/notfound", p), Failure, "HTTP probe failed with statuscode: 404"},
		{"named port", httpGet("/ok", intstr.FromString("web")), Success, ""},
		{"numeric string port", httpGet("/ok", intstr.FromString(strconv.Itoa(port))), Success, ""},
		{"redirect on the same host followed", httpGet("/to-ok", p), Success, ""},
		{"redirect on the same host to a failure", httpGet("/to-fail", p), Failure, "statuscode: 503"},
		{"redirect elsewhere is a success with a warning", httpGet("/to-elsewhere", p), Success, "Probe terminated redirects, Response body: " + redirectBody},
		{"redirect loop", httpGet("/loop", p), Failure, "stopped after 10 redirects"},
		{"headers, Host override and query", httpGet("/headers?q=1", p,
			corev1.HTTPHeader{Name: "X-Probe", Value: "yes"},
			corev1.HTTPHeader{Name: "Host", Value: "app.example"}), Success, ""},
		{"own User-Agent kept", httpGet("/agent", p, corev1.HTTPHeader{Name: "user-agent", Value: "custom/1"}), Success, ""},
		{"big body", httpGet("/big", p), Success, ""},
		{"probe host overrides target", func() *corev1.Probe {
			pr := httpGet("/ok", p)
			pr.HTTPGet.Host = "127.0.0.1"
			return pr
		}(), Success, ""},
		{"connection refused", httpGet("/ok", intstr.FromInt(closedPort(t))), Failure, "connection refused"},
		{"unknown named port", httpGet("/ok", intstr.FromString("nope")), Unknown, `probe.httpGet.port: no container port named "nope"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tgt := target
			if tt.probe.HTTPGet.Host != "" {
				tgt.Host = "192.0.2.1" // must not be used
			}
			got, msg := Do(context.Background(), tt.probe, tgt)
			if got != tt.want || !strings.Contains(msg, tt.wantMsg) {
				t.Fatalf("Do = %v, %q; want %v, message containing %q", got, msg, tt.want, tt.wantMsg)
			}
		})
	}
}

func TestDoHTTPS(t *testing.T) {
	srv := httptest.NewTLSServer(probeServer()) // self-signed: kubelet does not verify
	defer srv.Close()
	host, port := hostPortOf(t, srv.Listener.Addr().String())
	pr := httpGet("/fail", intstr.FromInt(port))
	pr.HTTPGet.Scheme = corev1.URISchemeHTTPS
	if got, msg := Do(context.Background(), pr, Target{Host: host}); got != Failure || msg != "HTTP probe failed with statuscode: 503" {
		t.Fatalf("HTTPS /fail: %v, %q", got, msg)
	}
	pr.HTTPGet.Path = "/ok"
	if got, msg := Do(context.Background(), pr, Target{Host: host}); got != Success {
		t.Fatalf("HTTPS /ok: %v, %q", got, msg)
	}
}

func TestDoHTTPTimesOut(t *testing.T) {
	srv := httptest.NewServer(probeServer())
	defer srv.Close()
	host, port := hostPortOf(t, srv.Listener.Addr().String())
	// The caller's deadline is shorter than timeoutSeconds (1s) and wins.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	got, msg := Do(ctx, httpGet("/hang", intstr.FromInt(port)), Target{Host: host})
	if got != Failure || !strings.Contains(msg, "deadline exceeded") {
		t.Fatalf("Do = %v, %q; want failure by deadline", got, msg)
	}
}

func TestDoCancelledIsUnknown(t *testing.T) {
	srv := httptest.NewServer(probeServer())
	defer srv.Close()
	host, port := hostPortOf(t, srv.Listener.Addr().String())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got, msg := Do(ctx, httpGet("/ok", intstr.FromInt(port)), Target{Host: host}); got != Unknown {
		t.Fatalf("Do with a cancelled context = %v, %q; want unknown", got, msg)
	}
}

func tcpSocket(port intstr.IntOrString) *corev1.Probe {
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: port}}}
}

func TestDoTCP(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	host, port := hostPortOf(t, l.Addr().String())
	target := Target{Host: host, Ports: []corev1.ContainerPort{{Name: "db", ContainerPort: int32(port)}}}
	tests := []struct {
		name    string
		probe   *corev1.Probe
		want    Result
		wantMsg string
	}{
		{"listening", tcpSocket(intstr.FromInt(port)), Success, ""},
		{"named port", tcpSocket(intstr.FromString("db")), Success, ""},
		{"closed port", tcpSocket(intstr.FromInt(closedPort(t))), Failure, "connection refused"},
		{"port out of range", tcpSocket(intstr.FromInt(70000)), Unknown, "probe.tcpSocket.port: 70000 is not a valid port number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, msg := Do(context.Background(), tt.probe, target)
			if got != tt.want || !strings.Contains(msg, tt.wantMsg) {
				t.Fatalf("Do = %v, %q; want %v, message containing %q", got, msg, tt.want, tt.wantMsg)
			}
		})
	}
}

func grpcProbe(port int, service *string) *corev1.Probe {
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: int32(port), Service: service}}}
}

// startGRPC serves on 127.0.0.1; with hs nil the server has no health
// service.
func startGRPC(t *testing.T, hs *health.Server) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	if hs != nil {
		healthpb.RegisterHealthServer(s, hs)
	}
	go s.Serve(l)
	t.Cleanup(s.Stop)
	_, port := hostPortOf(t, l.Addr().String())
	return port
}

func TestDoGRPC(t *testing.T) {
	hs := health.NewServer() // "" is SERVING
	hs.SetServingStatus("down", healthpb.HealthCheckResponse_NOT_SERVING)
	hs.SetServingStatus("up", healthpb.HealthCheckResponse_SERVING)
	port := startGRPC(t, hs)
	bare := startGRPC(t, nil)
	str := func(s string) *string { return &s }

	tests := []struct {
		name    string
		probe   *corev1.Probe
		want    Result
		wantMsg string
	}{
		{"server health, nil service", grpcProbe(port, nil), Success, "service healthy"},
		{"named service serving", grpcProbe(port, str("up")), Success, "service healthy"},
		{"not serving", grpcProbe(port, str("down")), Failure, `service unhealthy (responded with "NOT_SERVING")`},
		{"unknown service", grpcProbe(port, str("nope")), Failure, "health rpc probe failed"},
		{"no health service", grpcProbe(bare, nil), Failure, "does not implement the grpc health protocol"},
		{"closed port", grpcProbe(closedPort(t), nil), Failure, "connection refused"},
		{"port 0", grpcProbe(0, nil), Unknown, "probe.grpc.port: 0 is not a valid port number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, msg := Do(context.Background(), tt.probe, Target{Host: "127.0.0.1"})
			if got != tt.want || !strings.Contains(msg, tt.wantMsg) {
				t.Fatalf("Do = %v, %q; want %v, message containing %q", got, msg, tt.want, tt.wantMsg)
			}
		})
	}
}

func execProbe(cmd ...string) *corev1.Probe {
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: cmd}}}
}

func TestDoExec(t *testing.T) {
	tests := []struct {
		name    string
		exec    func(ctx context.Context, cmd []string) (int, []byte, error)
		want    Result
		wantMsg string
	}{
		{"exit 0", func(ctx context.Context, cmd []string) (int, []byte, error) { return 0, []byte("ok\n"), nil }, Success, "ok"},
		{"exit 1 with output", func(ctx context.Context, cmd []string) (int, []byte, error) {
			return 1, []byte("no such file\n"), nil
		}, Failure, "command exited with code 1: no such file"},
		{"exit 2 without output", func(ctx context.Context, cmd []string) (int, []byte, error) { return 2, nil, nil }, Failure, "command exited with code 2"},
		{"runtime reports a timeout", func(ctx context.Context, cmd []string) (int, []byte, error) {
			return -1, nil, fmt.Errorf("exec in container: %w", context.DeadlineExceeded)
		}, Failure, "command timed out"},
		{"runtime fails", func(ctx context.Context, cmd []string) (int, []byte, error) {
			return -1, nil, errors.New("container not found")
		}, Unknown, "exec probe: container not found"},
		{"huge output is cut", func(ctx context.Context, cmd []string) (int, []byte, error) {
			return 1, []byte(strings.Repeat("y", 1<<20)), nil
		}, Failure, "code 1: yyy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, msg := Do(context.Background(), execProbe("cat", "/tmp/healthy"), Target{Exec: tt.exec})
			if got != tt.want || !strings.Contains(msg, tt.wantMsg) || len(msg) > maxOutput+100 {
				t.Fatalf("Do = %v, %q; want %v, message containing %q", got, trim(msg), tt.want, tt.wantMsg)
			}
		})
	}
}

func trim(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

func TestDoExecTimesOut(t *testing.T) {
	var gotCmd []string
	var gotDeadline time.Duration
	exec := func(ctx context.Context, cmd []string) (int, []byte, error) {
		gotCmd = cmd
		if d, ok := ctx.Deadline(); ok {
			gotDeadline = time.Until(d)
		}
		<-ctx.Done() // a command that hangs until the runtime kills it
		return -1, nil, ctx.Err()
	}
	pr := execProbe("sh", "-c", "sleep 100")
	pr.TimeoutSeconds = 5
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	got, msg := Do(ctx, pr, Target{Exec: exec})
	if got != Failure || msg != "command timed out" {
		t.Fatalf("Do = %v, %q; want failure, \"command timed out\"", got, msg)
	}
	if strings.Join(gotCmd, " ") != "sh -c sleep 100" {
		t.Fatalf("ran %q", gotCmd)
	}
	if gotDeadline <= 0 || gotDeadline > time.Second {
		t.Fatalf("exec saw a deadline %v away; want the caller's 20ms", gotDeadline)
	}

	// Without a caller deadline, the attempt is bounded by timeoutSeconds.
	pr.TimeoutSeconds = 0
	exec = func(ctx context.Context, cmd []string) (int, []byte, error) {
		d, ok := ctx.Deadline()
		if !ok || time.Until(d) > time.Second {
			return 1, []byte("no 1s deadline"), nil
		}
		return 0, nil, nil
	}
	if got, msg := Do(context.Background(), pr, Target{Exec: exec}); got != Success {
		t.Fatalf("default timeout: %v, %q", got, msg)
	}
}

func TestDoRejectsBadProbes(t *testing.T) {
	tests := []struct {
		name  string
		probe *corev1.Probe
		want  string
	}{
		{"nil", nil, "probe: is required"},
		{"no handler", &corev1.Probe{}, "probe: must specify a handler"},
		{"two handlers", &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
			Exec: &corev1.ExecAction{Command: []string{"true"}}, TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(1)},
		}}, "probe: may not specify more than one handler"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, msg := Do(context.Background(), tt.probe, Target{Host: "127.0.0.1"})
			if got != Unknown || !strings.HasPrefix(msg, tt.want) {
				t.Fatalf("Do = %v, %q; want unknown, %q", got, msg, tt.want)
			}
		})
	}
}
