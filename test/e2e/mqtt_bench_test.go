package e2e

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/internal/report"
	opmqtt "github.com/outpost-edge/outpost/sync/mqtt"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// The MQTT link's benchmarks: an agent with mqtt and no kubeconfig in a
// network namespace whose only way out is a veth pair to the host, a real
// mosquitto with the shipped TLS configuration and ACL on the host side's
// address, `outpost bridge` and a real API server. What crosses the veth
// is the agent's MQTT connection and the ARP it causes, nothing else
// (IPv6 is off on the link): the host side's counters are the node's
// frames on the wire, and nftables counters in the node's namespace
// tell the connection's IP packets and the ARP apart.
//
// The node's namespace is named obench-N, and the cleanups remove only
// the pod namespaces of the pods the benchmark created: newNode's
// cleanup removes every outpost-… namespace made while its test ran,
// which breaks any e2e test or benchmark run beside it (a pod's
// namespace vanishes between its creation and its container's start).
//
// They measure the issue's targets and report them (b.ReportMetric and a
// summary line each); a missed target does not fail them, a setup that
// fails does. Each iteration is a whole scenario: run them with
// -benchtime 1x, as root (they skip without):
//
//	go test -run '^$' -bench BenchmarkMQTT -benchtime 1x -timeout 60m ./test/e2e/
//
// The environment tunes them:
//   - BENCH_MQTT_IDLE_WINDOW (4m), BENCH_MQTT_SETTLE (30s) and
//     BENCH_MQTT_PROBE (empty: no probes; exec: a readiness exec probe
//     every 10 s) and BENCH_MQTT_TOKEN_TTL (none: no service account
//     token) for BenchmarkMQTTIdleBytes;
//   - BENCH_PODS (20) for BenchmarkMQTTPodStartup;
//   - BENCH_MQTT_OUTAGE (2m) and BENCH_MQTT_FLIPS (100) for
//     BenchmarkMQTTOutageReplay;
//   - BENCH_MQTT_DECODE=1 reads the node's retained topics after the
//     idle window even when no message crossed it;
//   - BENCH_OUTPOST, BENCH_LOG as for BenchmarkKubePodStartup (both
//     the agents and the bridge run BENCH_OUTPOST);
//     BENCH_KEEP_LOG=PREFIX keeps the agent's and the bridge's logs as
//     PREFIX.agent.log and PREFIX.bridge.log.

// The issue's targets.
const (
	mqttIdleTarget           = 16 << 10 // bytes per hour, both directions
	mqttReconnectTarget      = 8 << 10  // bytes
	mqttStartupP99Target     = 1500 * time.Millisecond
	mqttStartupGapTarget     = 500 * time.Millisecond
	mqttReplayWritesTarget   = 1 // API status writes per changed pod
	mqttReplayConvergeTarget = 3 * time.Second
	mqttRSSGapTarget         = 1 << 20 // bytes of VmRSS over the API node's
)

const (
	// mqttBenchPods is the node's pods in the idle, reconnect, replay and
	// memory benchmarks.
	mqttBenchPods = 30
	// mqttBenchBridgeCN is the bridge's certificate identity, as
	// packaging/mosquitto/acl names it.
	mqttBenchBridgeCN = "outpost:bridge"
	// mqttBenchBridgeUser is the bridge's ServiceAccount
	// (packaging/bridge/rbac.yaml) as the audit log names it.
	mqttBenchBridgeUser = "system:serviceaccount:outpost-system:outpost-bridge"
	// The nftables tables the benchmarks make in the node's namespace:
	// counters of the agent's flow with the broker, and the link cut.
	mqttBenchCounters = "outpost-bench"
	mqttBenchCut      = "outpost-bench-cut"
	// mqttBenchDev is the node side of the host link (hostLink).
	mqttBenchDev = "host0"
	// mqttBenchQuiet is how long the link must carry nothing for a reconnect
	// to be over.
	mqttBenchQuiet = 2 * time.Second
)

// mqttBench is an MQTT node on a host link, its broker, bridge and API
// server.
type mqttBench struct {
	b      *testing.B
	api    *env.APIServer
	adm    *admin
	broker *env.MosquittoTLS
	node   *node
	// nodeIP is the node side's address of the host link; link is the
	// host side's interface, which the broker listens on.
	nodeIP, link string
	scrape       *http.Client

	bridgeCfg, bridgeLog string
	bridge               *exec.Cmd
	bridgeEnd            chan struct{}
}

// newMQTTBench starts the API server, the node's containerd and
// namespace with its host link, mosquitto on the host side's address,
// the bridge, and the agent with mqtt (keepalive as given, no
// kubeconfig); it returns once the Node is Ready in the API server.
func newMQTTBench(b *testing.B, name string, keepalive time.Duration) *mqttBench {
	b.Helper()
	api := env.StartAPIServer(b)
	s := &mqttBench{b: b, api: api, adm: newAdmin(b, api)}
	s.node = s.newNode(name)
	s.nodeIP = s.node.hostLink()
	host := hostSide(s.nodeIP)
	s.link = mbLinkWithAddr(b, host)
	// No IPv6 on the link: router solicitations and MLD reports are not
	// the agent's.
	run(b, "sysctl", "-qw", "net.ipv6.conf."+s.link+".disable_ipv6=1")
	run(b, "ip", "netns", "exec", s.node.netns, "sysctl", "-qw", "net.ipv6.conf."+mqttBenchDev+".disable_ipv6=1")
	s.broker = env.StartMosquittoTLS(b, env.MosquittoOptions{Host: host})
	s.setupBridge()
	s.startBridge()
	s.configureNode(keepalive)
	s.countFlow()
	s.startAgent(s.node)
	s.nodeReady(s.node.name, 90*time.Second)
	b.Cleanup(s.keepLogs)
	return s
}

