package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	opmqtt "github.com/outpost-edge/outpost/sync/mqtt"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// mqttSetup is an MQTT node end to end: a real API server, mosquitto
// with the shipped TLS configuration and ACL, `outpost bridge` with the
// ServiceAccount and ClusterRole of packaging/bridge/rbac.yaml, and an
// agent with mqtt and no kubeconfig in a network namespace of its own,
// which reaches the broker (and only the broker) through a forwarder.
type mqttSetup struct {
	t      testing.TB
	api    *env.APIServer
	adm    *admin
	broker *env.MosquittoTLS
	node   *node
	fwd    *forwarder

	bridgeCfg string
	bridgeLog string
	bridge    *exec.Cmd
	bridgeEnd chan struct{}
	// signingKey is the bridge's signing key file, with signed.
	signingKey string
	// kubeletIP and kubeletPorts are the address and the first and last
	// port of the bridge's kubelet API, with kubelet.
	kubeletIP    string
	kubeletPorts [2]int
}

// mqttOptions change newMQTTSetupWith's setup.
type mqttOptions struct {
	// signed makes a signing key with `outpost bridge keygen`, for the
	// bridge's mqtt.signingKeyFile and the node's mqtt.trustedKeys.
	signed bool
	// kubelet has the bridge serve its nodes' kubelet API (on
	// bridgeAddress), letting in the API server's kubelet client
	// certificate.
	kubelet bool
}

// bridgeAddress gives the host an address of the test's own for the
// bridge's kubelet API, on a veth pair removed at the end: the API
// server's node proxy refuses loopback addresses ("address not
// allowed"), and a test machine may have no other address to spare (nor
// the dummy link type).
func bridgeAddress(t testing.TB) string {
	t.Helper()
	link := fmt.Sprintf("opkapi%d", os.Getpid()%100000)
	ip := fmt.Sprintf("198.18.%d.17", os.Getpid()%200+1)
	run(t, "ip", "link", "add", link, "type", "veth", "peer", "name", link+"p")
	t.Cleanup(func() { exec.Command("ip", "link", "delete", link).Run() })
	run(t, "ip", "addr", "add", ip+"/32", "dev", link)
	run(t, "ip", "link", "set", link, "up")
	run(t, "ip", "link", "set", link+"p", "up")
	return ip
}

func newMQTTSetup(t testing.TB, name string) *mqttSetup {
	t.Helper()
	return newMQTTSetupWith(t, name, mqttOptions{})
}

func newMQTTSetupWith(t testing.TB, name string, o mqttOptions) *mqttSetup {
	t.Helper()
	api := env.StartAPIServer(t)
	s := &mqttSetup{t: t, api: api, adm: newAdmin(t, api)}
	s.broker = env.StartMosquittoTLS(t, env.MosquittoOptions{})
	api.Kubectl(t, "apply", "-f", "../../packaging/bridge/rbac.yaml")
	token := strings.TrimSpace(api.Kubectl(t, "-n", "outpost-system", "create", "token", "outpost-bridge", "--duration", "2h"))
	dir := t.TempDir()
	kc := filepath.Join(dir, "bridge.kubeconfig")
	if err := env.WriteKubeconfig(kc, api.URL, api.CA.CertPEM(), "outpost-bridge", token, nil, nil); err != nil {
		t.Fatal(err)
	}
	cert, key := s.broker.Issue(t, "outpost:bridge")
	s.bridgeCfg, s.bridgeLog = filepath.Join(dir, "bridge.yaml"), filepath.Join(dir, "bridge.log")
	var signing, trusted string
	if o.signed {
		s.signingKey = filepath.Join(dir, "signing.key")
		out, err := exec.Command(outpostBin, "bridge", "keygen", s.signingKey).CombinedOutput()
		if err != nil {
			t.Fatalf("outpost bridge keygen: %v: %s", err, out)
		}
		signing = "  signingKeyFile: " + s.signingKey + "\n"
		trusted = fmt.Sprintf("  trustedKeys: [%q]\n", strings.TrimSpace(string(out)))
	}
	var kubelet string
	if o.kubelet {
		first := env.FreePort(t)
		s.kubeletPorts = [2]int{first, first + 19}
		s.kubeletIP = bridgeAddress(t)
		kubelet = fmt.Sprintf("kubeletAPI:\n  address: %s\n  ports: %d-%d\n  clientCAFile: %s\n", s.kubeletIP, first, first+19, api.ClientCAFile)
	}
	cfg := fmt.Sprintf(`kubeconfig: %s
mqtt:
  brokers: [%q]
  caFile: %s
  certFile: %s
  keyFile: %s
  keepalive: 10s
%s%sstateDir: %s
log: {level: debug}
`, kc, s.broker.URL, s.broker.CAFile, cert, key, signing, kubelet, filepath.Join(dir, "scratch"))
	if err := os.WriteFile(s.bridgeCfg, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	s.startBridge()

	s.node = newNode(t, name)
	ncert, nkey := s.broker.Issue(t, name)
	f, err := os.OpenFile(s.node.cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "mqtt:\n  brokers: [%q]\n  caFile: %s\n  certFile: %s\n  keyFile: %s\n  keepalive: 5s\n%s", s.broker.URL, s.broker.CAFile, ncert, nkey, trusted)
	f.Close()
	s.fwd = s.node.forward(s.broker.Addr)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(s.bridgeLog)
			lines := strings.Split(string(b), "\n")
			if len(lines) > 80 {
				lines = lines[len(lines)-80:]
			}
			t.Logf("bridge log:\n%s", strings.Join(lines, "\n"))
		}
	})
	return s
}

