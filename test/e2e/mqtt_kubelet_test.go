package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/sync/bridge"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// TestMQTTKubeletAPI drives an MQTT node's kubelet API through the
// bridge: the node runs in a network namespace the API server cannot
// reach (only the broker is reachable from it), and the bridge serves
// its kubelet API on a port of its own, named in the Node; the node
// trusts the bridge's signing key, so every frame it takes is signed. As
// a user
// with a namespace Role, kubectl logs (--tail, --previous, -f), exec
// (an exit code, -i, -it), attach and port-forward work, and so do the
// node's /metrics and /metrics/resource through the API server's node
// proxy, and kubectl top through metrics-server; a request to the bridge without credentials is refused (401), a
// user without nodes/proxy gets 403; a broker restarted during logs -f
// ends the stream, and logs work again once the node is back.
func TestMQTTKubeletAPI(t *testing.T) {
	s := newMQTTSetupWith(t, "e2e-mqtt-kapi", mqttOptions{kubelet: true, signed: true})
	n := s.node
	n.start()
	node := s.nodeReady(60 * time.Second)
	port := int(node.Status.DaemonEndpoints.KubeletEndpoint.Port)
	if len(node.Status.Addresses) == 0 || node.Status.Addresses[0] != (corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: s.kubeletIP}) ||
		port < s.kubeletPorts[0] || port > s.kubeletPorts[1] {
		t.Fatalf("node's kubelet endpoint: addresses %v, port %d; want the bridge's %s first and a port in %v", node.Status.Addresses, port, s.kubeletIP, s.kubeletPorts)
	}
	s.adm.create("pods", debugPod(n.name))
	within(90*time.Second).For(t, "debug pod running", func() (bool, string) {
		p, err := s.adm.pod("debug")
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
	s.api.Kubectl(t, "apply", "-f", writeTemp(t, "role.yaml", debugRole))
	dev, _ := userKubeconfig(t, s.api, "dev")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	kc := func(stdin io.Reader, args ...string) (string, int) {
		c, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		return kubectlAs(c, t, dev, stdin, args...)
	}

	t.Run("logs", func(t *testing.T) {
		if out, code := kc(nil, "logs", "debug", "-c", "log"); code != 0 || out != "line 1\nline 2\nline 3\nline 4\nline 5\n" {
			t.Errorf("logs: %d %q", code, out)
		}
		if out, code := kc(nil, "logs", "debug", "-c", "log", "--tail", "2"); code != 0 || out != "line 4\nline 5\n" {
			t.Errorf("logs --tail 2: %d %q", code, out)
		}
		if out, code := kc(nil, "logs", "debug", "-c", "nope"); code == 0 || !strings.Contains(out, "nope") {
			t.Errorf("logs of an unknown container: %d %q", code, out)
		}
		within(60*time.Second).For(t, "crash container restarted", func() (bool, string) {
			p, err := s.adm.pod("debug")
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
	})

	t.Run("exec", func(t *testing.T) {
		if out, code := kc(nil, "exec", "debug", "-c", "log", "--", "sh", "-c", "echo out; echo err >&2; exit 3"); code != 3 || !strings.Contains(out, "out\n") || !strings.Contains(out, "err\n") {
			t.Errorf("exec with exit 3: %d %q", code, out)
		}
		if out, code := kc(strings.NewReader("one\ntwo\n"), "exec", "-i", "debug", "-c", "log", "--", "wc", "-l"); code != 0 || strings.TrimSpace(out) != "2" {
			t.Errorf("exec -i wc -l: %d %q", code, out)
		}
		script := fmt.Sprintf("%s --kubeconfig %s exec -it debug -c log -- sh -c 'tty; stty size; read x; echo typed $x'", env.Tool(t, "kubectl"), dev)
		ictx, icancel := context.WithTimeout(ctx, time.Minute)
		defer icancel()
		cmd := exec.CommandContext(ictx, "script", "-qec", script, "/dev/null")
		cmd.Stdin = strings.NewReader("hello\n")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "/dev/pts/") || !strings.Contains(string(out), "typed hello") {
			t.Errorf("exec -it: %v %q", err, out)
		}
	})

	t.Run("attach", func(t *testing.T) {
		actx, acancel := context.WithTimeout(ctx, 30*time.Second)
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
		got := make(chan string, 8)
		go func() {
			lines := bufio.NewScanner(stdout)
			for lines.Scan() {
				got <- lines.Text()
			}
			close(got)
		}()
		deadline := time.After(20 * time.Second)
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
	})

	t.Run("port-forward", func(t *testing.T) {
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
		within(30*time.Second).For(t, "a page through kubectl port-forward", func() (bool, string) {
			resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%d/", local))
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
	})

	t.Run("metrics", func(t *testing.T) {
		raw := s.api.Kubectl(t, "get", "--raw", "/api/v1/nodes/"+n.name+"/proxy/metrics")
		if !strings.Contains(raw, "\ngo_goroutines ") {
			t.Errorf("/metrics through the bridge has no go_goroutines:\n%.2000s", raw)
		}
		raw = s.api.Kubectl(t, "get", "--raw", "/api/v1/nodes/"+n.name+"/proxy/metrics/resource")
		if !strings.Contains(raw, `container_memory_working_set_bytes{container="web",namespace="default",pod="debug"}`) {
			t.Errorf("/metrics/resource through the bridge lacks the web container:\n%.3000s", raw)
		}
	})

	t.Run("top", func(t *testing.T) {
		env.StartMetricsServer(t, s.api, s.kubeletIP)
		var out string
		within(90*time.Second).For(t, "kubectl top pod through the bridge", func() (bool, string) {
			o, code := kubectlAs(ctx, t, s.api.Kubeconfig, nil, "top", "pod", "debug", "--containers", "--no-headers")
			out = o
			return code == 0 && strings.Contains(o, " web "), o
		})
		t.Logf("kubectl top pod --containers:\n%s", out)
		within(30*time.Second).For(t, "kubectl top node through the bridge", func() (bool, string) {
			o, code := kubectlAs(ctx, t, s.api.Kubeconfig, nil, "top", "node", n.name, "--no-headers")
			return code == 0 && strings.HasPrefix(o, n.name+" "), o
		})
	})

	t.Run("denied", func(t *testing.T) {
		_, nobody := userKubeconfig(t, s.api, "nobody")
		get := func(cert *tls.Certificate, path string) (int, string) {
			tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
			if cert != nil {
				tr.TLSClientConfig.Certificates = []tls.Certificate{*cert}
			}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + net.JoinHostPort(s.kubeletIP, strconv.Itoa(port)) + path)
			if err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		if code, body := get(nil, "/containerLogs/default/debug/log"); code != 401 {
			t.Errorf("no credentials at the bridge: %d %q", code, body)
		}
		if code, body := get(&nobody, "/containerLogs/default/debug/log"); code != 403 || !strings.Contains(body, "user=nobody") {
			t.Errorf("a user without nodes/proxy at the bridge: %d %q", code, body)
		}
		_, devCert := userKubeconfig(t, s.api, "dev")
		if code, _ := get(&devCert, "/pods"); code != 403 {
			t.Errorf("dev straight to the bridge: %d", code)
		}
	})

	t.Run("broker-restart", func(t *testing.T) {
		fctx, fcancel := context.WithTimeout(ctx, 90*time.Second)
		defer fcancel()
		cmd := exec.CommandContext(fctx, env.Tool(t, "kubectl"), "--kubeconfig", dev, "logs", "-f", "debug", "-c", "log")
		stdout, _ := cmd.StdoutPipe()
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(stdout)
		for i := 1; i <= 5; i++ {
			if !lines.Scan() || lines.Text() != fmt.Sprintf("line %d", i) {
				t.Fatalf("logs -f line %d: %q", i, lines.Text())
			}
		}
		ended := make(chan error, 1)
		var rest []string
		go func() {
			for lines.Scan() {
				rest = append(rest, lines.Text())
			}
			ended <- cmd.Wait()
		}()
		stopped := time.Now()
		s.broker.Stop(t)
		select {
		case err := <-ended:
			t.Logf("logs -f ended %v after the broker stopped: %v %q %s", time.Since(stopped).Round(time.Millisecond), err, rest, strings.TrimSpace(stderr.String()))
			if why := strings.Join(rest, "\n") + stderr.String(); !strings.Contains(why, "ended: ") {
				t.Errorf("kubectl logs -f did not say why it ended: %q", why)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("kubectl logs -f still running a minute after the broker stopped")
		}
		s.broker.Start(t)
		within(90*time.Second).For(t, "logs through the bridge again", func() (bool, string) {
			out, code := kc(nil, "logs", "debug", "-c", "log", "--tail", "1")
			return code == 0 && out == "line 5\n", fmt.Sprint(code, " ", out)
		})
	})
}

// TestMQTTKubeletAPIMoves: with two bridge replicas sharing the fleet
// (both on one address, with ports of their own), the node's kubelet API
// is served by the replica that serves the node; when that replica is
// killed, the other takes the node (and the port the Node names, which
// the dead replica freed) and kubectl logs and exec work again through
// it.
func TestMQTTKubeletAPIMoves(t *testing.T) {
	s := newMQTTSetupWith(t, "e2e-mqtt-kmove", mqttOptions{kubelet: true})
	s.shareFleet("bridge-a")
	b := s.startReplica("bridge-b", bridgeCN+":1")
	s.balanced(60*time.Second, "bridge-a", "bridge-b")
	n := s.node
	n.start()
	s.nodeReady(60 * time.Second)
	p := apiPod("web", n.name, "echo hello from web; exec sleep 3600")
	p.Spec.Containers[0].Name = "web"
	s.adm.create("pods", p)
	s.apiPodRunning("web", 90*time.Second)
	kc := func(args ...string) (string, int) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return kubectlAs(ctx, t, s.api.Kubeconfig, nil, args...)
	}
	port := func() int {
		var node corev1.Node
		ctx, cancel := s.adm.ctx()
		defer cancel()
		if err := s.adm.core.Get().Resource("nodes").Name(n.name).Do(ctx).Into(&node); err != nil {
			t.Fatal(err)
		}
		return int(node.Status.DaemonEndpoints.KubeletEndpoint.Port)
	}
	within(30*time.Second).For(t, "logs through the serving replica", func() (bool, string) {
		out, code := kc("logs", "web")
		return code == 0 && out == "hello from web\n", fmt.Sprint(code, " ", out)
	})
	before := port()
	owner := s.shardHolders()[bridge.ShardOf(n.name, replicaShards)]
	killed := time.Now()
	if owner == "bridge-a" {
		s.killBridge()
	} else {
		b.kill()
	}
	within(60*time.Second).For(t, "logs and exec through the other replica", func() (bool, string) {
		out, code := kc("logs", "web")
		if code != 0 || out != "hello from web\n" {
			return false, fmt.Sprint("logs: ", code, " ", out)
		}
		out, code = kc("exec", "web", "--", "echo", "moved")
		return code == 0 && out == "moved\n", fmt.Sprint("exec: ", code, " ", out)
	})
	t.Logf("replica %s killed; the node's kubelet API answered through the other %v later, on port %d (was %d)", owner, time.Since(killed).Round(100*time.Millisecond), port(), before)
}