// newNode makes what newNode makes for a test (a private containerd
// with the test image, a network namespace, the config), with a cleanup
// that removes only this benchmark's namespaces: the node's is named
// obench-N, not outpost-…, so that the cleanups of tests running beside
// it, which remove the outpost-… namespaces made while they ran, leave
// it alone, and its own cleanup removes only its pods' namespaces.
func (s *mqttBench) newNode(name string) *node {
	b := s.b
	ctrd := env.StartContainerd(b)
	ns := fmt.Sprintf("outpost-bench-%d", time.Now().UnixNano()%1e9)
	ctrd.ImportTestImage(b, ns)
	dir := b.TempDir()
	n := &node{t: b, name: name, dir: dir, manifests: filepath.Join(dir, "manifests"), ctrd: ctrd, ns: ns,
		netns: fmt.Sprintf("obench-%d", time.Now().UnixNano()%1e9), cfg: filepath.Join(dir, "config.yaml"),
		netnsPrefix: fmt.Sprintf("om%d-", time.Now().UnixNano()%1e9)}
	for _, d := range []string{"manifests", "images"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	run(b, "ip", "netns", "add", n.netns)
	b.Cleanup(func() {
		n.kill()
		n.removePodNetns()
		exec.Command("ip", "netns", "delete", n.netns).Run()
	})
	run(b, "ip", "netns", "exec", n.netns, "ip", "link", "set", "lo", "up")
	cfg := fmt.Sprintf(`nodeName: %s
stateDir: %s
manifestDir: %s
imageDir: %s
logDir: %s
runDir: %s
containerd:
  address: %s
  namespace: %s
  cgroupParent: %s
network:
  netnsPrefix: %s
log:
  level: %s
`, name, filepath.Join(dir, "state"), n.manifests, filepath.Join(dir, "images"), filepath.Join(dir, "logs"), filepath.Join(dir, "run"), ctrd.Address, ns, ctrd.CgroupParent, n.netnsPrefix, mbLogLevel())
	if err := os.WriteFile(n.cfg, []byte(cfg), 0o644); err != nil {
		b.Fatal(err)
	}
	n.unmountAtExit()
	return n
}

// apiNode starts an API-server node beside the MQTT one: an agent with
// the node identity's kubeconfig (through a forwarder to the API
// server's loopback address), as BenchmarkKubePodStartup runs it, and
// waits for its Node to be Ready.
func (s *mqttBench) apiNode(name string) *node {
	b := s.b
	n := s.newNode(name)
	f, err := os.OpenFile(n.cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(f, "kubeconfig: %s\n", s.api.NodeKubeconfig(b, name))
	f.Close()
	u, err := url.Parse(s.api.URL)
	if err != nil {
		b.Fatal(err)
	}
	benchForward(b, "/run/netns/"+n.netns, u.Host)
	s.startAgent(n)
	s.nodeReady(name, 90*time.Second)
	return n
}

// setupBridge writes the bridge's kubeconfig (a token of the
// ServiceAccount packaging/bridge/rbac.yaml makes), certificate and
// configuration.
func (s *mqttBench) setupBridge() {
	b := s.b
	s.api.Kubectl(b, "apply", "-f", "../../packaging/bridge/rbac.yaml")
	token := strings.TrimSpace(s.api.Kubectl(b, "-n", "outpost-system", "create", "token", "outpost-bridge", "--duration", "2h"))
	dir := b.TempDir()
	kc := filepath.Join(dir, "bridge.kubeconfig")
	if err := env.WriteKubeconfig(kc, s.api.URL, s.api.CA.CertPEM(), "outpost-bridge", token, nil, nil); err != nil {
		b.Fatal(err)
	}
	cert, key := s.broker.Issue(b, mqttBenchBridgeCN)
	s.bridgeCfg, s.bridgeLog = filepath.Join(dir, "bridge.yaml"), filepath.Join(dir, "bridge.log")
	cfg := fmt.Sprintf(`kubeconfig: %s
mqtt:
  brokers: [%q]
  caFile: %s
  certFile: %s
  keyFile: %s
stateDir: %s
log: {level: %s}
`, kc, s.broker.URL, s.broker.CAFile, cert, key, filepath.Join(dir, "scratch"), mbLogLevel())
	if err := os.WriteFile(s.bridgeCfg, []byte(cfg), 0o644); err != nil {
		b.Fatal(err)
	}
}

func mbLogLevel() string { return cmp.Or(os.Getenv("BENCH_LOG"), "info") }

func (s *mqttBench) startBridge() {
	b := s.b
	logf, err := os.OpenFile(s.bridgeLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(benchBin(), "bridge", "--config", s.bridgeCfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	s.bridge, s.bridgeEnd = cmd, done
	b.Cleanup(s.killBridge)
}

func (s *mqttBench) killBridge() {
	if s.bridge == nil {
		return
	}
	s.bridge.Process.Signal(syscall.SIGKILL)
	<-s.bridgeEnd
	s.bridge = nil
}

// configureNode adds the agent's mqtt section, and a client CA for the
// kubelet API, whose /metrics the benchmarks read from inside the
// node's namespace (on its loopback, so not on the link).
func (s *mqttBench) configureNode(keepalive time.Duration) {
	b, n := s.b, s.node
	data, err := os.ReadFile(n.cfg)
	if err != nil {
		b.Fatal(err)
	}
	cfg := string(data)
	cert, key := s.broker.Issue(b, n.name)
	ca, err := env.NewCA("outpost-bench-metrics")
	if err != nil {
		b.Fatal(err)
	}
	caFile := filepath.Join(n.dir, "metrics-ca.crt")
	if err := ca.WriteCert(caFile); err != nil {
		b.Fatal(err)
	}
	cfg += fmt.Sprintf("mqtt:\n  brokers: [%q]\n  caFile: %s\n  certFile: %s\n  keyFile: %s\n  keepalive: %ds\nserver:\n  clientCAFile: %s\n",
		s.broker.URL, s.broker.CAFile, cert, key, int(keepalive/time.Second), caFile)
	if err := os.WriteFile(n.cfg, []byte(cfg), 0o644); err != nil {
		b.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(pkix.Name{CommonName: "outpost-bench", Organization: []string{"system:masters"}}, nil, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		b.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		b.Fatal(err)
	}
	nsPath := "/run/netns/" + n.netns
	s.scrape = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext:       func(_ context.Context, _, addr string) (net.Conn, error) { return dialInNetns(nsPath, addr) },
		TLSClientConfig:   &tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true}, // the agent's self-signed serving certificate
		DisableKeepAlives: true,
	}}
}

// startAgent runs the agent (benchBin) in n's namespace, as node.start
// does, so that n's cleanup stops it.
func (s *mqttBench) startAgent(n *node) {
	b := s.b
	logf, err := os.OpenFile(filepath.Join(n.dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("nsenter", "--net=/run/netns/"+n.netns, benchBin(), "agent", "--config", n.cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	n.agent, n.agentLog, n.done = cmd, logf, done
}

// keepLogs copies the logs for BENCH_KEEP_LOG, and shows their ends when
// the benchmark failed.
func (s *mqttBench) keepLogs() {
	agentLog := filepath.Join(s.node.dir, "agent.log")
	if keep := os.Getenv("BENCH_KEEP_LOG"); keep != "" {
		a, _ := os.ReadFile(agentLog)
		br, _ := os.ReadFile(s.bridgeLog)
		if err := errors.Join(os.WriteFile(keep+".agent.log", a, 0o644), os.WriteFile(keep+".bridge.log", br, 0o644)); err != nil {
			s.b.Errorf("keep the logs: %v", err)
		}
	}
	if s.b.Failed() {
		s.b.Logf("agent log (last lines):\n%s\nbridge log (last lines):\n%s", mbLogTail(agentLog, 60), mbLogTail(s.bridgeLog, 40))
	}
}

func mbLogTail(path string, n int) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// agentPID is the outpost agent process's PID: nsenter's own when it
// execs in place, else its child's.
func (s *mqttBench) agentPID(n *node) int {
	b := s.b
	isAgent := func(pid int) bool {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(data), "\x00")
		return err == nil && len(args) > 1 && args[0] == benchBin() && args[1] == "agent" && slices.Contains(args, n.cfg)
	}
	pid := n.agent.Process.Pid
	if isAgent(pid) {
		return pid
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		b.Fatalf("children of nsenter %d: %v", pid, err)
	}
	for _, f := range strings.Fields(string(data)) {
		if c, err := strconv.Atoi(f); err == nil && isAgent(c) {
			return c
		}
	}
	b.Fatalf("no outpost agent process for %s: pid %d is not it, nor any of its children %q", n.cfg, pid, data)
	return 0
}

// mbLinkWithAddr returns the name of the host's interface that has ip.
func mbLinkWithAddr(t testing.TB, ip string) string {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range ifs {
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.String() == ip {
				return i.Name
			}
		}
	}
	t.Fatalf("no interface of the host has %s", ip)
	return ""
}

// nodeReady waits for Node name to be Ready in the API server.
func (s *mqttBench) nodeReady(name string, timeout time.Duration) {
	s.b.Helper()
	s.adm.nodeReady(name, timeout)
}

// nodeObject returns Node name as the API server holds it.
func (s *mqttBench) nodeObject(name string) *corev1.Node {
	var n corev1.Node
	ctx, cancel := s.adm.ctx()
	defer cancel()
	if err := s.adm.core.Get().Resource("nodes").Name(name).Do(ctx).Into(&n); err != nil {
		s.b.Fatalf("get node %s: %v", name, err)
	}
	return &n
}

// createPods creates the pods mk makes for prefix-00 to prefix-(n-1) and
// returns their names.
func (s *mqttBench) createPods(prefix string, n int, mk func(name string) *corev1.Pod) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%02d", prefix, i)
		if err := s.createPod(s.b.Context(), mk(names[i])); err != nil {
			s.b.Fatal(err)
		}
	}
	return names
}

// createPod creates p in the API server and notes its UID for the
// cleanup.
func (s *mqttBench) createPod(ctx context.Context, p *corev1.Pod) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.adm.core.Post().Namespace("default").Resource("pods").Body(p).Do(ctx).Error(); err != nil {
		return fmt.Errorf("create pod %s: %w", p.Name, err)
	}
	return nil
}

