package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// The outside network of a service test: a namespace playing a client
// elsewhere on the LAN, joined to the node's namespace by a veth pair.
const (
	nodeLANIP   = "192.168.77.1"
	clientLANIP = "192.168.77.2"
)

// outside creates the client namespace and the link to the node, with
// default routes both ways (a namespace with no route drops locally sent
// ClusterIP traffic before any nftables rule sees it). It returns the
// client namespace's name.
func (n *node) outside() string {
	n.t.Helper()
	client := n.netns + "-c"
	run(n.t, "ip", "netns", "add", client)
	n.t.Cleanup(func() { exec.Command("ip", "netns", "delete", client).Run() })
	in := func(ns string, args ...string) { run(n.t, append([]string{"ip", "netns", "exec", ns}, args...)...) }
	in(n.netns, "ip", "link", "add", "lan0", "type", "veth", "peer", "name", "lan0", "netns", client)
	in(n.netns, "ip", "addr", "add", nodeLANIP+"/24", "dev", "lan0")
	in(n.netns, "ip", "link", "set", "lan0", "up")
	in(n.netns, "ip", "route", "add", "default", "via", clientLANIP)
	in(client, "ip", "link", "set", "lo", "up")
	in(client, "ip", "addr", "add", clientLANIP+"/24", "dev", "lan0")
	in(client, "ip", "link", "set", "lan0", "up")
	in(client, "ip", "route", "add", "default", "via", nodeLANIP)
	return client
}

// echoIn runs the echo helper in a network namespace and returns its
// output and exit code (0 ok, 1 timeout, 2 refused, 3 other).
func echoIn(ns string, args ...string) (string, int) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, echoBin}, args...)...)
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		return err.Error(), 3
	}
	return strings.TrimSpace(string(out)), 0
}

// who asks a backend who it is: the answer is "pod-name client-ip".
func who(ns, addr string) (name, client string, code int) {
	out, code := echoIn(ns, "get", "http://"+addr+"/cgi-bin/who")
	if code != 0 {
		return "", "", code
	}
	name, client, _ = strings.Cut(strings.TrimSpace(out), " ")
	// busybox httpd writes IPv4 clients as [::ffff:a.b.c.d].
	client = strings.TrimPrefix(strings.Trim(client, "[]"), "::ffff:")
	return name, client, 0
}

