package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/sync/bridge"
	opmqtt "github.com/outpost-edge/outpost/sync/mqtt"
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

func (r *replica) start(t *testing.T) {
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

// simNode is a node simulated by a paho client of its own identity: it
// publishes a Ready Node status and its online flag, with the Last Will
// false, as the agent does, and runs nothing.
func simNode(t *testing.T, s *mqttSetup, name string) {
	t.Helper()
	p := connectPeer(t, s.broker, name, func(o *paho.ClientOptions) {
		o.SetWill(opmqtt.OnlineTopic(name), opmqtt.OnlineFalse, 1, true)
	})
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name, "outpost.io/simulated": "true"}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "simulated",
		}}},
	}
	body, err := node.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	e := opmqtt.Envelope{Kind: "Node", Generation: uint64(time.Now().UnixMilli()), Encoding: opmqtt.EncodingProtobuf, Issued: time.Now(), Body: body}
	p.publish(t, opmqtt.NodeStatusTopic(name), true, string(e.Marshal()))
	p.publish(t, opmqtt.OnlineTopic(name), true, opmqtt.OnlineTrue)
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

// balanced waits until the shards are held, share each, by ids.
func (s *mqttSetup) balanced(timeout time.Duration, ids ...string) map[int]string {
	s.t.Helper()
	var h map[int]string
	waitFor(s.t, timeout, fmt.Sprintf("the %d shards held by %v, an equal share each", replicaShards, ids), func() (bool, string) {
		h = s.shardHolders()
		count := map[string]int{}
		for _, id := range h {
			count[id]++
		}
		for _, id := range ids {
			if count[id] != replicaShards/len(ids) {
				return false, fmt.Sprint(h)
			}
		}
		return len(h) == replicaShards, fmt.Sprint(h)
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
	stop     context.CancelFunc
	done     chan struct{}
}

func (s *mqttSetup) watchNodes(names []string) *nodeWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &nodeWatch{oldest: map[string]time.Duration{}, stop: cancel, done: make(chan struct{})}
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
	waitFor(s.t, timeout, "node "+name+"'s Lease renewed by the replica it moved to", func() (bool, string) {
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

// TestMQTTBridgeReplicas runs two bridge replicas over 8 shards with an
// MQTT node running pods and six simulated nodes (paho clients that
// publish a Ready status and their online flag):
//   - the shards split 4 and 4, and every node is served (Ready, its
//     Lease renewed);
//   - the replica serving the real node is killed; the other takes its
//     shards and renews every node's Lease within 15 s; a pod's status
//     change on the node during the move reaches the API server; no
//     container restarts, no node's Lease gets older than its 40 s, no
//     node is seen other than Ready;
//   - the killed replica started again takes back exactly its share (4
//     shards change hands, no more), and a pod created then runs.
func TestMQTTBridgeReplicas(t *testing.T) {
	s := newMQTTSetupWith(t, "e2e-mqtt-replicas", mqttOptions{signed: true})
	// The shipped StatefulSet of replicas is one the API server takes.
	s.api.Kubectl(t, "apply", "--dry-run=server", "-f", "../../packaging/bridge/deployment.yaml")
	s.shareFleet("bridge-a")
	b := s.startReplica("bridge-b", bridgeCN+":1")
	s.balanced(60*time.Second, "bridge-a", "bridge-b")

	n := s.node
	n.outside()
	n.start()
	s.nodeReady(60 * time.Second)
	names := []string{n.name}
	for i := range 6 {
		name := fmt.Sprintf("sim-%d", i)
		simNode(t, s, name)
		names = append(names, name)
	}
	for _, name := range names {
		waitFor(t, 60*time.Second, "node "+name+" registered with a Lease", func() (bool, string) {
			ctx, cancel := s.adm.ctx()
			defer cancel()
			var l coordv1.Lease
			err := s.adm.coor.Get().Namespace("kube-node-lease").Resource("leases").Name(name).Do(ctx).Into(&l)
			return err == nil, fmt.Sprint(err)
		})
	}
	ctl := t.TempDir()
	s.apply(mqttWebConfig)
	s.apply(mqttWebSecret)
	s.apply(fmt.Sprintf(mqttWebPod, n.name, env.TestImage))
	s.adm.create("pods", ctlPod("ctl", n.name, ctl))
	s.apiPodRunning("web", 60*time.Second)
	s.apiPodRunning("ctl", 60*time.Second)
	before := containerIDs(t, n, "web", "ctl")
	served := map[string]int{}
	for _, name := range names {
		served[fmt.Sprint(s.shardHolders()[bridge.ShardOf(name, replicaShards)])]++
	}
	t.Logf("nodes served: %v", served)

	// Kill the replica that serves the real node.
	holders := s.shardHolders()
	owner := holders[bridge.ShardOf(n.name, replicaShards)]
	survivor := "bridge-a"
	w := s.watchNodes(names)
	killed := time.Now()
	if owner == "bridge-a" {
		s.killBridge()
		survivor = "bridge-b"
	} else {
		b.kill()
	}
	// A status change on the node while its replica is gone.
	setCtl(t, ctl, "ctl", true)
	s.balanced(30*time.Second, survivor)
	took := time.Since(killed)
	var moved time.Duration
	for _, name := range names {
		if holders[bridge.ShardOf(name, replicaShards)] == owner {
			moved = max(moved, s.leaseRenewedSince(name, killed, 30*time.Second))
		}
	}
	t.Logf("replica %s killed: its shards taken by %s in %v, its nodes' Leases renewed in %v", owner, survivor, took.Round(time.Millisecond), moved.Round(time.Millisecond))
	if moved > 15*time.Second {
		t.Errorf("the killed replica's nodes had their Leases renewed %v after the kill, want within 15 s", moved)
	}
	waitFor(t, 30*time.Second, "ctl NotReady in the API (its status sent during the move)", func() (bool, string) {
		p, err := s.adm.pod("ctl")
		if err != nil {
			return false, err.Error()
		}
		return podCondition(p, corev1.PodReady) == corev1.ConditionFalse, asJSON(p.Status)
	})

	// The killed replica back: it takes its share, and only that moves.
	if owner == "bridge-a" {
		s.startBridge()
	} else {
		b.start(t)
	}
	after := s.balanced(60*time.Second, "bridge-a", "bridge-b")
	changed := 0
	for i := range replicaShards {
		if after[i] != survivor {
			changed++
		}
	}
	if changed != replicaShards/2 {
		t.Errorf("%d shards changed hands when the replica came back, want %d: %v", changed, replicaShards/2, after)
	}
	s.adm.create("pods", apiPod("after-move", n.name, "while true; do sleep 1; done"))
	s.apiPodRunning("after-move", 60*time.Second)
	// Settle a renew interval on the new owner before the last look.
	time.Sleep(3 * time.Second)
	oldest, notReady := w.finish()
	for name, age := range oldest {
		if age >= 40*time.Second {
			t.Errorf("node %s's Lease was %v old at worst, past its 40 s", name, age.Round(time.Millisecond))
		}
	}
	t.Logf("oldest Lease seen during the moves: %v", oldest)
	if len(notReady) > 0 {
		t.Errorf("nodes seen not Ready during the moves: %v", notReady)
	}
	if got := containerIDs(t, n, "web", "ctl"); asJSON(got) != asJSON(before) {
		t.Errorf("containers changed across the moves: %v -> %v", before, got)
	}
}
