package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
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
	runDebugPod(t, s.api, s.adm, n.name)
	dev, _ := userKubeconfig(t, s.api, "dev")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	kc := debugKubectl(ctx, t, dev)

	t.Run("logs", func(t *testing.T) { testDebugLogs(t, ctx, s.adm, dev) })
	t.Run("exec", func(t *testing.T) { testDebugExec(t, ctx, dev) })
	t.Run("attach", func(t *testing.T) { testDebugAttach(t, ctx, dev, 20*time.Second) })
	t.Run("port-forward", func(t *testing.T) { testDebugPortForward(t, ctx, dev, 30*time.Second) })

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
