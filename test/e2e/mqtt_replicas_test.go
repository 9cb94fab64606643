package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/sync/bridge"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

const replicaShards = 8

// replica is an `outpost bridge` process beside the setup's own.
type replica struct {
	id, cfg, log string
	cmd          *exec.Cmd
	end          chan struct{}
}

// shareFleet restarts the setup's bridge as replica id of replicaShards
// shards.
func (s *mqttSetup) shareFleet(id string) {
	s.t.Helper()
	s.killBridge()
	b, err := os.ReadFile(s.bridgeCfg)
	if err != nil {
		s.t.Fatal(err)
	}
	cfg := string(b) + fmt.Sprintf("replicas: {shards: %d, namespace: outpost-system, identity: %s}\n", replicaShards, id)
	if err := os.WriteFile(s.bridgeCfg, []byte(cfg), 0o644); err != nil {
		s.t.Fatal(err)
	}
	s.startBridge()
}

// startReplica starts another replica, id, with the broker identity cn:
// the setup's bridge configuration with its own certificate, scratch
// directory and identity.
func (s *mqttSetup) startReplica(id, cn string) *replica {
	s.t.Helper()
	b, err := os.ReadFile(s.bridgeCfg)
	if err != nil {
		s.t.Fatal(err)
	}
	dir := s.t.TempDir()
	// The certificate as packaging/bridge/deployment.yaml names it: by
	// the replica's identity.
	cert, key := s.broker.Issue(s.t, cn)
	for from, to := range map[string]string{cert: filepath.Join(dir, id+".crt"), key: filepath.Join(dir, id+".key")} {
		b, err := os.ReadFile(from)
		if err != nil {
			s.t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o600); err != nil {
			s.t.Fatal(err)
		}
	}
	cert, key = filepath.Join(dir, "{replica}.crt"), filepath.Join(dir, "{replica}.key")
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		switch k, _, _ := strings.Cut(strings.TrimSpace(l), ":"); k {
		case "certFile":
			l = "  certFile: " + cert
		case "keyFile":
			l = "  keyFile: " + key
		case "stateDir":
			l = "stateDir: " + filepath.Join(dir, "scratch")
		case "replicas":
			l = fmt.Sprintf("replicas: {shards: %d, namespace: outpost-system, identity: %s}", replicaShards, id)
		}
		lines = append(lines, l)
	}
	r := &replica{id: id, cfg: filepath.Join(dir, "bridge.yaml"), log: filepath.Join(dir, "bridge.log")}
	if err := os.WriteFile(r.cfg, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		s.t.Fatal(err)
	}
	r.start(s.t)
	s.t.Cleanup(func() {
		r.kill()
		if s.t.Failed() {
			b, _ := os.ReadFile(r.log)
			lines := strings.Split(string(b), "\n")
			if len(lines) > 60 {
				lines = lines[len(lines)-60:]
			}
			s.t.Logf("replica %s log:\n%s", id, strings.Join(lines, "\n"))
		}
	})
	return r
}