// podsOn returns the API's pods bound to node, by name.
func (s *mqttBench) podsOn(node string) (map[string]*corev1.Pod, error) {
	var list corev1.PodList
	ctx, cancel := s.adm.ctx()
	defer cancel()
	sel := fields.OneTermEqualSelector("spec.nodeName", node).String()
	if err := s.adm.core.Get().Resource("pods").VersionedParams(&metav1.ListOptions{FieldSelector: sel}, metav1.ParameterCodec).Do(ctx).Into(&list); err != nil {
		return nil, err
	}
	out := make(map[string]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

// waitPods waits until every pod of names on node holds ok in the API.
func (s *mqttBench) waitPods(node string, names []string, timeout time.Duration, what string, ok func(*corev1.Pod) bool) {
	within(timeout).For(s.b, fmt.Sprintf("%d pods %s in the API", len(names), what), func() (bool, string) {
		pods, err := s.podsOn(node)
		if err != nil {
			return false, err.Error()
		}
		var not []string
		for _, name := range names {
			switch p := pods[name]; {
			case p == nil:
				not = append(not, name+" (not in the API)")
			case !ok(p):
				not = append(not, fmt.Sprintf("%s (%s, ready %s)", name, p.Status.Phase, podCondition(p, corev1.PodReady)))
			}
		}
		return len(not) == 0, fmt.Sprintf("not yet: %v", not)
	})
}

func mbRunningReady(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodRunning && podCondition(p, corev1.PodReady) == corev1.ConditionTrue
}

// mbLinkCount is what crossed the host link: the host side's counters
// (frames, Ethernet headers included: rx came from the node, tx went to
// it) and the nftables counters of the agent's TCP flow with the broker
// in the node's namespace (IP packets: IP, TCP and TLS).
type mbLinkCount struct {
	rx, tx, rxPkts, txPkts   uint64
	in, out, inPkts, outPkts uint64
	// arp are the ARP packets the node sent and received on the link
	// (nftables' arp family; its byte counts are not the packets' 28
	// bytes, so they are not used).
	arp uint64
}

func (c mbLinkCount) sub(o mbLinkCount) mbLinkCount {
	return mbLinkCount{
		c.rx - o.rx, c.tx - o.tx, c.rxPkts - o.rxPkts, c.txPkts - o.txPkts,
		c.in - o.in, c.out - o.out, c.inPkts - o.inPkts, c.outPkts - o.outPkts,
		c.arp - o.arp,
	}
}

// wire is both directions' bytes at the interface.
func (c mbLinkCount) wire() uint64 { return c.rx + c.tx }

// flow is both directions' bytes of the MQTT connection(s), IP up.
func (c mbLinkCount) flow() uint64 { return c.in + c.out }

func (c mbLinkCount) pkts() uint64 { return c.rxPkts + c.txPkts }

// countFlow makes the nftables counters of the agent's flow with the
// broker, in the node's namespace.
func (s *mqttBench) countFlow() {
	host, port, _ := net.SplitHostPort(s.broker.Addr)
	s.nft(fmt.Sprintf(`table inet %[1]s {
	counter mqtt-in { }
	counter mqtt-out { }
	chain input {
		type filter hook input priority -400; policy accept;
		iifname %[2]q ip saddr %[3]s tcp sport %[4]s counter name "mqtt-in"
	}
	chain output {
		type filter hook output priority -400; policy accept;
		oifname %[2]q ip daddr %[3]s tcp dport %[4]s counter name "mqtt-out"
	}
}
table arp %[1]s {
	counter arp-in { }
	counter arp-out { }
	chain input {
		type filter hook input priority 0; policy accept;
		iifname %[2]q counter name "arp-in"
	}
	chain output {
		type filter hook output priority 0; policy accept;
		oifname %[2]q counter name "arp-out"
	}
}
`, mqttBenchCounters, mqttBenchDev, host, port))
	s.b.Cleanup(func() {
		s.nftQuiet("delete table inet " + mqttBenchCounters)
		s.nftQuiet("delete table arp " + mqttBenchCounters)
	})
}

// nft runs an nft script in the node's namespace.
func (s *mqttBench) nft(script string) {
	s.b.Helper()
	cmd := exec.Command("nsenter", "--net=/run/netns/"+s.node.netns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		s.b.Fatalf("nft in %s: %v\n%s\n%s", s.node.netns, err, out, script)
	}
}

// nftQuiet runs one nft command in the node's namespace, for cleanups.
func (s *mqttBench) nftQuiet(command string) {
	exec.Command("nsenter", append([]string{"--net=/run/netns/" + s.node.netns, "nft"}, strings.Fields(command)...)...).Run()
}

// linkStats reads the host side's counters (cheap: sysfs only).
func (s *mqttBench) linkStats() mbLinkCount {
	read := func(name string) uint64 {
		data, err := os.ReadFile(filepath.Join("/sys/class/net", s.link, "statistics", name))
		if err != nil {
			s.b.Fatal(err)
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
		if err != nil {
			s.b.Fatalf("%s of %s: %v", name, s.link, err)
		}
		return v
	}
	return mbLinkCount{rx: read("rx_bytes"), tx: read("tx_bytes"), rxPkts: read("rx_packets"), txPkts: read("tx_packets")}
}

// count reads the host side's counters and the flow's.
func (s *mqttBench) count() mbLinkCount {
	c := s.linkStats()
	for _, family := range []string{"inet", "arp"} {
		out, err := exec.Command("nsenter", "--net=/run/netns/"+s.node.netns, "nft", "-j", "list", "counters", "table", family, mqttBenchCounters).CombinedOutput()
		if err != nil {
			tables, _ := exec.Command("nsenter", "--net=/run/netns/"+s.node.netns, "nft", "list", "tables").CombinedOutput()
			s.b.Fatalf("nft list counters in %s: %v\n%s\ntables there:\n%s", s.node.netns, err, out, tables)
		}
		var doc struct {
			Nftables []struct {
				Counter *struct {
					Name           string
					Packets, Bytes uint64
				} `json:"counter"`
			} `json:"nftables"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			s.b.Fatalf("nft list counters: %v\n%s", err, out)
		}
		for _, e := range doc.Nftables {
			switch {
			case e.Counter == nil:
			case e.Counter.Name == "mqtt-in":
				c.in, c.inPkts = e.Counter.Bytes, e.Counter.Packets
			case e.Counter.Name == "mqtt-out":
				c.out, c.outPkts = e.Counter.Bytes, e.Counter.Packets
			case e.Counter.Name == "arp-in", e.Counter.Name == "arp-out":
				c.arp += e.Counter.Packets
			}
		}
	}
	return c
}

// cut drops everything on the node's side of the link, both ways, as a
// pulled cable would: the agent's packets leave its stack and vanish.
func (s *mqttBench) cut() {
	s.nft(fmt.Sprintf(`table netdev %[1]s {
	chain ingress {
		type filter hook ingress device %[2]q priority -500; policy drop;
	}
	chain egress {
		type filter hook egress device %[2]q priority -500; policy drop;
	}
}
`, mqttBenchCut, mqttBenchDev))
	s.b.Cleanup(func() { s.nftQuiet("delete table netdev " + mqttBenchCut) })
}

// restore undoes cut.
func (s *mqttBench) restore() { s.nft("delete table netdev " + mqttBenchCut + "\n") }

// metrics reads the agent's /metrics on its kubelet API, from inside the
// node's namespace, keyed by name{label=value,…} with sorted labels.
func (s *mqttBench) metrics() map[string]float64 {
	s.b.Helper()
	resp, err := s.scrape.Get("https://127.0.0.1:10250/metrics")
	if err != nil {
		s.b.Fatalf("agent /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.b.Fatalf("agent /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		s.b.Fatalf("agent /metrics: %v", err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			slices.Sort(labels)
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
			out[name+"{"+strings.Join(labels, ",")+"}"] = v
		}
	}
	return out
}

// mbMsgs is the MQTT messages between two scrapes, by "direction/kind",
// and their topic and payload bytes.
func mbMsgs(before, after map[string]float64) (msgs, bytes map[string]float64) {
	msgs, bytes = map[string]float64{}, map[string]float64{}
	for k, v := range after {
		name, labels, _ := strings.Cut(strings.TrimSuffix(k, "}"), "{")
		var into map[string]float64
		switch name {
		case "outpost_mqtt_messages_total":
			into = msgs
		case "outpost_mqtt_message_bytes_total":
			into = bytes
		default:
			continue
		}
		var dir, kind string
		for _, l := range strings.Split(labels, ",") {
			if d, ok := strings.CutPrefix(l, "direction="); ok {
				dir = d
			} else if k, ok := strings.CutPrefix(l, "kind="); ok {
				kind = k
			}
		}
		if d := v - before[k]; d != 0 {
			into[dir+"/"+kind] = d
		}
	}
	return msgs, bytes
}

func mbMsgTotal(msgs map[string]float64, dir string) float64 {
	var n float64
	for k, v := range msgs {
		if strings.HasPrefix(k, dir+"/") {
			n += v
		}
	}
	return n
}

func mbShowMsgs(msgs, bytes map[string]float64) string {
	if len(msgs) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(msgs)) {
		parts = append(parts, fmt.Sprintf("%s %.0f (%.0f B of topic and payload)", k, msgs[k], bytes[k]))
	}
	return strings.Join(parts, ", ")
}

func mbWireCounter(m map[string]float64) (in, out float64) {
	return m["outpost_mqtt_wire_bytes_total{direction=in}"], m["outpost_mqtt_wire_bytes_total{direction=out}"]
}

// link returns the agent's link state from `outpost status` (over its
// local socket, not the link).
func (s *mqttBench) agentLink() (*report.Link, error) {
	st, err := s.node.status()
	if err != nil {
		return nil, err
	}
	if st.Agent == nil || st.Agent.Link == nil {
		return nil, fmt.Errorf("no link in the status: %s", asJSON(st.Agent))
	}
	return st.Agent.Link, nil
}

// mbLoop runs the scenario b.N times (once with -benchtime 1x)
// and reports the mean of each figure.
func mbLoop(b *testing.B, scenario func(iter int) map[string]float64) {
	env.RequireRoot(b)
	if benchBin() == "" {
		b.Fatal("outpost binary not built (TestMain builds it as root)")
	}
	start := time.Now()
	b.Cleanup(func() {
		b.Logf("%s took %v, setup and cleanup included", b.Name(), time.Since(start).Round(time.Second))
	})
	b.StopTimer()
	metrics := map[string]float64{}
	for i := range b.N {
		for k, v := range scenario(i) {
			metrics[k] += v / float64(b.N)
		}
	}
	for k, v := range metrics {
		b.ReportMetric(v, k)
	}
}

// mbEnvDuration reads a duration from the environment.
func mbEnvDuration(b *testing.B, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		b.Fatalf("%s=%q: want a duration such as 4m", name, v)
	}
	return d
}

// mbEnvInt reads a positive number from the environment.
func mbEnvInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a number, at least 1", name, v)
	}
	return n
}

// mbVerdict says whether a figure meets its target.
func mbVerdict(ok bool) string {
	if ok {
		return "meets"
	}
	return "MISSES"
}

func mbKiB(v float64) float64 { return v / 1024 }

// mbSigned shows d with its sign.
func mbSigned(d time.Duration) string {
	if d >= 0 {
		return "+" + d.String()
	}
	return d.String()
}

func mbSecs(d time.Duration) float64 { return d.Seconds() }

// mbSleepPod is a pod that sleeps, with probe as its readiness probe.
func mbSleepPod(name, node string, probe *corev1.Probe) *corev1.Pod {
	p := apiPod(name, node, "exec sleep 36000")
	p.Spec.Containers[0].ReadinessProbe = probe
	return p
}

// BenchmarkMQTTIdleBytes: the bytes on the wire of an idle MQTT node, 30
// pods running, the default keepalive of 60 s, counted at the host side
// of the node's only link over BENCH_MQTT_IDLE_WINDOW (4 minutes) after
// the pods are Running in the API and BENCH_MQTT_SETTLE (30 s) more,
// and extrapolated to an hour. The pods sleep, with no probes
// (BENCH_MQTT_PROBE=exec gives each a readiness exec probe every 10 s;
// BENCH_MQTT_TOKEN_TTL=10m a projected service account token of that
// lifetime, which the bridge renews). It reports the MQTT connection's
// bytes at the IP layer (nftables in the node's namespace: IP, TCP and
// TLS) and the interface's frames (Ethernet headers and ARP included),
// the agent's own count of MQTT and TLS bytes and its messages by kind
// (its /metrics). Messages in the window are decoded
// afterwards: the bridge is stopped and a client with its identity reads
// the node's topics for a while (BENCH_MQTT_DECODE=1 does it without
// messages too), and what changed between two messages of a topic is
// shown.
func BenchmarkMQTTIdleBytes(b *testing.B) {
	mbLoop(b, func(iter int) map[string]float64 {
		window := mbEnvDuration(b, "BENCH_MQTT_IDLE_WINDOW", 4*time.Minute)
		settle := mbEnvDuration(b, "BENCH_MQTT_SETTLE", 30*time.Second)
		var probe *corev1.Probe
		podSays := "sleeping, no probes"
		switch p := os.Getenv("BENCH_MQTT_PROBE"); p {
		case "":
		case "exec":
			probe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}, PeriodSeconds: 10}
			podSays = "sleeping, a readiness exec probe every 10 s"
		default:
			b.Fatalf("BENCH_MQTT_PROBE=%q: want empty or exec", p)
		}
		var tokenTTL time.Duration
		if os.Getenv("BENCH_MQTT_TOKEN_TTL") != "" {
			tokenTTL = mbEnvDuration(b, "BENCH_MQTT_TOKEN_TTL", 0)
			podSays += fmt.Sprintf(", a projected service account token of %v", tokenTTL)
		}
		const keepalive = 60 * time.Second
		s := newMQTTBench(b, fmt.Sprintf("bench-mqtt-idle-%d", iter), keepalive)
		names := s.createPods("idle", mqttBenchPods, func(name string) *corev1.Pod {
			p := mbSleepPod(name, s.node.name, probe)
			if tokenTTL > 0 {
				mbProjectToken(p, tokenTTL)
			}
			return p
		})
		s.waitPods(s.node.name, names, 3*time.Minute, "Running and Ready", mbRunningReady)
		time.Sleep(settle)

		node0 := s.nodeObject(s.node.name)
		c0, m0 := s.count(), s.metrics()
		t0 := time.Now()
		b.StartTimer()
		time.Sleep(window)
		b.StopTimer()
		c1, m1 := s.count(), s.metrics()
		took := time.Since(t0)
		node1 := s.nodeObject(s.node.name)

		d := c1.sub(c0)
		perHour := func(v float64) float64 { return v * float64(time.Hour) / float64(took) }
		msgs, msgBytes := mbMsgs(m0, m1)
		in0, out0 := mbWireCounter(m0)
		in1, out1 := mbWireCounter(m1)
		tlsBytes := in1 - in0 + out1 - out0
		reconnects := m1["outpost_mqtt_connects_total{}"] - m0["outpost_mqtt_connects_total{}"]
		frameH, ipH := perHour(float64(d.wire())), perHour(float64(d.flow()))
		flowPkts := d.inPkts + d.outPkts
		// Frames that are neither the flow's nor ARP: anything else that
		// crossed the link (none, with IPv6 off).
		arpFrameBytes := 42 * d.arp // 28 bytes of ARP, 14 of Ethernet header
		otherFrames := int64(d.pkts()) - int64(flowPkts) - int64(d.arp)
		otherBytes := int64(d.wire()) - int64(d.flow()) - 14*int64(flowPkts) - int64(arpFrameBytes)
		b.Logf("idle MQTT node, %d pods (%s), keepalive %v, over %v: the MQTT connection at the IP layer (IP, TCP, TLS, as nftables counts it) %.1f KiB/h, both ways (target ≤ %d KiB/h: %s, %.2f× the target); "+
			"the interface's frames %.1f KiB/h (%s, %.2f×): the flow's %d packets (%d B out, %d B in, %d B of Ethernet headers), %d ARP frames of %d B (%.1f KiB/h: neighbour probes, both sides, about each keepalive), %d other frames of %d B; "+
			"MQTT and TLS as the agent counts them %.1f KiB/h; messages in the window: out %.0f, in %.0f: %s; reconnects %.0f",
			mqttBenchPods, podSays, keepalive, took.Round(time.Second),
			mbKiB(ipH), mqttIdleTarget>>10, mbVerdict(ipH <= mqttIdleTarget), ipH/mqttIdleTarget,
			mbKiB(frameH), mbVerdict(frameH <= mqttIdleTarget), frameH/mqttIdleTarget,
			flowPkts, d.out, d.in, 14*flowPkts, d.arp, arpFrameBytes, mbKiB(perHour(float64(arpFrameBytes))), otherFrames, otherBytes,
			mbKiB(perHour(tlsBytes)), mbMsgTotal(msgs, "out"), mbMsgTotal(msgs, "in"), mbShowMsgs(msgs, msgBytes), reconnects)
		if reconnects > 0 {
			b.Logf("the agent reconnected %.0f times in the window: the figure is not an idle link's", reconnects)
		}
		startMsgs, startBytes := mbMsgs(nil, m0)
		b.Logf("before the window, since the link was made (the agent's start, its Node, its %d pods' start and the settling): %.1f KiB at the IP layer, %.1f KiB of frames; messages: %s",
			mqttBenchPods, mbKiB(float64(c0.flow())), mbKiB(float64(c0.wire())), mbShowMsgs(startMsgs, startBytes))
		if diff := mbDiff(mbNodeFacts(node0), mbNodeFacts(node1)); len(diff) > 0 {
			b.Logf("the Node in the API changed in the window (heartbeat times aside):\n  %s", strings.Join(diff, "\n  "))
		} else {
			b.Logf("the Node in the API did not change in the window (heartbeat times aside)")
		}
		if n := mbMsgTotal(msgs, "out") + mbMsgTotal(msgs, "in"); n > 0 || os.Getenv("BENCH_MQTT_DECODE") != "" {
			wait := 20 * time.Second
			if n > 0 {
				wait = min(max(2*took/time.Duration(n)+5*time.Second, wait), 3*time.Minute)
			}
			s.decode(wait)
		}
		return map[string]float64{
			"ip-KiB/h":         mbKiB(ipH),
			"frames-KiB/h":     mbKiB(frameH),
			"target-KiB/h":     mqttIdleTarget >> 10,
			"ip-of-target":     ipH / mqttIdleTarget,
			"frames-of-target": frameH / mqttIdleTarget,
			"mqtt+tls-KiB/h":   mbKiB(perHour(tlsBytes)),
			"frames/h":         perHour(float64(d.pkts())),
			"arp-frames/h":     perHour(float64(d.arp)),
			"arp-KiB/h":        mbKiB(perHour(float64(arpFrameBytes))),
			"msgs-out/h":       perHour(mbMsgTotal(msgs, "out")),
			"msgs-in/h":        perHour(mbMsgTotal(msgs, "in")),
			"reconnects":       reconnects,
			"window-s":         took.Seconds(),
			"idle-pods":        mqttBenchPods,
			"keepalive-s":      keepalive.Seconds(),
			"ip-B/keepalive":   float64(d.flow()) * float64(keepalive) / float64(took),
		}
	})
}

// mbProjectToken gives p a projected service account token of ttl (the
// bridge requests it and renews it at 80 % of ttl, as kubelet would).
func mbProjectToken(p *corev1.Pod, ttl time.Duration) {
	secs := int64(ttl / time.Second)
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: &secs}}},
	}}})
	p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "token", MountPath: "/var/run/secrets/tokens"})
}

// mbNodeFacts is what the agent publishes of its Node, as the API
// server holds it: labels and status without the heartbeat times.
func mbNodeFacts(n *corev1.Node) any {
	st := n.Status.DeepCopy()
	for i := range st.Conditions {
		st.Conditions[i].LastHeartbeatTime = metav1.Time{}
	}
	return map[string]any{"labels": n.Labels, "status": st}
}

// mbDiff lists the leaves that differ between a and b, as JSON paths
// with the old and the new value.
func mbDiff(a, b any) []string {
	fa, fb := map[string]string{}, map[string]string{}
	mbFlatten(a, fa)
	mbFlatten(b, fb)
	var out []string
	for _, k := range slices.Sorted(maps.Keys(fa)) {
		if fb[k] != fa[k] {
			out = append(out, fmt.Sprintf("%s: %s → %s", k, mbClip(fa[k]), mbClip(cmp.Or(fb[k], "(none)"))))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(fb)) {
		if _, ok := fa[k]; !ok {
			out = append(out, fmt.Sprintf("%s: (none) → %s", k, mbClip(fb[k])))
		}
	}
	return out
}

func mbClip(s string) string {
	if len(s) > 160 {
		return s[:160] + "…"
	}
	return s
}

func mbFlatten(v any, out map[string]string) {
	data, err := json.Marshal(v)
	if err != nil {
		out[""] = err.Error()
		return
	}
	var generic any
	json.Unmarshal(data, &generic)
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(prefix+"."+k, e)
			}
		case []any:
			for i, e := range x {
				walk(fmt.Sprintf("%s[%d]", prefix, i), e)
			}
		default:
			s, _ := json.Marshal(x)
			out[prefix] = string(s)
		}
	}
	walk("", generic)
}

// decode stops the bridge and reads the node's topics for wait as the
// bridge's identity: the retained messages first, then what the agent
// publishes live, each decoded, with what changed since the topic's
// previous message. It ends the bridge's part in the benchmark.
func (s *mqttBench) decode(wait time.Duration) {
	b := s.b
	s.killBridge()
	type msg struct {
		at       time.Time
		topic    string
		retained bool
		payload  []byte
	}
	var mu sync.Mutex
	var got []msg
	opts := paho.NewClientOptions().AddBroker(s.broker.URL).SetClientID(mqttBenchBridgeCN).
		SetProtocolVersion(4).SetCleanSession(true).SetAutoReconnect(false).SetConnectRetry(false).
		SetConnectTimeout(10 * time.Second).SetTLSConfig(s.broker.TLSConfig(b, mqttBenchBridgeCN)).
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) {
			mu.Lock()
			got = append(got, msg{time.Now(), m.Topic(), m.Retained(), slices.Clone(m.Payload())})
			mu.Unlock()
		})
	c := paho.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
		b.Fatalf("connect to the broker as %s to decode: %v", mqttBenchBridgeCN, tok.Error())
	}
	defer c.Disconnect(100)
	filters := map[string]byte{opmqtt.Prefix + "nodes/" + s.node.name + "/#": 1, opmqtt.Prefix + "cluster/#": 1}
	if tok := c.SubscribeMultiple(filters, nil); !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
		b.Fatalf("subscribe to decode: %v", tok.Error())
	}
	start := time.Now()
	time.Sleep(wait)
	mu.Lock()
	msgs := slices.Clone(got)
	mu.Unlock()
	last := map[string][]byte{}
	retained, live := 0, 0
	var lines []string
	type sizes struct{ n, bytes, largest int }
	held := map[string]*sizes{}
	for _, m := range msgs {
		prev, had := last[m.topic]
		last[m.topic] = m.payload
		if m.retained {
			retained++
			kind := "other"
			if t, err := opmqtt.ParseTopic(m.topic); err == nil {
				switch {
				case t.Index:
					kind = "index " + t.String()
				case t.Kind != "":
					kind = t.Kind
				case t.Status != "":
					kind = "status-" + t.Status
				case t.Online:
					kind = "online"
				}
			}
			z := held[kind]
			if z == nil {
				z = &sizes{}
				held[kind] = z
			}
			z.n++
			z.bytes += len(m.topic) + len(m.payload)
			z.largest = max(z.largest, len(m.payload))
			continue
		}
		live++
		line := fmt.Sprintf("+%v %s: %d B", m.at.Sub(start).Round(100*time.Millisecond), m.topic, len(m.payload))
		d, err := opmqtt.Decode(m.payload)
		switch {
		case err != nil:
			line += fmt.Sprintf(" (does not decode: %v)", err)
		case d.Envelope != nil:
			line += fmt.Sprintf(", %s generation %d, body %d B", d.Envelope.Kind, d.Envelope.Generation, d.Envelope.BodyBytes)
		case d.Online != "":
			line += ", online " + d.Online
		}
		if had {
			if p, err := opmqtt.Decode(prev); err == nil && d.Object != nil {
				if diff := mbDiff(p.Object, d.Object); len(diff) > 0 {
					line += "; changed since the previous one:\n      " + strings.Join(diff, "\n      ")
				} else {
					line += "; the object is the same as the previous one's"
				}
			}
		}
		lines = append(lines, line)
	}
	var kinds []string
	for _, k := range slices.Sorted(maps.Keys(held)) {
		z := held[k]
		kinds = append(kinds, fmt.Sprintf("%s: %d, %d B of topic and payload, the largest payload %d B", k, z.n, z.bytes, z.largest))
	}
	b.Logf("read the node's topics for %v as %s (the bridge stopped): %d retained (%s), %d live (the bridge's own publishing stopped with it):\n  %s",
		wait.Round(time.Second), mqttBenchBridgeCN, retained, strings.Join(kinds, "; "), live, strings.Join(lines, "\n  "))
}

// BenchmarkMQTTReconnectBytes: the bytes of a reconnect after an outage
// in which nothing changed. The node has 30 pods and a keepalive of 5 s;
// the link is cut (everything dropped at the node side of the veth, both
// ways, with nftables) until the agent says it lost the broker and three
// keepalives passed, then restored. It reports the bytes, both ways, of
// the MQTT connections at the IP layer (nftables in the node's
// namespace) and of the interface's frames (the host side), from the
// restore until the agent is connected again, has read the indexes, and
// the link carried nothing for 2 s: the TLS handshake, CONNECT,
// SUBSCRIBE, the online flag and the retained indexes, and whatever the
// old connection's teardown sends. Beside it, it measures TLS handshakes
// with the broker from the host: Go's default, the agent's (without the
// post-quantum key share), and both resumed from a session cache (as
// the agent's reconnects are).
func BenchmarkMQTTReconnectBytes(b *testing.B) {
	mbLoop(b, func(iter int) map[string]float64 {
		const keepalive = 5 * time.Second
		s := newMQTTBench(b, fmt.Sprintf("bench-mqtt-reconnect-%d", iter), keepalive)
		names := s.createPods("rc", mqttBenchPods, func(name string) *corev1.Pod { return mbSleepPod(name, s.node.name, nil) })
		s.waitPods(s.node.name, names, 3*time.Minute, "Running and Ready", mbRunningReady)
		time.Sleep(3 * keepalive) // every status sent, a few keepalives

		tCut := time.Now()
		s.cut()
		within(3*keepalive+30*time.Second).For(b, "the agent's link down after the cut", func() (bool, string) {
			l, err := s.agentLink()
			if err != nil {
				return false, err.Error()
			}
			return !l.Connected, asJSON(l)
		})
		tDrop := time.Now()
		if rest := 3*keepalive - time.Since(tCut); rest > 0 {
			time.Sleep(rest)
		}
		m0 := s.metrics()
		c0 := s.count()
		tRestore := time.Now()
		s.restore()
		b.StartTimer()

		last, lastChange := s.linkStats(), tRestore
		var connected time.Time
		indexes := false
		nextCheck := time.Now()
		deadline := tRestore.Add(3 * time.Minute)
		for {
			time.Sleep(20 * time.Millisecond)
			now := time.Now()
			if st := s.linkStats(); st != last {
				last, lastChange = st, now
			}
			if !now.Before(deadline) {
				b.Fatalf("the agent not connected and quiet within 3m of the restore (connected at %v, indexes read %v)", connected, indexes)
			}
			if now.Before(nextCheck) {
				continue
			}
			nextCheck = now.Add(250 * time.Millisecond)
			if connected.IsZero() {
				if l, err := s.agentLink(); err == nil && l.Connected && l.Since.After(tRestore) {
					connected = l.Since
				}
				continue
			}
			if !indexes {
				msgs, _ := mbMsgs(m0, s.metrics())
				indexes = msgs["in/index"] >= 1
				continue
			}
			if now.Sub(lastChange) >= mqttBenchQuiet {
				break
			}
		}
		b.StopTimer()
		c1, m1 := s.count(), s.metrics()
		if c1.rx != last.rx || c1.tx != last.tx {
			b.Logf("the link carried %d B more after the quiet %v (a keepalive?); not counted", c1.wire()-last.wire(), mqttBenchQuiet)
		}
		d := last.sub(c0)
		flow := c1.sub(c0)
		msgs, msgBytes := mbMsgs(m0, m1)
		in0, out0 := mbWireCounter(m0)
		in1, out1 := mbWireCounter(m1)
		connects := m1["outpost_mqtt_connects_total{}"] - m0["outpost_mqtt_connects_total{}"]
		hs := s.handshakes()
		b.Logf("TLS handshakes with the broker, client certificate included, in bytes of TLS records (no TCP/IP): %s; the agent offers X25519 and P-256 and resumes from its session cache",
			mbShowHandshakes(hs))
		b.Logf("reconnect after a %v outage (the agent noticed after %v), %d pods, keepalive %v: the MQTT connections at the IP layer (IP, TCP, TLS) %d B, both ways (%.2f KiB; target ≤ %d KiB: %s, %.2f× the target: %d B out, %d B in, %d packets); "+
			"the interface's frames %d B (%s, %.2f×: from the node %d B in %d frames, to it %d B in %d frames; ARP %d frames); MQTT and TLS as the agent counts them %.0f B out, %.0f B in; "+
			"connected %v after the restore, quiet (nothing for %v) %v after it; connects %.0f; messages: %s",
			tRestore.Sub(tCut).Round(100*time.Millisecond), tDrop.Sub(tCut).Round(100*time.Millisecond), mqttBenchPods, keepalive,
			flow.flow(), mbKiB(float64(flow.flow())), mqttReconnectTarget>>10, mbVerdict(flow.flow() <= mqttReconnectTarget), float64(flow.flow())/mqttReconnectTarget,
			flow.out, flow.in, flow.inPkts+flow.outPkts,
			d.wire(), mbVerdict(d.wire() <= mqttReconnectTarget), float64(d.wire())/mqttReconnectTarget,
			d.rx, d.rxPkts, d.tx, d.txPkts, flow.arp, out1-out0, in1-in0,
			connected.Sub(tRestore).Round(10*time.Millisecond), mqttBenchQuiet, lastChange.Sub(tRestore).Round(10*time.Millisecond),
			connects, mbShowMsgs(msgs, msgBytes))
		return map[string]float64{
			"frames-B":               float64(d.wire()),
			"target-B":               mqttReconnectTarget,
			"ip-of-target":           float64(flow.flow()) / mqttReconnectTarget,
			"frames-of-target":       float64(d.wire()) / mqttReconnectTarget,
			"ip-B":                   float64(flow.flow()),
			"mqtt+tls-B":             in1 - in0 + out1 - out0,
			"frames":                 float64(d.pkts()),
			"connected-s":            mbSecs(connected.Sub(tRestore)),
			"quiet-s":                mbSecs(lastChange.Sub(tRestore)),
			"noticed-s":              mbSecs(tDrop.Sub(tCut)),
			"connects":               connects,
			"msgs-in":                mbMsgTotal(msgs, "in"),
			"msgs-out":               mbMsgTotal(msgs, "out"),
			"keepalive-s":            keepalive.Seconds(),
			"outage-s":               mbSecs(tRestore.Sub(tCut)),
			"tls-full-B":             float64(hs[0].full),
			"tls-resumed-B":          float64(hs[0].resumed),
			"tls-full-no-mlkem-B":    float64(hs[1].full),
			"tls-resumed-no-mlkem-B": float64(hs[1].resumed),
		}
	})
}

// mbCountConn counts a connection's bytes.
type mbCountConn struct {
	net.Conn
	in, out int
}

func (c *mbCountConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in += n
	return n, err
}

func (c *mbCountConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.out += n
	return n, err
}

// mbHandshake is the bytes of TLS handshakes with the broker.
type mbHandshake struct {
	what          string
	full, resumed int
	didResume     bool
	negotiated    string
}

// handshakes measures TLS handshakes with the broker as a node makes
// them, with a client certificate, in bytes of TLS records both ways
// (no TCP/IP): with Go's default configuration, as the agent's, and
// without the post-quantum key share Go's ClientHello carries by default
// (X25519MLKEM768, 1,216 bytes, of no use with a TLS 1.2 broker); each
// full, and resumed from the session the first left in a session cache
// (which the agent does not keep). It dials from the host, so not over
// the node's link.
func (s *mqttBench) handshakes() []mbHandshake {
	shake := func(cfg *tls.Config) (int, tls.ConnectionState) {
		raw, err := net.DialTimeout("tcp", s.broker.Addr, 5*time.Second)
		if err != nil {
			s.b.Fatalf("dial the broker: %v", err)
		}
		defer raw.Close()
		cc := &mbCountConn{Conn: raw}
		tc := tls.Client(cc, cfg)
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err != nil {
			s.b.Fatalf("TLS handshake with the broker: %v", err)
		}
		// A TLS 1.3 server sends its tickets after the handshake; the
		// read waits for them (the broker sends nothing else before a
		// CONNECT).
		tc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		tc.Read(make([]byte, 1))
		return cc.in + cc.out, tc.ConnectionState()
	}
	var out []mbHandshake
	for _, v := range []struct {
		what   string
		curves []tls.CurveID
	}{{"Go's defaults", nil}, {"curves X25519, P-256 only (the agent's)", []tls.CurveID{tls.X25519, tls.CurveP256}}} {
		cfg := s.broker.TLSConfig(s.b, "bench-tls-probe")
		cfg.CurvePreferences = v.curves
		cfg.ClientSessionCache = tls.NewLRUClientSessionCache(1)
		h := mbHandshake{what: v.what}
		var st tls.ConnectionState
		h.full, st = shake(cfg)
		h.negotiated = tls.VersionName(st.Version) + " " + tls.CipherSuiteName(st.CipherSuite)
		h.resumed, st = shake(cfg)
		h.didResume = st.DidResume
		out = append(out, h)
	}
	return out
}

func mbShowHandshakes(hs []mbHandshake) string {
	var parts []string
	for _, h := range hs {
		parts = append(parts, fmt.Sprintf("%s: %d B full, %d B resumed from a session cache (resumed: %v)", h.what, h.full, h.resumed, h.didResume))
	}
	return fmt.Sprintf("%s (%s)", strings.Join(parts, "; "), hs[0].negotiated)
}

// BenchmarkMQTTPodStartup: pod created in the API → Running in the API,
// one pod at a time, BENCH_PODS (20) on an MQTT node (through the
// broker and the bridge) and as many on an API-server node (an agent
// with the node's kubeconfig, as BenchmarkKubePodStartup runs it) in the
// same run, against the same API server, alternating. A watch started
// before notes each Running; the time runs from the create request's
// answer. It reports p50, p99 and the slowest of each, and the
// differences.
func BenchmarkMQTTPodStartup(b *testing.B) {
	mbLoop(b, func(iter int) map[string]float64 {
		pods := mbEnvInt(b, "BENCH_PODS", 20)
		s := newMQTTBench(b, fmt.Sprintf("bench-mqtt-start-%d", iter), 60*time.Second)
		kn := s.apiNode(fmt.Sprintf("bench-api-start-%d", iter))
		ctx := b.Context()

		var list corev1.PodList
		if err := s.adm.core.Get().Namespace("default").Resource("pods").Do(ctx).Into(&list); err != nil {
			b.Fatalf("list pods: %v", err)
		}
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		w, err := s.adm.core.Get().Namespace("default").Resource("pods").VersionedParams(&metav1.ListOptions{
			ResourceVersion: list.ResourceVersion, Watch: true,
		}, metav1.ParameterCodec).Watch(wctx)
		if err != nil {
			b.Fatalf("watch pods: %v", err)
		}
		defer w.Stop()
		var mu sync.Mutex
		runningAt := map[string]chan time.Time{}
		await := func(name string) chan time.Time {
			mu.Lock()
			defer mu.Unlock()
			ch := make(chan time.Time, 1)
			runningAt[name] = ch
			return ch
		}
		go func() {
			for ev := range w.ResultChan() {
				p, ok := ev.Object.(*corev1.Pod)
				if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) || p.Status.Phase != corev1.PodRunning {
					continue
				}
				now := time.Now()
				mu.Lock()
				if ch := runningAt[p.Name]; ch != nil {
					ch <- now
					delete(runningAt, p.Name)
				}
				mu.Unlock()
			}
		}()

		type transport struct {
			what, node, prefix string
			times              []time.Duration
		}
		ts := []*transport{{what: "mqtt", node: s.node.name, prefix: "mq"}, {what: "api", node: kn.name, prefix: "kb"}}
		var order strings.Builder
		busy0, total0 := benchHostCPU(b)
		b.StartTimer()
		for i := range pods {
			for j := range ts {
				t := ts[(i+j)%2] // alternate which goes first
				name := fmt.Sprintf("%s-%02d", t.prefix, i)
				ch := await(name)
				err := s.createPod(ctx, apiPod(name, t.node, "exec sleep 36000"))
				answered := time.Now()
				if err != nil {
					b.Fatal(err)
				}
				select {
				case at := <-ch:
					t.times = append(t.times, at.Sub(answered))
					fmt.Fprintf(&order, " %s %v", name, at.Sub(answered).Round(time.Millisecond))
				case <-time.After(60 * time.Second):
					b.Fatalf("pod %s not Running in the API within 60s of its create", name)
				}
			}
		}
		b.StopTimer()
		busy1, total1 := benchHostCPU(b)
		out := map[string]float64{"host-cpu-busy-%": 100 * float64(busy1-busy0) / float64(total1-total0)}
		stats := map[string][3]time.Duration{}
		for _, t := range ts {
			sorted := slices.Clone(t.times)
			slices.Sort(sorted)
			st := [3]time.Duration{benchPercentile(sorted, 50), benchPercentile(sorted, 99), sorted[len(sorted)-1]}
			stats[t.what] = st
			out[t.what+"-p50-ms"] = float64(st[0].Milliseconds())
			out[t.what+"-p99-ms"] = float64(st[1].Milliseconds())
			out[t.what+"-max-ms"] = float64(st[2].Milliseconds())
		}
		mq, kb := stats["mqtt"], stats["api"]
		gap := mq[1] - kb[1]
		out["p99-gap-ms"] = float64(gap.Milliseconds())
		out["p50-gap-ms"] = float64((mq[0] - kb[0]).Milliseconds())
		out["p99-ratio"] = float64(mq[1]) / float64(kb[1])
		out["p50-ratio"] = float64(mq[0]) / float64(kb[0])
		out["pods-each"] = float64(pods)
		b.Logf("pod startup, one at a time, %d pods on each node, create answered → Running in the API: MQTT p50 %v p99 %v max %v (p99 target ≤ %v: %s); "+
			"API node p50 %v p99 %v max %v; MQTT minus API: p50 %s, p99 %s (target ≤ %v: %s); MQTT/API: p50 %.2f×, p99 %.2f×",
			pods, mq[0].Round(time.Millisecond), mq[1].Round(time.Millisecond), mq[2].Round(time.Millisecond), mqttStartupP99Target, mbVerdict(mq[1] <= mqttStartupP99Target),
			kb[0].Round(time.Millisecond), kb[1].Round(time.Millisecond), kb[2].Round(time.Millisecond),
			mbSigned((mq[0] - kb[0]).Round(time.Millisecond)), mbSigned(gap.Round(time.Millisecond)), mqttStartupGapTarget, mbVerdict(gap <= mqttStartupGapTarget),
			out["p50-ratio"], out["p99-ratio"])
		b.Logf("in creation order:%s; the host's CPU was %.0f%% busy meanwhile", order.String(), out["host-cpu-busy-%"])
		return out
	})
}

// mbFlipPod serves the ctl directory (a hostPath) with busybox httpd, and
// is ready while the file named after it is there: its readiness probe,
// an HTTP GET of that file every second, fails at the first 404. (An
// HTTP probe rather than exec: 30 runc execs a second would be the
// benchmark's load.)
func mbFlipPod(name, node, ctl string) *corev1.Pod {
	p := apiPod(name, node, "exec httpd -f -p 8080 -h /ctl")
	p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
	p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/" + name, Port: intstr.FromInt32(8080)}},
		PeriodSeconds: 1, FailureThreshold: 1, SuccessThreshold: 1, TimeoutSeconds: 1,
	}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "ctl", MountPath: "/ctl"}}
	dir := corev1.HostPathDirectory
	p.Spec.Volumes = []corev1.Volume{{Name: "ctl", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: ctl, Type: &dir}}}}
	return p
}

// mbStatusWrites counts, per pod, the status writes of the bridge's
// identity in events.
func mbStatusWrites(events []env.AuditEvent) map[string]int {
	out := map[string]int{}
	for _, e := range events {
		if e.User.Username == mqttBenchBridgeUser && e.ObjectRef.Resource == "pods" && e.ObjectRef.Subresource == "status" && (e.Verb == "patch" || e.Verb == "update") {
			out[e.ObjectRef.Name]++
		}
	}
	return out
}

// mbLastLogTime is the time of the last line of the slog text log at path
// that has msg, or zero.
func mbLastLogTime(path, msg string) time.Time {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}
	}
	defer f.Close()
	var at time.Time
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `msg="`+msg+`"`) {
			continue
		}
		v, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			at = t
		}
	}
	return at
}

// BenchmarkMQTTOutageReplay: the broker is stopped (cleanly, so its
// retained messages and sessions persist) for BENCH_MQTT_OUTAGE (2
// minutes) while the readiness of the node's 30 pods flips
// BENCH_MQTT_FLIPS (100) times in all, spread over the pods and the
// outage. Once the agent shows every pod's final readiness, the broker is
// started again. It reports the time from the broker accepting
// connections again until the API shows every pod's final readiness, and
// the status writes the bridge made per pod meanwhile (audit log).
func BenchmarkMQTTOutageReplay(b *testing.B) {
	mbLoop(b, func(iter int) map[string]float64 {
		outage := mbEnvDuration(b, "BENCH_MQTT_OUTAGE", 2*time.Minute)
		flips := mbEnvInt(b, "BENCH_MQTT_FLIPS", 100)
		const settleFlips = 15 * time.Second // after the last flip, for the probes
		if outage < settleFlips+10*time.Second {
			b.Fatalf("BENCH_MQTT_OUTAGE=%v: want at least %v", outage, settleFlips+10*time.Second)
		}
		s := newMQTTBench(b, fmt.Sprintf("bench-mqtt-replay-%d", iter), 60*time.Second)
		ctl := b.TempDir()
		names := make([]string, mqttBenchPods)
		final := map[string]bool{}
		for i := range names {
			names[i] = fmt.Sprintf("flip-%02d", i)
			if err := os.WriteFile(filepath.Join(ctl, names[i]), nil, 0o644); err != nil {
				b.Fatal(err)
			}
			final[names[i]] = true
		}
		for _, name := range names {
			if err := s.createPod(b.Context(), mbFlipPod(name, s.node.name, ctl)); err != nil {
				b.Fatal(err)
			}
		}
		s.waitPods(s.node.name, names, 3*time.Minute, "Running and Ready", mbRunningReady)
		time.Sleep(5 * time.Second)

		tStop := time.Now()
		s.broker.Stop(b)
		// The flips: pod k*7 mod 30 at the k-th (7 and 30 are coprime, so
		// each pod's flips are far apart), evenly over the outage but its
		// first 5 s and its last settleFlips.
		gap := (outage - 5*time.Second - settleFlips) / time.Duration(flips)
		flipsOf := map[string]int{}
		for k := range flips {
			time.Sleep(time.Until(tStop.Add(5*time.Second + time.Duration(k)*gap)))
			name := names[(k*7)%len(names)]
			path := filepath.Join(ctl, name)
			var err error
			if final[name] {
				err = os.Remove(path)
			} else {
				err = os.WriteFile(path, nil, 0o644)
			}
			if err != nil {
				b.Fatal(err)
			}
			final[name] = !final[name]
			flipsOf[name]++
		}
		// The agent shows the final readiness of every pod before the
		// broker returns: what is measured is the link, not the probes.
		within(settleFlips+30*time.Second).For(b, "every pod's final readiness on the agent", func() (bool, string) {
			st, err := s.node.status()
			if err != nil || st.From != "agent" {
				return false, fmt.Sprint(err)
			}
			var wrong []string
			for _, name := range names {
				p := findPod(st, name)
				if p == nil || p.Status == nil || !p.Synced || ready(p) != final[name] {
					wrong = append(wrong, name)
				}
			}
			return len(wrong) == 0, fmt.Sprintf("not yet: %v", wrong)
		})
		st, err := s.node.status()
		if err != nil {
			b.Fatalf("outpost status: %v", err)
		}
		backlog := st.JournalBacklog
		time.Sleep(time.Until(tStop.Add(outage)))
		apiBefore, err := s.podsOn(s.node.name)
		if err != nil {
			b.Fatal(err)
		}
		stale := 0
		for _, name := range names {
			if (podCondition(apiBefore[name], corev1.PodReady) == corev1.ConditionTrue) != final[name] {
				stale++
			}
		}
		writes0 := mbStatusWrites(s.api.AuditEvents(b))

		tStart := time.Now()
		s.broker.Start(b)
		tUp := time.Now()
		b.StartTimer()
		var converged time.Time
		within(5*time.Minute).For(b, "every pod's final readiness in the API", func() (bool, string) {
			pods, err := s.podsOn(s.node.name)
			if err != nil {
				return false, err.Error()
			}
			var wrong []string
			for _, name := range names {
				p := pods[name]
				if p == nil || p.Status.Phase != corev1.PodRunning || (podCondition(p, corev1.PodReady) == corev1.ConditionTrue) != final[name] {
					wrong = append(wrong, name)
				}
			}
			converged = time.Now()
			return len(wrong) == 0, fmt.Sprintf("not yet: %v", wrong)
		})
		b.StopTimer()
		time.Sleep(5 * time.Second) // late writes count too
		writes1 := mbStatusWrites(s.api.AuditEvents(b))
		var agentBack time.Duration = -1
		if l, err := s.agentLink(); err == nil && l.Connected && l.Since.After(tStart) {
			agentBack = l.Since.Sub(tUp)
		}
		var bridgeBack time.Duration = -1
		if at := mbLastLogTime(s.bridgeLog, "mqtt broker connected"); at.After(tStart) {
			bridgeBack = at.Sub(tUp)
		}
		maxWrites, total, over := 0, 0, 0
		var perPod []string
		for _, name := range names {
			n := writes1[name] - writes0[name]
			total += n
			maxWrites = max(maxWrites, n)
			if n > mqttReplayWritesTarget {
				over++
			}
			perPod = append(perPod, fmt.Sprintf("%s %d flips %d writes", name, flipsOf[name], n))
		}
		conv := converged.Sub(tUp)
		changed := 0
		for _, name := range names {
			if flipsOf[name] > 0 {
				changed++
			}
		}
		b.Logf("outage replay: broker stopped %v, %d readiness flips over %d pods (%d of them changed status; %d end unready); the agent's journal held %d statuses, %d pods stale in the API before the broker returned; "+
			"broker back → the API shows every pod's final readiness in %v (target ≤ %v: %s, %.1f× the target); the agent reconnected %v after the broker was back and the API converged %v after that; the bridge had read the broker's indexes and subscribed anew %v after the broker was back (its persistent session had delivered the queued statuses before); "+
			"API status writes by the bridge: %d for %d changed pods, at most %d for one pod (target ≤ %d: %s), %d pods over",
			outage, flips, len(names), changed, mbCountFalse(final), backlog, stale,
			conv.Round(10*time.Millisecond), mqttReplayConvergeTarget, mbVerdict(conv <= mqttReplayConvergeTarget), float64(conv)/float64(mqttReplayConvergeTarget),
			agentBack.Round(10*time.Millisecond), (conv - agentBack).Round(10*time.Millisecond), bridgeBack.Round(10*time.Millisecond),
			total, changed, maxWrites, mqttReplayWritesTarget, mbVerdict(maxWrites <= mqttReplayWritesTarget), over)
		b.Logf("per pod: %s", strings.Join(perPod, ", "))
		return map[string]float64{
			"converge-s":         conv.Seconds(),
			"converge-target-s":  mqttReplayConvergeTarget.Seconds(),
			"converge-of-target": float64(conv) / float64(mqttReplayConvergeTarget),
			"max-writes/pod":     float64(maxWrites),
			"writes/changed-pod": float64(total) / float64(max(changed, 1)),
			"pods-over-1-write":  float64(over),
			"after-agent-s":      (conv - agentBack).Seconds(),
			"agent-back-s":       agentBack.Seconds(),
			"bridge-ready-s":     bridgeBack.Seconds(),
			"journal-backlog":    float64(backlog),
			"flips":              float64(flips),
			"outage-s":           outage.Seconds(),
			"broker-start-s":     tUp.Sub(tStart).Seconds(),
		}
	})
}

func mbCountFalse(m map[string]bool) int {
	n := 0
	for _, v := range m {
		if !v {
			n++
		}
	}
	return n
}

// BenchmarkMQTTAgentRSS: the agent's memory on an MQTT node and on an
// API-server node, each with the same 30 sleeping pods (created at once),
// after 20 s of steady state with the pods Running in the API and both
// links up: VmRSS and RssAnon of each agent process (the same binary,
// the same log level), and the differences.
func BenchmarkMQTTAgentRSS(b *testing.B) {
	mbLoop(b, func(iter int) map[string]float64 {
		s := newMQTTBench(b, fmt.Sprintf("bench-mqtt-rss-%d", iter), 60*time.Second)
		kn := s.apiNode(fmt.Sprintf("bench-api-rss-%d", iter))
		mq := s.createPods("mq", mqttBenchPods, func(name string) *corev1.Pod { return mbSleepPod(name, s.node.name, nil) })
		kb := s.createPods("kb", mqttBenchPods, func(name string) *corev1.Pod { return mbSleepPod(name, kn.name, nil) })
		s.waitPods(s.node.name, mq, 3*time.Minute, "Running and Ready on the MQTT node", mbRunningReady)
		s.waitPods(kn.name, kb, 3*time.Minute, "Running and Ready on the API node", mbRunningReady)
		time.Sleep(startupSteady)
		for _, c := range []struct {
			what   string
			status func() (agent.Status, error)
		}{{"MQTT", s.node.status}, {"API", kn.status}} {
			st, err := c.status()
			if err != nil {
				b.Fatalf("%s node: outpost status: %v", c.what, err)
			}
			if st.Agent == nil || st.Agent.Link == nil || !st.Agent.Link.Connected {
				b.Fatalf("%s node: link not up after the steady state: %s", c.what, asJSON(st.Agent))
			}
			n := 0
			for i := range st.Pods {
				if st.Pods[i].Status != nil && running(&st.Pods[i]) {
					n++
				}
			}
			if n != mqttBenchPods {
				b.Fatalf("%s node: %d pods running, want %d", c.what, n, mqttBenchPods)
			}
		}
		mpid, kpid := s.agentPID(s.node), s.agentPID(kn)
		mm := benchProcStatus(b, mpid, "VmRSS", "RssAnon", "RssFile")
		km := benchProcStatus(b, kpid, "VmRSS", "RssAnon", "RssFile")
		mib := func(kb int64) float64 { return float64(kb) / 1024 }
		gap := (mm["VmRSS"] - km["VmRSS"]) << 10
		anonGap := (mm["RssAnon"] - km["RssAnon"]) << 10
		b.Logf("agent memory with %d pods, %v of steady state (%s): MQTT node VmRSS %.1f MiB (RssAnon %.1f, RssFile %.1f); API node VmRSS %.1f MiB (RssAnon %.1f, RssFile %.1f); "+
			"MQTT minus API: VmRSS %+.2f MiB (target ≤ +%d MiB: %s), RssAnon %+.2f MiB; MQTT/API VmRSS %.2f×",
			mqttBenchPods, startupSteady, benchBin(),
			mib(mm["VmRSS"]), mib(mm["RssAnon"]), mib(mm["RssFile"]), mib(km["VmRSS"]), mib(km["RssAnon"]), mib(km["RssFile"]),
			float64(gap)/(1<<20), mqttRSSGapTarget>>20, mbVerdict(gap <= mqttRSSGapTarget), float64(anonGap)/(1<<20), float64(mm["VmRSS"])/float64(km["VmRSS"]))
		b.Logf("MQTT agent pid %d file-backed: %s; API agent pid %d: %s", mpid, benchFileRss(b, mpid), kpid, benchFileRss(b, kpid))
		return map[string]float64{
			"mqtt-VmRSS-MiB":   mib(mm["VmRSS"]),
			"mqtt-RssAnon-MiB": mib(mm["RssAnon"]),
			"api-VmRSS-MiB":    mib(km["VmRSS"]),
			"api-RssAnon-MiB":  mib(km["RssAnon"]),
			"VmRSS-gap-MiB":    float64(gap) / (1 << 20),
			"RssAnon-gap-MiB":  float64(anonGap) / (1 << 20),
			"VmRSS-ratio":      float64(mm["VmRSS"]) / float64(km["VmRSS"]),
			"target-gap-MiB":   mqttRSSGapTarget >> 20,
		}
	})
}
