package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/outpost-edge/outpost/test/e2e/env"
)

// kubectlAs runs kubectl with kubeconfig and returns its combined output
// and exit code; ctx bounds it.
func kubectlAs(ctx context.Context, t testing.TB, kubeconfig string, stdin io.Reader, args ...string) (string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, env.Tool(t, "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return string(out), 0
}

// userKubeconfig makes a user of the API server with a client certificate
// from its CA and returns the kubeconfig, and the certificate for
// requests straight to the node.
func userKubeconfig(t testing.TB, api *env.APIServer, name string, groups ...string) (string, tls.Certificate) {
	t.Helper()
	certPEM, keyPEM, err := api.CA.Issue(pkix.Name{CommonName: name, Organization: groups}, nil, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := env.WriteKubeconfig(path, api.URL, api.CA.CertPEM(), name, "", certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return path, cert
}

// debugRole lets user dev read pods and their logs, exec, attach and
// port-forward in default, as a developer's role does; nothing on nodes.
const debugRole = `apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: debug, namespace: default}
rules:
- apiGroups: [""]
  resources: [pods, pods/log]
  verbs: [get, list]
- apiGroups: [""]
  resources: [pods/exec, pods/attach, pods/portforward]
  verbs: [get, create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: debug-dev, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: debug}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: dev}
`

// debugPod is the pod the kubelet API test debugs: a web server bound to
// the pod's loopback only, a container that logs five lines, one that
// crashes (for --previous), and one that answers lines on its stdin.
func debugPod(node string) *corev1.Pod {
	p := apiPod("debug", node, "mkdir -p /tmp/www && echo hello-from-pod > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /tmp/www")
	p.Spec.Containers[0].Name = "web"
	sh := func(name, script string) corev1.Container {
		return corev1.Container{Name: name, Image: env.TestImage, Command: []string{"sh", "-c", script}}
	}
	in := sh("echo", "while read l; do echo got $l; done; exec sleep 3600")
	in.Stdin = true
	p.Spec.Containers = append(p.Spec.Containers,
		sh("log", "for i in 1 2 3 4 5; do echo line $i; done; exec sleep 3600"),
		sh("crash", "echo attempt $(cat /proc/uptime); sleep 2; exit 1"),
		in)
	return p
}

// startDebugNode starts an API server and a node linked to the host (so
// the API server reaches its kubelet API), runs debugPod on it, and
// applies debugRole; it returns the node's address.
func startDebugNode(t testing.TB) (*env.APIServer, *admin, *node, string) {
	t.Helper()
	api := env.StartAPIServer(t)
	adm := newAdmin(t, api)
	n := newNode(t, "e2e-kapi")
	nodeIP := n.hostLink()
	n.connect(api)
	n.appendConfig(fmt.Sprintf("server:\n  clientCAFile: %s\n", api.ClientCAFile))
	n.start()
	healthyNode(t, adm, n.name)
	runDebugPod(t, api, adm, n.name)
	return api, adm, n, nodeIP
}

// runDebugPod runs debugPod on node, waits for three of its containers
// to run, and applies debugRole.
func runDebugPod(t testing.TB, api *env.APIServer, adm *admin, node string) {
	t.Helper()
	adm.create("pods", debugPod(node))
	within(90*time.Second).For(t, "debug pod running", func() (bool, string) {
		p, err := adm.pod("debug")
		if err != nil {
			return false, err.Error()
		}
		running := 0
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running != nil {
				running++
			}
		}
		return running >= 3 && p.Status.Phase == corev1.PodRunning, asJSON(p.Status.ContainerStatuses)
	})
	api.Kubectl(t, "apply", "-f", writeTemp(t, "role.yaml", debugRole))
}

// debugKubectl runs kubectl as kubeconfig's user within ctx, each command
// within a minute, so one that hangs fails alone.
func debugKubectl(ctx context.Context, t testing.TB, kubeconfig string) func(stdin io.Reader, args ...string) (string, int) {
	return func(stdin io.Reader, args ...string) (string, int) {
		c, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		return kubectlAs(c, t, kubeconfig, stdin, args...)
	}
}

// TestKubeletAPI drives the agent's kubelet API through a real API server
// with kubectl as a user with a namespace role (not cluster admin):
// logs (--tail, --since, -f, --previous), exec with stdin and a tty and
// with an exit code, attach, port-forward to a server on the pod's
// loopback; the node's /metrics through the API server's node proxy,
// parsed as Prometheus text; a certificate user without nodes/proxy gets
// 403 from the node, a request without credentials 401.
func TestKubeletAPI(t *testing.T) {
	api, adm, n, nodeIP := startDebugNode(t)
	dev, _ := userKubeconfig(t, api, "dev")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	kc := debugKubectl(ctx, t, dev)

	t.Run("logs", func(t *testing.T) {
		if out, code := kc(nil, "logs", "debug", "-c", "log", "--since", "1h"); code != 0 || !strings.HasPrefix(out, "line 1\n") {
			t.Errorf("logs --since 1h: %d %q", code, out)
		}
		if out, code := kc(nil, "logs", "debug", "-c", "log", "--timestamps", "--tail", "1"); code != 0 || !strings.HasSuffix(out, "Z line 5\n") {
			t.Errorf("logs --timestamps: %d %q", code, out)
		}
		testDebugLogs(t, ctx, adm, dev)
	})

	t.Run("exec", func(t *testing.T) { testDebugExec(t, ctx, dev) })
	t.Run("attach", func(t *testing.T) { testDebugAttach(t, ctx, dev, 15*time.Second) })
	t.Run("port-forward", func(t *testing.T) { testDebugPortForward(t, ctx, dev, 20*time.Second) })

	t.Run("metrics", func(t *testing.T) {
		raw := api.Kubectl(t, "get", "--raw", "/api/v1/nodes/"+n.name+"/proxy/metrics")
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(strings.NewReader(raw))
		if err != nil {
			t.Fatalf("/metrics does not parse: %v\n%s", err, raw)
		}
		if _, ok := fams["go_goroutines"]; !ok {
			t.Errorf("/metrics has no go_goroutines; families: %d", len(fams))
		}
		t.Logf("/metrics: %d families", len(fams))
		// The resource metrics metrics-server reads: real figures from
		// the pod's cgroups.
		raw = api.Kubectl(t, "get", "--raw", "/api/v1/nodes/"+n.name+"/proxy/metrics/resource")
		fams, err = p.TextToMetricFamilies(strings.NewReader(raw))
		if err != nil {
			t.Fatalf("/metrics/resource does not parse: %v\n%s", err, raw)
		}
		found := false
		for _, m := range fams["container_memory_working_set_bytes"].GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["pod"] == "debug" && labels["container"] == "web" && labels["namespace"] == "default" {
				found = m.GetGauge().GetValue() > 0 && m.GetTimestampMs() > 0
			}
		}
		if !found || len(fams["node_cpu_usage_seconds_total"].GetMetric()) != 1 {
			t.Errorf("/metrics/resource lacks the web container's memory or the node's CPU:\n%s", raw)
		}
		// /stats/summary, as kubelet's Summary API.
		raw = api.Kubectl(t, "get", "--raw", "/api/v1/nodes/"+n.name+"/proxy/stats/summary")
		var sum statsv1alpha1.Summary
		if err := json.Unmarshal([]byte(raw), &sum); err != nil {
			t.Fatalf("/stats/summary: %v\n%s", err, raw)
		}
		pods := map[string]int{}
		for _, p := range sum.Pods {
			pods[p.PodRef.Namespace+"/"+p.PodRef.Name] = len(p.Containers)
		}
		if sum.Node.NodeName != n.name || sum.Node.Memory == nil || sum.Node.Memory.WorkingSetBytes == nil || pods["default/debug"] < 3 {
			t.Errorf("/stats/summary: node %q, pods %v\n%s", sum.Node.NodeName, pods, raw)
		}
	})

	t.Run("top", func(t *testing.T) {
		env.StartMetricsServer(t, api, hostSide(nodeIP))
		// metrics-server needs two scrapes (10 s apart) for a CPU rate.
		var out string
		within(90*time.Second).For(t, "kubectl top node", func() (bool, string) {
			o, code := kubectlAs(ctx, t, api.Kubeconfig, nil, "top", "node", n.name, "--no-headers")
			out = o
			return code == 0 && strings.HasPrefix(o, n.name+" "), o
		})
		t.Logf("kubectl top node: %s", strings.TrimSpace(out))
		within(60*time.Second).For(t, "kubectl top pod", func() (bool, string) {
			o, code := kubectlAs(ctx, t, api.Kubeconfig, nil, "top", "pod", "debug", "--containers", "--no-headers")
			out = o
			return code == 0 && strings.Contains(o, "debug") && strings.Contains(o, " web "), o
		})
		t.Logf("kubectl top pod --containers:\n%s", out)
	})

	t.Run("denied", func(t *testing.T) {
		_, cert := userKubeconfig(t, api, "nobody")
		get := func(cert *tls.Certificate, path string) (int, string) {
			tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
			if cert != nil {
				tr.TLSClientConfig.Certificates = []tls.Certificate{*cert}
			}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + net.JoinHostPort(nodeIP, "10250") + path)
			if err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		if code, body := get(&cert, "/containerLogs/default/debug/log"); code != 403 || !strings.Contains(body, "user=nobody") {
			t.Errorf("a user without nodes/proxy: %d %q", code, body)
		}
		if code, body := get(nil, "/pods"); code != 401 {
			t.Errorf("no credentials: %d %q", code, body)
		}
		// dev may exec through the API server but not call the node.
		_, devCert := userKubeconfig(t, api, "dev")
		if code, _ := get(&devCert, "/pods"); code != 403 {
			t.Errorf("dev straight to the node: %d", code)
		}
	})

	t.Run("offline", func(t *testing.T) {
		// With the API server gone, an operator's admin certificate
		// (group system:masters, server.localGroups) still reads logs and
		// execs on the node; a token cannot be checked and fails closed.
		api.Stop()
		_, root := userKubeconfig(t, api, "operator", "system:masters")
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{root}}}}
		base := "https://" + net.JoinHostPort(nodeIP, "10250")
		resp, err := client.Get(base + "/containerLogs/default/debug/log?tailLines=1")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "line 5\n" {
			t.Errorf("offline logs with an admin certificate: %d %q", resp.StatusCode, b)
		}
		req, _ := http.NewRequest("GET", base+"/pods", nil)
		// A token the node has not seen (metrics-server's admin token is
		// cached from its scrapes, as kubelet caches reviews).
		req.Header.Set("Authorization", "Bearer not-seen-before")
		tokenClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		resp, err = tokenClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Errorf("offline with a token: %d, want 401", resp.StatusCode)
		}
		certPEM, keyPEM := pemPair(t, root)
		cfg := &rest.Config{Host: base, TLSClientConfig: rest.TLSClientConfig{Insecure: true, CertData: certPEM, KeyData: keyPEM}}
		q := url.Values{"command": {"sh", "-c", "echo offline; exit 4"}, "output": {"1"}, "error": {"1"}}
		u, _ := url.Parse(base + "/exec/default/debug/log?" + q.Encode())
		ex, err := remotecommand.NewSPDYExecutor(cfg, "POST", u)
		if err != nil {
			t.Fatal(err)
		}
		var out, errOut strings.Builder
		err = ex.StreamWithContext(context.Background(), remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut})
		var code interface{ ExitStatus() int }
		if !errors.As(err, &code) || code.ExitStatus() != 4 || out.String() != "offline\n" {
			t.Errorf("offline exec: %v %q %q", err, out.String(), errOut.String())
		}
	})
}