func (s *mqttSetup) startBridge() {
	s.t.Helper()
	logf, err := os.OpenFile(s.bridgeLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(outpostBin, "bridge", "--config", s.bridgeCfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	s.bridge, s.bridgeEnd = cmd, done
	s.t.Cleanup(s.killBridge)
}

func (s *mqttSetup) killBridge() {
	if s.bridge == nil {
		return
	}
	s.bridge.Process.Signal(syscall.SIGKILL)
	<-s.bridgeEnd
	s.bridge = nil
}

// nodeReady waits for the Node in the API server to be Ready, and
// returns it.
func (s *mqttSetup) nodeReady(timeout time.Duration) *corev1.Node {
	s.t.Helper()
	return s.adm.nodeReady(s.node.name, timeout)
}

// apiPodRunning waits for the pod in the API to be Running and Ready
// with a pod IP.
func (s *mqttSetup) apiPodRunning(name string, timeout time.Duration) *corev1.Pod {
	s.t.Helper()
	var p *corev1.Pod
	within(timeout).For(s.t, "pod "+name+" Running and Ready in the API", func() (bool, string) {
		var err error
		if p, err = s.adm.pod(name); err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning && podCondition(p, corev1.PodReady) == corev1.ConditionTrue && p.Status.PodIP != "", asJSON(p.Status)
	})
	return p
}

const mqttWebConfig = `apiVersion: v1
kind: ConfigMap
metadata: {name: web-config, namespace: default}
data: {greeting: hello over mqtt}
`

const mqttWebSecret = `apiVersion: v1
kind: Secret
metadata: {name: web-secret, namespace: default}
stringData: {token: s3cret}
`

// mqttWebPod reads its config map volume and secret env, and is ready
// once it wrote them to its log.
const mqttWebPod = `apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default}
spec:
  nodeName: %s
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: %s
    command: [sh, -c, 'echo "$(cat /cfg/greeting) $TOKEN" > /tmp/said; cat /tmp/said; while true; do sleep 1; done']
    env: [{name: TOKEN, valueFrom: {secretKeyRef: {name: web-secret, key: token}}}]
    volumeMounts: [{name: cfg, mountPath: /cfg}]
    readinessProbe:
      exec: {command: [test, -s, /tmp/said]}
      periodSeconds: 1
  volumes: [{name: cfg, configMap: {name: web-config}}]
`

func (s *mqttSetup) apply(manifest string) {
	s.t.Helper()
	path := filepath.Join(s.t.TempDir(), "m.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		s.t.Fatal(err)
	}
	s.api.Kubectl(s.t, "apply", "-f", path)
}

// TestMQTTNodePodsThroughBridge runs a node over MQTT alone: the bridge
// registers it from its status topic (Ready, with the node's labels), a
// pod applied with kubectl, with a config map volume, a secret env and a
// readiness probe, runs on it and shows Running and Ready with its IP in
// the API, a Service with an endpoint on it answers on its cluster IP on
// the node, and kubectl delete removes the pod from the node.
func TestMQTTNodePodsThroughBridge(t *testing.T) {
	s := newMQTTSetup(t, "e2e-mqtt")
	s.api.StartEndpointSliceController(t)
	n := s.node
	n.outside()
	n.start()
	node := s.nodeReady(60 * time.Second)
	for k, v := range map[string]string{"outpost.io/transport": "mqtt", "kubernetes.io/arch": runtime.GOARCH, "kubernetes.io/os": "linux", "kubernetes.io/hostname": n.name} {
		if node.Labels[k] != v {
			t.Errorf("node label %s = %q, want %q (labels %v)", k, node.Labels[k], v, node.Labels)
		}
	}
	// The node's seal key, made at first start, its public half in the
	// Node.
	seal, err := opmqtt.LoadSealKey(filepath.Join(n.dir, "state", "pki", opmqtt.SealKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if got := node.Annotations[opmqtt.AnnotationSealKey]; got != seal.Public() {
		t.Errorf("node annotation %s = %q, want the node's key %s", opmqtt.AnnotationSealKey, got, seal.Public())
	}

	s.apply(mqttWebConfig)
	s.apply(mqttWebSecret)
	s.apply(fmt.Sprintf(mqttWebPod, n.name, env.TestImage))
	p := s.apiPodRunning("web", 60*time.Second)
	local := n.waitPod("web", 10*time.Second, "running on the node", ready)
	if local.Status == nil || local.Status.PodIP != p.Status.PodIP {
		t.Errorf("pod IP %s in the API, %+v on the node", p.Status.PodIP, local.Status)
	}
	logs, err := n.outpost("logs", "default/web")
	if err != nil || !strings.Contains(logs, "hello over mqtt s3cret") {
		t.Errorf("the pod did not see its config map and secret: %q, %v", logs, err)
	}

	// A pod with the service account token volume the API server adds by
	// default: the bridge asks for its token and sends it (no controller
	// manager publishes kube-root-ca.crt here, so the test does).
	s.adm.create("configmaps", &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt", Namespace: "default"}, Data: map[string]string{"ca.crt": string(s.api.CA.CertPEM())}})
	sa := apiPod("with-token", n.name, "cd /var/run/secrets/kubernetes.io/serviceaccount && test -s token && grep -q CERTIFICATE ca.crt && exec sleep 100000")
	sa.Spec.AutomountServiceAccountToken = nil
	sa.Spec.RestartPolicy = corev1.RestartPolicyNever
	s.adm.create("pods", sa)
	within(60*time.Second).For(t, "with-token Running with its token", func() (bool, string) {
		p, err := s.adm.pod("with-token")
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning, asJSON(p.Status)
	})

	// A Service in the API with endpoints on the MQTT node.
	ctl := t.TempDir()
	var backend corev1.Pod
	if err := yaml.Unmarshal([]byte(backendPod("web-a", ctl)), &backend); err != nil {
		t.Fatal(err)
	}
	no := false
	backend.Namespace, backend.Spec.NodeName, backend.Spec.AutomountServiceAccountToken = "default", n.name, &no
	s.adm.create("pods", &backend)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}
	s.adm.create("services", svc)
	ctx, cancel := s.adm.ctx()
	defer cancel()
	if err := s.adm.core.Get().Namespace("default").Resource("services").Name("web").Do(ctx).Into(svc); err != nil {
		t.Fatal(err)
	}
	s.apiPodRunning("web-a", 60*time.Second)
	reachAll(t, n.netns, svc.Spec.ClusterIP, "web-a")

	// What the broker retains holds no secret value and no token: the
	// Secret and the pod's tokens went sealed to the node. The config
	// map, not a secret, is there in clear.
	s.broker.Stop(t)
	checkBrokerStore(t, s.broker, []string{
		opmqtt.DesiredTopic(n.name, opmqtt.KindSecrets, "default", "web-secret"),
		opmqtt.DesiredTopic(n.name, opmqtt.KindSecrets, "default", opmqtt.TokensSecretName("with-token")),
		"hello over mqtt",
	}, "s3cret")
	s.broker.Start(t)

	// kubectl delete: stopped on the node, gone from the API.
	s.api.Kubectl(t, "delete", "pod", "web", "--wait=false")
	within(60*time.Second).For(t, "pod web gone from the node and the API", func() (bool, string) {
		st, err := n.status()
		if err != nil {
			return false, err.Error()
		}
		if findPod(st, "web") != nil {
			return false, "still on the node"
		}
		if _, err := s.adm.pod("web"); err == nil {
			return false, "still in the API"
		}
		return true, ""
	})
	if st, _ := n.status(); st.Agent == nil || st.Agent.Link == nil || st.Agent.Link.Transport != "mqtt" || !st.Agent.Link.Connected {
		t.Errorf("outpost status link: %+v", st.Agent)
	}
}