// reachAll asks addr until every one of want has answered, and returns
// the clients the backends saw.
func reachAll(t *testing.T, ns, addr string, want ...string) map[string]bool {
	t.Helper()
	seen, clients := map[string]bool{}, map[string]bool{}
	var last string
	// A time, not a number of tries: a backend that just turned ready
	// comes in at its next readiness probe (up to a period, 1 s here,
	// and the proxy's sync), however fast the requests are.
	for deadline := time.Now().Add(10 * time.Second); len(seen) < len(want) && time.Now().Before(deadline); {
		name, client, code := who(ns, addr)
		if code != 0 {
			last = fmt.Sprintf("exit %d", code)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		seen[name], clients[client] = true, true
	}
	for _, w := range want {
		if !seen[w] {
			t.Fatalf("%s from %s: %s never answered (answered: %v; last error: %s)", addr, ns, w, seen, last)
		}
	}
	return clients
}

// whoScript, in a pod's `- |` command, writes the CGI script /cgi-bin/who
// that answers with $NAME and the client address httpd saw.
const whoScript = `      mkdir -p /www/cgi-bin
      printf '#!/bin/sh\necho Content-Type: text/plain\necho\necho "$NAME $REMOTE_ADDR"\n' > /www/cgi-bin/who
      chmod +x /www/cgi-bin/who
`

// askLoop, in a pod's `- |` command, asks url every 200 ms (with
// timeout(1): busybox 1.35's wget -T segfaults) and appends "ok <answer>"
// or "fail" to /out/log.
func askLoop(url string) string {
	return fmt.Sprintf(`      while true; do
        if a=$(timeout 3 wget -q -O - %s 2>&1); then echo "ok $a" >> /out/log; else echo "fail $a" >> /out/log; fi
        sleep 0.2
      done
`, url)
}

// backendPod is a busybox httpd backend whose CGI script answers with its
// name and the client address it sees, ready while /ctl/<pod name> is
// absent (a static pod's name ends with the node's).
func backendPod(name, ctl string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  labels: {app: web}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: %[2]s
    env: [{name: NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
    ports: [{name: http, containerPort: 8080}]
    command:
    - sh
    - -c
    - |
%[4]s      exec httpd -f -p 8080 -h /www
    readinessProbe:
      exec: {command: [sh, -c, 'test ! -e /ctl/$NAME']}
      periodSeconds: 1
    volumeMounts: [{name: ctl, mountPath: /ctl}]
  volumes:
  - name: ctl
    hostPath: {path: %[3]s, type: Directory}
`, name, env.TestImage, ctl, whoScript)
}

// udpPod answers UDP datagrams on port 5353 with its name.
func udpPod(name string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  labels: {app: dns}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: udp
    image: %[2]s
    env: [{name: NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
    command: [sh, -c, 'exec /echo/echo udp-serve :5353 $NAME']
    volumeMounts: [{name: echo, mountPath: /echo, readOnly: true}]
  volumes:
  - name: echo
    hostPath: {path: %[3]s, type: Directory}
`, name, env.TestImage, filepath.Dir(echoBin))
}

// clientPod asks url as askLoop does; /out/log is a file the test reads.
func clientPod(name, out, url string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %[1]s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: client
    image: %[2]s
    command:
    - sh
    - -c
    - |
%[4]s    volumeMounts: [{name: out, mountPath: /out}]
  volumes:
  - name: out
    hostPath: {path: %[3]s, type: Directory}
`, name, env.TestImage, out, askLoop(url))
}

// selfPod is a backend of the "self" Service that asks that Service itself
// every 200 ms, as clientPod does: with one endpoint, every request comes
// back to the pod that sent it (hairpin).
func selfPod(name, out string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  labels: {app: self}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: self
    image: %[2]s
    env: [{name: NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
    command:
    - sh
    - -c
    - |
%[4]s      httpd -p 8080 -h /www
%[5]s    volumeMounts: [{name: out, mountPath: /out}]
  volumes:
  - name: out
    hostPath: {path: %[3]s, type: Directory}
`, name, env.TestImage, out, whoScript, askLoop("http://10.43.0.84/cgi-bin/who"))
}

// clientLog is what a client pod wrote so far.
func clientLog(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

const standaloneServices = `apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.43.0.80
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: v1
kind: Service
metadata: {name: web-np}
spec:
  type: NodePort
  clusterIP: 10.43.0.81
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: v1
kind: Service
metadata: {name: web-local}
spec:
  type: NodePort
  clusterIP: 10.43.0.82
  externalTrafficPolicy: Local
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080, nodePort: 30082}]
---
apiVersion: v1
kind: Service
metadata: {name: web-ext}
spec:
  clusterIP: 10.43.0.85
  externalIPs: [198.51.100.80]
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web-sticky}
spec:
  clusterIP: 10.43.0.83
  sessionAffinity: ClientIP
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: dns}
spec:
  clusterIP: 10.43.0.53
  selector: {app: dns}
  ports: [{port: 53, targetPort: 5353, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: self}
spec:
  clusterIP: 10.43.0.84
  selector: {app: self}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: nobody}
spec:
  clusterIP: 10.43.0.99
  selector: {app: nobody}
  ports: [{port: 80}]
`

// TestServicesStandalone runs Services from manifests with no API server:
// endpoints come from the local pods' selectors and readiness. It checks
// a ClusterIP reached from a pod and from the node, a pod reaching
// itself through its Service (hairpin), readiness, NodePort and an
// external IP from an outside client (masqueraded, and with
// externalTrafficPolicy Local the client address kept), UDP, session affinity, a Service with
// no endpoints refused at once, and the rules across an agent restart.
func TestServicesStandalone(t *testing.T) {
	n := newNode(t, "e2e-svc")
	client := n.outside()
	ctl, out, selfOut := t.TempDir(), t.TempDir(), t.TempDir()
	webA, webB := "web-a-"+n.name, "web-b-"+n.name
	n.write("web-a.yaml", backendPod("web-a", ctl))
	n.write("web-b.yaml", backendPod("web-b", ctl))
	n.write("dns.yaml", udpPod("dns-a"))
	n.write("client.yaml", clientPod("client", out, "http://10.43.0.80/cgi-bin/who"))
	n.write("self.yaml", selfPod("self", selfOut))
	n.write("services.yaml", standaloneServices)
	n.start()
	for _, p := range []string{webA, webB, "dns-a-" + n.name, "client-" + n.name, "self-" + n.name} {
		n.waitPod(p, 60*time.Second, "running and ready", func(p *agent.PodInfo) bool { return running(p) && ready(p) })
	}

	t.Run("cluster IP from the node", func(t *testing.T) {
		reachAll(t, n.netns, "10.43.0.80", webA, webB)
	})
	t.Run("cluster IP from a pod", func(t *testing.T) {
		within(30*time.Second).For(t, "the client pod reaching both backends", func() (bool, string) {
			lines := clientLog(t, out)
			seen := map[string]bool{}
			for _, l := range lines {
				if f := strings.Fields(l); len(f) == 3 && f[0] == "ok" {
					seen[f[1]] = true
				}
			}
			return seen[webA] && seen[webB], fmt.Sprintf("%d lines, answered: %v, last: %q", len(lines), seen, lines[max(0, len(lines)-3):])
		})
	})
	t.Run("a pod reaches itself through its Service", func(t *testing.T) {
		// Without the hairpin masquerade the pod would answer itself
		// from its own address, which its client never asked.
		within(30*time.Second).For(t, "the self pod answering itself", func() (bool, string) {
			lines := clientLog(t, selfOut)
			ok := 0
			for _, l := range lines {
				if f := strings.Fields(l); len(f) == 3 && f[0] == "ok" && f[1] == "self-"+n.name {
					ok++
				}
			}
			return ok >= 3, fmt.Sprintf("%d lines, %d answered, last: %q", len(lines), ok, lines[max(0, len(lines)-3):])
		})
	})
	t.Run("node port from outside", func(t *testing.T) {
		clients := reachAll(t, client, nodeLANIP+":30080", webA, webB)
		if clients[clientLANIP] {
			t.Errorf("backends saw the client's own address %s through a Cluster-policy NodePort; want it masqueraded (saw %v)", clientLANIP, clients)
		}
	})
	t.Run("external IP from outside", func(t *testing.T) {
		// The client's default route goes through the node.
		clients := reachAll(t, client, "198.51.100.80", webA, webB)
		if clients[clientLANIP] {
			t.Errorf("backends saw the client's own address %s through a Cluster-policy external IP; want it masqueraded (saw %v)", clientLANIP, clients)
		}
	})
	t.Run("external traffic policy Local keeps the client address", func(t *testing.T) {
		clients := reachAll(t, client, nodeLANIP+":30082", webA, webB)
		if len(clients) != 1 || !clients[clientLANIP] {
			t.Errorf("backends saw clients %v; want only %s", clients, clientLANIP)
		}
	})
	t.Run("udp", func(t *testing.T) {
		var got string
		var code int
		for range 20 {
			if got, code = echoIn(n.netns, "udp", "10.43.0.53:53"); code == 0 {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if code != 0 || !strings.HasPrefix(got, "dns-a-"+n.name+" ") {
			t.Fatalf("udp 10.43.0.53:53: exit %d, %q", code, got)
		}
	})
	t.Run("session affinity", func(t *testing.T) {
		seen := map[string]int{}
		for range 12 {
			name, _, code := who(client, "10.43.0.83")
			if code != 0 {
				// The outside client has no route to cluster IPs; ask
				// from the node.
				name, _, code = who(n.netns, "10.43.0.83")
			}
			if code != 0 {
				t.Fatalf("10.43.0.83: exit %d", code)
			}
			seen[name]++
		}
		if len(seen) != 1 {
			t.Errorf("a ClientIP-affinity service answered from %v; want one backend", seen)
		}
	})
	t.Run("no endpoints refused", func(t *testing.T) {
		if out, code := echoIn(n.netns, "get", "http://10.43.0.99/"); code != 2 {
			t.Errorf("service with no endpoints: exit %d (%q); want 2, refused", code, out)
		}
	})
	t.Run("not ready backend gets no traffic", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(ctl, webB), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		n.waitPod(webB, 30*time.Second, "not ready", func(p *agent.PodInfo) bool { return !ready(p) })
		// The proxy follows within its sync interval; then only web-a
		// answers.
		time.Sleep(time.Second)
		for range 20 {
			name, _, code := who(n.netns, "10.43.0.80")
			if code != 0 || name != webA {
				t.Fatalf("with web-b not ready: %q, exit %d; want %s", name, code, webA)
			}
		}
		os.Remove(filepath.Join(ctl, webB))
		reachAll(t, n.netns, "10.43.0.80", webA, webB)
	})
	t.Run("agent restart keeps the rules", func(t *testing.T) {
		before := len(clientLog(t, out))
		n.stop()
		time.Sleep(2 * time.Second)
		n.start()
		n.waitPod(webA, 30*time.Second, "running and ready", func(p *agent.PodInfo) bool { return running(p) && ready(p) })
		time.Sleep(3 * time.Second)
		lines := clientLog(t, out)[before:]
		fails := 0
		for _, l := range lines {
			if strings.HasPrefix(l, "fail") {
				fails++
			}
		}
		if len(lines) < 10 || fails > 0 {
			t.Errorf("across an agent restart the client pod logged %d requests, %d failed; want none failed", len(lines), fails)
		}
	})
}

// TestServicesAPI runs a Service from the API server, its EndpointSlices
// written by kube-controller-manager from the pod statuses the agent
// reports: both backends answer on the allocated cluster IP; a backend
// whose readiness probe fails stops getting traffic; and with the API
// server gone (the slices now stale), a backend that becomes ready again
// gets traffic at once, since local endpoints follow the local probes.
func TestServicesAPI(t *testing.T) {
	api := env.StartAPIServer(t)
	adm := newAdmin(t, api)
	api.StartEndpointSliceController(t)
	n := newNode(t, "e2e-svcapi")
	n.connect(api)
	n.outside() // the default route that locally sent cluster IP traffic needs
	ctl := t.TempDir()
	n.start()
	for _, name := range []string{"web-a", "web-b"} {
		var p corev1.Pod
		if err := yaml.Unmarshal([]byte(backendPod(name, ctl)), &p); err != nil {
			t.Fatal(err)
		}
		no := false
		p.Namespace, p.Spec.NodeName, p.Spec.AutomountServiceAccountToken = "default", n.name, &no
		adm.create("pods", &p)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}
	adm.create("services", svc)
	ctx, cancel := adm.ctx()
	defer cancel()
	if err := adm.core.Get().Namespace("default").Resource("services").Name("web").Do(ctx).Into(svc); err != nil {
		t.Fatal(err)
	}
	vip := svc.Spec.ClusterIP
	within(90*time.Second).For(t, "two ready endpoints in the API", func() (bool, string) {
		out := api.Kubectl(t, "get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o",
			`jsonpath={range .items[*].endpoints[*]}{.addresses[0]} {.conditions.ready}{"\n"}{end}`)
		return strings.Count(out, " true") == 2, out
	})
	reachAll(t, n.netns, vip, "web-a", "web-b")

	// web-b fails its readiness probe: only web-a answers.
	if err := os.WriteFile(filepath.Join(ctl, "web-b"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	n.waitPod("web-b", 30*time.Second, "not ready", func(p *agent.PodInfo) bool { return !ready(p) })
	within(10*time.Second).For(t, "web-b out of the service", func() (bool, string) {
		for range 10 {
			if name, _, code := who(n.netns, vip); code != 0 || name != "web-a" {
				return false, fmt.Sprintf("%q, exit %d", name, code)
			}
		}
		return true, ""
	})
	within(30*time.Second).For(t, "web-b not ready in the API's slice", func() (bool, string) {
		out := api.Kubectl(t, "get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o",
			`jsonpath={range .items[*].endpoints[*]}{.targetRef.name} {.conditions.ready}{"\n"}{end}`)
		return strings.Contains(out, "web-b false"), out
	})

	// The API server goes away; web-b becomes ready again.
	api.Stop()
	os.Remove(filepath.Join(ctl, "web-b"))
	n.waitPod("web-b", 30*time.Second, "ready", ready)
	reachAll(t, n.netns, vip, "web-a", "web-b")
}
