package env

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// MetricsServer is a metrics-server registered with an APIServer's
// aggregation layer as the APIService v1beta1.metrics.k8s.io.
type MetricsServer struct {
	// Addr is the IP:PORT metrics-server serves HTTPS on.
	Addr string
	// Log is the path of metrics-server's log.
	Log string
}

// metricsAPIService is the registration of a metrics-server that runs
// outside the cluster: a Service without a selector, its Endpoints and
// EndpointSlice written by hand (no controller runs), and the APIService
// pointing at the Service's port 443, which the aggregator
// (--enable-aggregator-routing) resolves to the endpoint's address and
// port. Arguments: IP, port.
const metricsAPIService = `apiVersion: v1
kind: Service
metadata:
  name: metrics-server
  namespace: kube-system
spec:
  ports:
  - name: https
    port: 443
    protocol: TCP
    targetPort: %[2]d
---
apiVersion: v1
kind: Endpoints
metadata:
  name: metrics-server
  namespace: kube-system
subsets:
- addresses:
  - ip: %[1]s
  ports:
  - name: https
    port: %[2]d
    protocol: TCP
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: metrics-server-e2e
  namespace: kube-system
  labels:
    kubernetes.io/service-name: metrics-server
    endpointslice.kubernetes.io/managed-by: outpost-e2e
addressType: IPv4
endpoints:
- addresses:
  - %[1]s
  conditions:
    ready: true
ports:
- name: https
  port: %[2]d
  protocol: TCP
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1beta1.metrics.k8s.io
spec:
  group: metrics.k8s.io
  version: v1beta1
  service:
    name: metrics-server
    namespace: kube-system
    port: 443
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 100
  versionPriority: 100
`

// StartMetricsServer runs metrics-server against api on listenIP and a
// free port, registers it as the APIService v1beta1.metrics.k8s.io and
// waits until the API server reports that Available. listenIP must be an
// address the API server reaches that is not loopback (Endpoints refuse
// 127.0.0.0/8), such as the host side of a node's link.
//
// metrics-server scrapes each node's kubelet API at its InternalIP and
// the port its Node names, without verifying its serving certificate, as the admin user,
// every 10 s (the least it allows), each scrape given 5 s. In t's cleanup
// the registration is deleted and metrics-server stopped.
func StartMetricsServer(t testing.TB, api *APIServer, listenIP string) *MetricsServer {
	t.Helper()
	bin, kubectl := lookTool(t, "metrics-server"), lookTool(t, "kubectl")
	ip := net.ParseIP(listenIP)
	if ip == nil || ip.To4() == nil || ip.IsLoopback() {
		t.Fatalf("metrics-server: listen IP %q is not a non-loopback IPv4 address", listenIP)
	}
	port := freePortOn(t, listenIP)
	dir := t.TempDir()
	m := &MetricsServer{Addr: net.JoinHostPort(listenIP, strconv.Itoa(port)), Log: filepath.Join(dir, "metrics-server.log")}
	p := start(t, dir, "metrics-server", bin,
		"--kubeconfig", api.Kubeconfig,
		"--authentication-kubeconfig", api.Kubeconfig,
		"--authorization-kubeconfig", api.Kubeconfig,
		"--bind-address", listenIP, "--secure-port", strconv.Itoa(port),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--kubelet-insecure-tls",
		"--kubelet-preferred-address-types=InternalIP",
		// The port in the Node: 10250 for a node the API server dials,
		// the node's own port at the bridge for an MQTT node.
		"--kubelet-use-node-status-port",
		// The least resolution it allows; a scrape must end within it.
		"--metric-resolution=10s", "--kubelet-request-timeout=5s",
	)

	manifest := filepath.Join(dir, "apiservice.yaml")
	if err := os.WriteFile(manifest, fmt.Appendf(nil, metricsAPIService, listenIP, port), 0o644); err != nil {
		t.Fatal(err)
	}
	// Runs before metrics-server stops (cleanups run last first), while
	// the API server still runs.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", api.Kubeconfig, "delete", "--ignore-not-found", "--wait=false", "-f", manifest).CombinedOutput()
		if err != nil {
			t.Logf("metrics-server: delete its registration: %v\n%s", err, out)
		}
	})
	api.Kubectl(t, "apply", "-f", manifest)

	waitReady(t, p, 90*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", api.Kubeconfig, "get", "apiservice", "v1beta1.metrics.k8s.io", "-o",
			`jsonpath={.status.conditions[?(@.type=="Available")].status} {.status.conditions[?(@.type=="Available")].reason}: {.status.conditions[?(@.type=="Available")].message}`).CombinedOutput()
		if err != nil {
			return fmt.Errorf("kubectl get apiservice: %v: %s", err, out)
		}
		if status, _, _ := strings.Cut(string(out), " "); status != "True" {
			return fmt.Errorf("APIService v1beta1.metrics.k8s.io not Available: %s", out)
		}
		return nil
	})
	return m
}

// freePortOn returns a TCP port on ip that was free a moment ago.
func freePortOn(t testing.TB, ip string) int {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