func (r *replica) start(t testing.TB) {
	t.Helper()
	logf, err := os.OpenFile(r.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	r.cmd = exec.Command(outpostBin, "bridge", "--config", r.cfg)
	r.cmd.Stdout, r.cmd.Stderr = logf, logf
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.end = make(chan struct{})
	cmd, end := r.cmd, r.end
	go func() { cmd.Wait(); logf.Close(); close(end) }()
}

func (r *replica) kill() {
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.end
	r.cmd = nil
}

// shardHolders are the holders of the shard Leases, by shard.
func (s *mqttSetup) shardHolders() map[int]string {
	ctx, cancel := s.adm.ctx()
	defer cancel()
	var list coordv1.LeaseList
	out := map[int]string{}
	if err := s.adm.coor.Get().Namespace("outpost-system").Resource("leases").Do(ctx).Into(&list); err != nil {
		return out
	}
	for _, l := range list.Items {
		var i int
		if _, err := fmt.Sscanf(l.Name, "outpost-bridge-shard-%d", &i); err != nil || l.Spec.HolderIdentity == nil {
			continue
		}
		out[i] = *l.Spec.HolderIdentity
	}
	return out
}

// balanced waits until the shards are all held by ids, each a fair
// share (the floor or the ceiling of shards/replicas).
func (s *mqttSetup) balanced(timeout time.Duration, ids ...string) map[int]string {
	s.t.Helper()
	var h map[int]string
	lo, hi := replicaShards/len(ids), (replicaShards+len(ids)-1)/len(ids)
	within(timeout).For(s.t, fmt.Sprintf("the %d shards held by %v, %d to %d each", replicaShards, ids, lo, hi), func() (bool, string) {
		h = s.shardHolders()
		count := map[string]int{}
		for _, id := range h {
			count[id]++
		}
		total := 0
		for _, id := range ids {
			if count[id] < lo || count[id] > hi {
				return false, fmt.Sprint(h)
			}
			total += count[id]
		}
		return total == replicaShards && len(h) == replicaShards, fmt.Sprint(h)
	})
	return h
}

// nodeWatch polls every node's Lease and Ready condition until stopped,
// and keeps the worst it saw.
type nodeWatch struct {
	mu sync.Mutex
	// oldest is the oldest a Lease's renewTime was, by node.
	oldest map[string]time.Duration
	// notReady are the Ready conditions seen other than True.
	notReady []string
	// since (once set) and first: the first renewTime seen after since,
	// by node (a Lease shows only its last renewal, and the watch looks
	// more often than the node renews).
	since time.Time
	first map[string]time.Time
	stop  context.CancelFunc
	done  chan struct{}
}

// renewedSince marks t: from now on the watch notes each node's first
// Lease renewal after it.
func (w *nodeWatch) renewedSince(t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.since = t
}

// firstRenewal is node name's first Lease renewal seen after the time
// renewedSince marked, or zero.
func (w *nodeWatch) firstRenewal(name string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.first[name]
}

func (s *mqttSetup) watchNodes(names []string) *nodeWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &nodeWatch{oldest: map[string]time.Duration{}, first: map[string]time.Time{}, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			for _, name := range names {
				rctx, rcancel := s.adm.ctx()
				var l coordv1.Lease
				err := s.adm.coor.Get().Namespace("kube-node-lease").Resource("leases").Name(name).Do(rctx).Into(&l)
				var n corev1.Node
				err2 := s.adm.core.Get().Resource("nodes").Name(name).Do(rctx).Into(&n)
				rcancel()
				w.mu.Lock()
				if err == nil && l.Spec.RenewTime != nil {
					w.oldest[name] = max(w.oldest[name], time.Since(l.Spec.RenewTime.Time))
					if at := l.Spec.RenewTime.Time; !w.since.IsZero() && at.After(w.since) && w.first[name].IsZero() {
						w.first[name] = at
					}
				}
				if err2 == nil {
					for _, c := range n.Status.Conditions {
						if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
							w.notReady = append(w.notReady, name+": "+string(c.Status)+" "+c.Reason)
						}
					}
				}
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *nodeWatch) finish() (map[string]time.Duration, []string) {
	w.stop()
	<-w.done
	return w.oldest, w.notReady
}

// leaseRenewedSince waits until node name's Lease was renewed after t.
func (s *mqttSetup) leaseRenewedSince(name string, t time.Time, timeout time.Duration) time.Duration {
	s.t.Helper()
	var at time.Time
	within(timeout).For(s.t, "node "+name+"'s Lease renewed by the replica it moved to", func() (bool, string) {
		ctx, cancel := s.adm.ctx()
		defer cancel()
		var l coordv1.Lease
		if err := s.adm.coor.Get().Namespace("kube-node-lease").Resource("leases").Name(name).Do(ctx).Into(&l); err != nil || l.Spec.RenewTime == nil {
			return false, fmt.Sprint(err)
		}
		at = l.Spec.RenewTime.Time
		return at.After(t), at.String()
	})
	return at.Sub(t)
}

var (
	fleetsimOnce sync.Once
	fleetsimPath string
	fleetsimErr  error
)

// fleetsimBin builds test/fleetsim once, beside outpostBin.
func fleetsimBin(t testing.TB) string {
	t.Helper()
	fleetsimOnce.Do(func() {
		fleetsimPath = filepath.Join(filepath.Dir(outpostBin), "fleetsim")
		build := exec.Command("go", "build", "-o", fleetsimPath, "./test/fleetsim")
		build.Dir = "../.."
		out, err := build.CombinedOutput()
		if err != nil {
			fleetsimErr = fmt.Errorf("build test/fleetsim: %v: %s", err, out)
		}
	})
	if fleetsimErr != nil {
		t.Fatal(fleetsimErr)
	}
	return fleetsimPath
}

// fleetReport is test/fleetsim's report, the fields the tests read.
type fleetReport struct {
	Nodes, Pods, Published, Seen, Pending, Errors int
	MessagesPerSecond, APIWritesPerSecond         float64
	LagP50, LagP99, LagMax                        float64
	Bridges                                       []struct {
		PID                                      int
		CPU, RSSMiB, MaxRSSMiB, AnonMiB, FileMiB float64
	}
}

// fleet is a running test/fleetsim.
type fleet struct {
	cmd    *exec.Cmd
	stderr string
	out    *strings.Builder
	done   chan error
}

// startFleet runs test/fleetsim against the setup's broker and API
// server with args.
func (s *mqttSetup) startFleet(args ...string) *fleet {
	s.t.Helper()
	return startFleet(s.t, s.api, s.broker, args...)
}

// startFleet runs test/fleetsim against broker and api with args.
func startFleet(t testing.TB, api *env.APIServer, broker *env.MosquittoTLS, args ...string) *fleet {
	t.Helper()
	dir := t.TempDir()
	caCert, caKey := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if err := broker.CA().WriteCert(caCert); err != nil {
		t.Fatal(err)
	}
	if err := broker.CA().WriteKey(caKey); err != nil {
		t.Fatal(err)
	}
	f := &fleet{stderr: filepath.Join(dir, "fleetsim.log"), out: &strings.Builder{}, done: make(chan error, 1)}
	logf, err := os.Create(f.stderr)
	if err != nil {
		t.Fatal(err)
	}
	f.cmd = exec.Command(fleetsimBin(t), append([]string{"-kubeconfig", api.Kubeconfig, "-broker", broker.URL, "-ca-cert", caCert, "-ca-key", caKey}, args...)...)
	f.cmd.Stdout, f.cmd.Stderr = f.out, logf
	f.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { f.done <- f.cmd.Wait(); logf.Close() }()
	t.Cleanup(func() { f.cmd.Process.Kill() })
	return f
}

// waitLine waits until the fleet's log has a line containing sub; a
// fleet that ended before it fails the test.
func (f *fleet) waitLine(t testing.TB, sub string, timeout time.Duration) {
	t.Helper()
	within(timeout).For(t, "fleetsim says "+sub, func() (bool, string) {
		b, _ := os.ReadFile(f.stderr)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if !strings.Contains(string(b), sub) {
			select {
			case err := <-f.done:
				f.done <- err // for report
				t.Fatalf("fleetsim ended (%v) before it said %q:\n%s", err, sub, b)
			default:
			}
		}
		return strings.Contains(string(b), sub), lines[len(lines)-1]
	})
}

// report waits for the fleet to end and returns its report.
func (f *fleet) report(t testing.TB, timeout time.Duration) fleetReport {
	t.Helper()
	select {
	case err := <-f.done:
		if err != nil {
			b, _ := os.ReadFile(f.stderr)
			t.Fatalf("fleetsim: %v\n%s", err, b)
		}
	case <-time.After(timeout):
		t.Fatalf("fleetsim did not end within %v", timeout)
	}
	var r fleetReport
	if err := json.Unmarshal([]byte(f.out.String()), &r); err != nil {
		t.Fatalf("fleetsim report %q: %v", f.out.String(), err)
	}
	return r
}

// TestMQTTBridgeReplicas runs three bridge replicas over 8 shards with an
// MQTT node running pods and 50 simulated nodes (test/fleetsim: real
// MQTT clients publishing their Node status, online flag and a pod status
// a second each):
//   - the shards split 3, 3 and 2, and every node is served (Ready, its
//     Lease renewed);
//   - the replica serving the real node is killed while the fleet
//     publishes; the others take its shards and renew every moved node's
//     Lease within 15 s; every pod's last status, published during the
//     move too, reaches the API server; no container restarts, no node's
//     Lease gets older than its 40 s, no node is seen other than Ready;
//   - the killed replica started again takes a share, and no shard moves
//     between the others; a pod created then runs.
func TestMQTTBridgeReplicas(t *testing.T) {
	s := newMQTTSetupWith(t, "e2e-mqtt-replicas", mqttOptions{signed: true})
	// The shipped StatefulSet of replicas is one the API server takes.
	s.api.Kubectl(t, "apply", "--dry-run=server", "-f", "../../packaging/bridge/deployment.yaml")
	s.shareFleet("bridge-a")
	replicas := map[string]*replica{
		"bridge-b": s.startReplica("bridge-b", bridgeCN+":1"),
		"bridge-c": s.startReplica("bridge-c", bridgeCN+":2"),
	}
	ids := []string{"bridge-a", "bridge-b", "bridge-c"}
	s.balanced(60*time.Second, ids...)

	n := s.node
	n.outside()
	n.start()
	s.nodeReady(60 * time.Second)
	ctl := t.TempDir()
	s.apply(mqttWebConfig)
	s.apply(mqttWebSecret)
	s.apply(fmt.Sprintf(mqttWebPod, n.name, env.TestImage))
	s.adm.create("pods", ctlPod("ctl", n.name, ctl))
	s.apiPodRunning("web", 60*time.Second)
	s.apiPodRunning("ctl", 60*time.Second)
	before := containerIDs(t, n, "web", "ctl")

	const sims = 50
	f := s.startFleet("-nodes", fmt.Sprint(sims), "-pods", "5", "-prefix", "sim-", "-status-every", "1s", "-node-status-every", "20s",
		"-connect-spread", "2s", "-duration", "45s", "-settle", "30s")
	f.waitLine(t, "publishing statuses", 120*time.Second)
	names := []string{n.name}
	for i := range sims {
		names = append(names, fmt.Sprintf("sim-%04d", i))
	}
	served := map[string]int{}
	holders := s.shardHolders()
	for _, name := range names {
		served[holders[bridge.ShardOf(name, replicaShards)]]++
	}
	t.Logf("nodes served: %v", served)
	time.Sleep(5 * time.Second)

	// Kill the replica that serves the real node.
	owner := holders[bridge.ShardOf(n.name, replicaShards)]
	var survivors []string
	for _, id := range ids {
		if id != owner {
			survivors = append(survivors, id)
		}
	}
	w := s.watchNodes(names)
	killed := time.Now()
	w.renewedSince(killed)
	if owner == "bridge-a" {
		s.killBridge()
	} else {
		replicas[owner].kill()
	}
	// A status change on the node while its replica is gone.
	setCtl(t, ctl, "ctl", true)
	during := s.balanced(30*time.Second, survivors...)
	took := time.Since(killed)
	var moved time.Duration
	for _, name := range names {
		if holders[bridge.ShardOf(name, replicaShards)] == owner {
			// The first renewal after the kill, as the watch saw it; a
			// wait for one if it saw none yet.
			at := w.firstRenewal(name)
			if at.IsZero() {
				moved = max(moved, s.leaseRenewedSince(name, killed, 30*time.Second))
				continue
			}
			moved = max(moved, at.Sub(killed))
		}
	}
	t.Logf("replica %s killed: its shards taken by %v in %v, its %d nodes' Leases renewed in %v", owner, survivors, took.Round(time.Millisecond), served[owner], moved.Round(time.Millisecond))
	if moved > 15*time.Second {
		t.Errorf("the killed replica's nodes had their Leases renewed %v after the kill, want within 15 s", moved)
	}
	within(30*time.Second).For(t, "ctl NotReady in the API (its status sent during the move)", func() (bool, string) {
		p, err := s.adm.pod("ctl")
		if err != nil {
			return false, err.Error()
		}
		return podCondition(p, corev1.PodReady) == corev1.ConditionFalse, asJSON(p.Status)
	})
	r := f.report(t, 3*time.Minute)
	t.Logf("fleet: %d statuses published, %d seen, %d pending; lag p50 %.0f ms, p99 %.0f ms, max %.0f ms; %d errors",
		r.Published, r.Seen, r.Pending, r.LagP50, r.LagP99, r.LagMax, r.Errors)
	if r.Published == 0 || r.Pending != 0 || r.Errors != 0 {
		t.Errorf("fleet: %d statuses published, %d pods' last status never reached the API server, %d errors; want none lost", r.Published, r.Pending, r.Errors)
	}

	// The killed replica back: it takes a share, and no shard moves
	// between the others.
	if owner == "bridge-a" {
		s.startBridge()
	} else {
		replicas[owner].start(t)
	}
	after := s.balanced(60*time.Second, ids...)
	for i := range replicaShards {
		if after[i] != during[i] && after[i] != owner {
			t.Errorf("shard %d moved from %s to %s, not to the replica that came back", i, during[i], after[i])
		}
	}
	s.adm.create("pods", apiPod("after-move", n.name, "while true; do sleep 1; done"))
	s.apiPodRunning("after-move", 60*time.Second)
	// Settle a renew interval on the new owner before the last look.
	time.Sleep(3 * time.Second)
	oldest, notReady := w.finish()
	worst := time.Duration(0)
	for name, age := range oldest {
		worst = max(worst, age)
		if age >= 40*time.Second {
			t.Errorf("node %s's Lease was %v old at worst, past its 40 s", name, age.Round(time.Millisecond))
		}
	}
	t.Logf("oldest node Lease seen during the moves: %v", worst.Round(time.Millisecond))
	if len(notReady) > 0 {
		t.Errorf("nodes seen not Ready during the moves: %v", notReady)
	}
	if got := containerIDs(t, n, "web", "ctl"); asJSON(got) != asJSON(before) {
		t.Errorf("containers changed across the moves: %v -> %v", before, got)
	}
}