// pemPair returns a certificate and its (ECDSA) key as PEM.
func pemPair(t testing.TB, c tls.Certificate) (certPEM, keyPEM []byte) {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func writeTemp(t testing.TB, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// appendConfig adds YAML to the node's config file (before start).
func (n *node) appendConfig(yaml string) {
	n.t.Helper()
	f, err := os.OpenFile(n.cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(yaml); err != nil {
		n.t.Fatal(err)
	}
}

// testDebugLogs runs kubectl logs as user dev (kubeconfig) on runDebugPod's
// pod: whole, --tail, an unknown container, --previous of the crashing
// container, and -f ending with the followed attempt.
func testDebugLogs(t *testing.T, ctx context.Context, adm *admin, dev string) {
	kc := debugKubectl(ctx, t, dev)
	if out, code := kc(nil, "logs", "debug", "-c", "log"); code != 0 || out != "line 1\nline 2\nline 3\nline 4\nline 5\n" {
		t.Errorf("logs: %d %q", code, out)
	}
	if out, code := kc(nil, "logs", "debug", "-c", "log", "--tail", "2"); code != 0 || out != "line 4\nline 5\n" {
		t.Errorf("logs --tail 2: %d %q", code, out)
	}
	if out, code := kc(nil, "logs", "debug", "-c", "nope"); code == 0 || !strings.Contains(out, "nope") {
		t.Errorf("logs of an unknown container: %d %q", code, out)
	}
	// --previous: the crashing container's earlier attempt.
	within(60*time.Second).For(t, "crash container restarted", func() (bool, string) {
		p, err := adm.pod("debug")
		if err != nil {
			return false, err.Error()
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name == "crash" {
				return cs.RestartCount >= 1, fmt.Sprint(cs.RestartCount)
			}
		}
		return false, "no crash status"
	})
	if out, code := kc(nil, "logs", "debug", "-c", "crash", "--previous"); code != 0 || !strings.HasPrefix(out, "attempt ") {
		t.Errorf("logs --previous: %d %q", code, out)
	}
	// -f ends by itself when the followed attempt exits.
	start := time.Now()
	fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
	out, code := kubectlAs(fctx, t, dev, nil, "logs", "-f", "debug", "-c", "crash")
	fcancel()
	if code != 0 || !strings.Contains(out, "attempt ") || time.Since(start) > 25*time.Second {
		t.Errorf("logs -f of a crashing container: %d %q after %v", code, out, time.Since(start))
	}
}

// testDebugExec runs kubectl exec as dev in runDebugPod's pod: an exit
// code, stdin, and -it under script(1).
func testDebugExec(t *testing.T, ctx context.Context, dev string) {
	kc := debugKubectl(ctx, t, dev)
	if out, code := kc(nil, "exec", "debug", "-c", "log", "--", "sh", "-c", "echo out; echo err >&2; exit 3"); code != 3 || !strings.Contains(out, "out\n") || !strings.Contains(out, "err\n") {
		t.Errorf("exec with exit 3: %d %q", code, out)
	}
	if out, code := kc(strings.NewReader("one\ntwo\n"), "exec", "-i", "debug", "-c", "log", "--", "wc", "-l"); code != 0 || strings.TrimSpace(out) != "2" {
		t.Errorf("exec -i wc -l: %d %q", code, out)
	}
	// -it needs a terminal on kubectl's side: script(1) gives it one.
	script := fmt.Sprintf("%s --kubeconfig %s exec -it debug -c log -- sh -c 'tty; stty size; read x; echo typed $x'", env.Tool(t, "kubectl"), dev)
	ictx, icancel := context.WithTimeout(ctx, time.Minute)
	defer icancel()
	cmd := exec.CommandContext(ictx, "script", "-qec", script, "/dev/null")
	cmd.Stdin = strings.NewReader("hello\n")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "/dev/pts/") || !strings.Contains(string(out), "typed hello") {
		t.Errorf("exec -it: %v %q", err, out)
	}
}

// testDebugAttach runs kubectl attach -i as dev to runDebugPod's echo
// container and wants its answer within answer (the command has 5 s
// more).
func testDebugAttach(t *testing.T, ctx context.Context, dev string, answer time.Duration) {
	actx, acancel := context.WithTimeout(ctx, answer+5*time.Second)
	defer acancel()
	cmd := exec.CommandContext(actx, env.Tool(t, "kubectl"), "--kubeconfig", dev, "attach", "-i", "debug", "-c", "echo")
	pr, pw := io.Pipe()
	cmd.Stdin = pr
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stdout)
	got := make(chan string, 8)
	go func() {
		for lines.Scan() {
			got <- lines.Text()
		}
		close(got)
	}()
	// The attach may take a moment to join: write until answered.
	deadline := time.After(answer)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case l, ok := <-got:
			if !ok {
				t.Fatal("kubectl attach ended without an answer")
			}
			if l == "got ping" {
				pw.Close()
				return
			}
		case <-tick.C:
			fmt.Fprintln(pw, "ping")
		case <-deadline:
			t.Fatal("no answer through kubectl attach")
		}
	}
}

// testDebugPortForward runs kubectl port-forward as dev to runDebugPod's
// web server, bound to the pod's 127.0.0.1, and wants its page within
// page.
func testDebugPortForward(t *testing.T, ctx context.Context, dev string, page time.Duration) {
	local := env.FreePort(t)
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	cmd := exec.CommandContext(pctx, env.Tool(t, "kubectl"), "--kubeconfig", dev, "port-forward", "pod/debug", fmt.Sprintf("%d:8080", local))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { pcancel(); cmd.Wait() }()
	var body string
	within(page).For(t, "a page through kubectl port-forward", func() (bool, string) {
		resp, err := (&http.Client{Timeout: 3 * time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%d/", local))
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == 200, fmt.Sprint(resp.StatusCode, " ", body)
	})
	if body != "hello-from-pod\n" {
		t.Errorf("port-forward page: %q", body)
	}
}
