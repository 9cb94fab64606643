package e2e

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

	"github.com/containerd/containerd/v2/client"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/agent"
	omqtt "github.com/outpost-edge/outpost/sync/mqtt"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// These tests break what an MQTT node depends on, with the real
// components of mqttSetup: the agent dies, the broker loses its disk or
// stops for a while, the node's link goes half-open, the bridge dies
// during churn, another node or a broken bridge publishes what it must
// not. In each the pods keep running, nothing is restarted, and the API
// server converges once the fault is gone.

const (
	// nodeKeepalive is the node's MQTT keepalive, as newMQTTSetup
	// configures it.
	nodeKeepalive = 5 * time.Second
	// brokerOutage is how long TestMQTTBrokerRestarts keeps the broker
	// down (the 2 minutes take too long for CI; nothing in the
	// sync depends on the length).
	brokerOutage = 30 * time.Second
	// linkCut is how long TestMQTTHalfOpenLink cuts the link: past the
	// agent noticing it, long enough for its reconnect backoff to grow.
	linkCut = 30 * time.Second
	// lifecycleGrace is the node lifecycle controller's grace period in
	// TestMQTTAgentKilled.
	lifecycleGrace = 10 * time.Second
	// bridgeUser is the bridge's identity in the API server
	// (packaging/bridge/rbac.yaml).
	bridgeUser = "system:serviceaccount:outpost-system:outpost-bridge"
)

// TestMQTTAgentKilled kills the agent with SIGKILL: the broker publishes
// its Last Will (online false), the bridge stops renewing the Lease and
// the node lifecycle controller marks the Node NotReady, while the pods'
// containers keep running. A new agent converges (a pod created and one
// deleted meanwhile included) with the same containers, no restart
// counted in the API, and the Node Ready again.
func TestMQTTAgentKilled(t *testing.T) {
	s := newMQTTSetup(t, "e2e-mqtt-kill")
	s.api.StartControllerManager(t, lifecycleGrace)
	n := s.node
	n.outside()
	n.start()
	s.nodeReady(60 * time.Second)
	pods := []string{"steady-a", "steady-b"}
	for _, name := range pods {
		s.adm.create("pods", apiPod(name, n.name, "while true; do sleep 1; done"))
	}
	for _, name := range pods {
		s.apiPodRunning(name, 60*time.Second)
	}
	before := containerIDs(t, n, pods...)

	away := logCount(t, s.bridgeLog, `msg="node away; its lease is left to expire"`)
	n.kill()
	t0 := time.Now()
	waitLog(t, s.bridgeLog, away, 15*time.Second, "the bridge told the node is away (its Last Will)", `msg="node away; its lease is left to expire"`)
	t.Logf("the bridge saw the Last Will %v after the kill", time.Since(t0).Round(100*time.Millisecond))
	renewed := s.leaseRenewTime()
	within(lifecycleGrace+30*time.Second).For(t, "the node NotReady in the API", func() (bool, string) {
		st, msg := s.nodeReadyStatus()
		return st != "" && st != corev1.ConditionTrue, msg
	})
	t.Logf("NotReady %v after the kill", time.Since(t0).Round(100*time.Millisecond))
	if r := s.leaseRenewTime(); !r.Equal(renewed) {
		t.Errorf("the Lease was renewed while the node was offline: %v, then %v", renewed, r)
	}
	// The agent is dead; its containers are not.
	tasks := n.runningTasks(t)
	for k, v := range before {
		if id := containerIDOf(v); !tasks[id] {
			t.Errorf("container %s (%s) has no running task while the agent is dead; running: %v", k, id, tasks)
		}
	}

	// What changes while the agent is dead waits for it on the broker.
	s.adm.create("pods", apiPod("while-away", n.name, "while true; do sleep 1; done"))
	ctx, cancel := s.adm.ctx()
	err := s.adm.core.Delete().Namespace("default").Resource("pods").Name("steady-b").Do(ctx).Error()
	cancel()
	if err != nil {
		t.Fatalf("delete pod steady-b: %v", err)
	}

	n.start()
	s.nodeReady(60 * time.Second)
	s.apiPodRunning("while-away", 60*time.Second)
	within(60*time.Second).For(t, "steady-b stopped and deleted", func() (bool, string) {
		if _, err := s.adm.pod("steady-b"); !apierrors.IsNotFound(err) {
			return false, fmt.Sprint("in the API: ", err)
		}
		return findPod(mustStatus(t, n), "steady-b") == nil, "still on the node"
	})
	if after := containerIDs(t, n, "steady-a"); after["steady-a/main"] != before["steady-a/main"] {
		t.Errorf("steady-a's container changed across the agent's death: %v -> %v", before, after)
	}
	p := s.apiPodRunning("steady-a", 30*time.Second)
	if r := apiRestarts(p); r != 0 {
		t.Errorf("steady-a: restart count %d in the API, want 0", r)
	}
}

// TestMQTTHalfOpenLink drops every packet between the agent and the
// broker, with no FIN or RST, as a link that died under a live TCP
// connection: the pods keep running, the agent notices within three
// keepalives, and once the link is back it is connected again within
// three keepalives, and the status change made during the cut reaches
// the API server.
func TestMQTTHalfOpenLink(t *testing.T) {
	s := newMQTTSetup(t, "e2e-mqtt-cut")
	n := s.node
	n.outside()
	n.start()
	s.nodeReady(60 * time.Second)
	ctl := t.TempDir()
	s.adm.create("pods", ctlPod("flip", n.name, ctl))
	s.adm.create("pods", apiPod("steady", n.name, "while true; do sleep 1; done"))
	s.apiPodRunning("flip", 60*time.Second)
	s.apiPodRunning("steady", 60*time.Second)
	before := containerIDs(t, n, "flip", "steady")
	within(10*time.Second).For(t, "an empty journal", func() (bool, string) {
		st := mustStatus(t, n)
		return st.JournalBacklog == 0, fmt.Sprint("backlog ", st.JournalBacklog)
	})

	connected := logCount(t, n.logPath(), `msg="mqtt broker connected"`)
	restore := n.cutTCP(t, brokerPort(t, s.broker))
	t0 := time.Now()
	// A status change while the link is cut.
	if err := os.WriteFile(filepath.Join(ctl, "flip"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	n.waitPod("flip", 15*time.Second, "not ready on the node", func(p *agent.PodInfo) bool { return !ready(p) })
	within(3*nodeKeepalive+2*time.Second).For(t, "the agent's link down", func() (bool, string) {
		st := mustStatus(t, n)
		return st.Agent != nil && st.Agent.Link != nil && !st.Agent.Link.Connected, asJSON(st.Agent)
	})
	t.Logf("the agent noticed the cut after %v", time.Since(t0).Round(100*time.Millisecond))
	if p, err := s.adm.pod("flip"); err != nil || podCondition(p, corev1.PodReady) != corev1.ConditionTrue {
		t.Fatalf("flip in the API during the cut: %v %s; the change cannot have reached it", err, asJSON(p.Status))
	}
	if after := containerIDs(t, n, "flip", "steady"); asJSON(after) != asJSON(before) {
		t.Errorf("containers changed during the cut: %v -> %v", before, after)
	}

	// The agent tries to connect while the link is cut: connects that
	// never get an answer, each given up after its timeout.
	if d := linkCut - time.Since(t0); d > 0 {
		time.Sleep(d)
	}
	restore()
	t1 := time.Now()
	waitLog(t, n.logPath(), connected, 3*nodeKeepalive, "the agent connected again after the link came back", `msg="mqtt broker connected"`)
	t.Logf("connected again %v after the link came back", time.Since(t1).Round(100*time.Millisecond))
	within(30*time.Second).For(t, "flip NotReady in the API", func() (bool, string) {
		p, err := s.adm.pod("flip")
		if err != nil {
			return false, err.Error()
		}
		return podCondition(p, corev1.PodReady) == corev1.ConditionFalse, asJSON(p.Status)
	})
	if after := containerIDs(t, n, "flip", "steady"); asJSON(after) != asJSON(before) {
		t.Errorf("containers changed across the cut: %v -> %v", before, after)
	}
}

// TestMQTTBrokerRestarts restarts the broker twice. First it loses its
// persistence file: the bridge publishes everything again, the running
// pods are not restarted, a pod created afterwards runs, and a bridge
// restarted after that finds what it needs to keep the node. Then it is
// down for brokerOutage while the pods' readiness flips several times:
// the containers keep running, the Lease is not renewed for a node the
// bridge cannot hear, and once the broker is back the API server gets
// one status write per pod that changed, with the final state, and none
// for the pods that did not.
func TestMQTTBrokerRestarts(t *testing.T) {
	s := newMQTTSetup(t, "e2e-mqtt-broker")
	n := s.node
	n.outside()
	n.start()
	s.nodeReady(60 * time.Second)
	ctl := t.TempDir()
	var flips []string
	for i := range 6 {
		flips = append(flips, fmt.Sprintf("flip-%d", i))
	}
	s.adm.create("pods", apiPod("steady", n.name, "while true; do sleep 1; done"))
	for _, name := range flips {
		s.adm.create("pods", ctlPod(name, n.name, ctl))
	}
	all := append([]string{"steady"}, flips...)
	for _, name := range all {
		s.apiPodRunning(name, 90*time.Second)
	}
	before := containerIDs(t, n, all...)

	// The broker loses its disk: no retained message, no session.
	stored := logCount(t, n.logPath(), `msg="mqtt: desired object stored"`, "/desired/pods/default/steady")
	s.broker.Stop(t)
	s.broker.RemovePersistence(t)
	s.broker.Start(t)
	waitLog(t, n.logPath(), stored, 60*time.Second, "steady published to the node again", `msg="mqtt: desired object stored"`, "/desired/pods/default/steady")
	s.adm.create("pods", apiPod("after-wipe", n.name, "while true; do sleep 1; done"))
	s.apiPodRunning("after-wipe", 60*time.Second)
	if after := containerIDs(t, n, all...); asJSON(after) != asJSON(before) {
		t.Errorf("containers changed across the broker's loss of its disk: %v -> %v", before, after)
	}
	within(30*time.Second).For(t, "an empty journal", func() (bool, string) {
		st := mustStatus(t, n)
		return st.JournalBacklog == 0, fmt.Sprint("backlog ", st.JournalBacklog)
	})
	// A bridge started now finds on the broker only what was published
	// since the wipe: the node's status must be among it, or the new
	// bridge never registers the node nor renews its Lease.
	s.killBridge()
	renewed := s.leaseRenewTime()
	written := bridgeStatusWrites(s.api.AuditEvents(t))["after-wipe"]
	s.startBridge()
	within(30*time.Second).For(t, "the Lease renewed by a bridge started after the wipe", func() (bool, string) {
		r := s.leaseRenewTime()
		return r.After(renewed), fmt.Sprint("renewed at ", r)
	})
	// It writes once the statuses the broker retains, after-wipe's among
	// them (the others' went with the broker's disk).
	within(30*time.Second).For(t, "after-wipe's status written by the new bridge", func() (bool, string) {
		n := bridgeStatusWrites(s.api.AuditEvents(t))["after-wipe"]
		return n > written, fmt.Sprint(n-written, " writes")
	})

	// The broker stops for a while; the pods change meanwhile.
	seen := len(s.api.AuditEvents(t))
	s.broker.Stop(t)
	t0 := time.Now()
	within(10*time.Second).For(t, "the agent's link down", func() (bool, string) {
		st := mustStatus(t, n)
		return st.Agent != nil && st.Agent.Link != nil && !st.Agent.Link.Connected, asJSON(st.Agent)
	})
	// Three rounds: all not ready, all ready, the even ones not ready.
	final := map[string]bool{}
	for round := range 3 {
		for i, name := range flips {
			notReady := round == 0 || (round == 2 && i%2 == 0)
			final[name] = !notReady
			setCtl(t, ctl, name, notReady)
		}
		for _, name := range flips {
			want := final[name]
			n.waitPod(name, 15*time.Second, fmt.Sprintf("ready=%v on the node", want), func(p *agent.PodInfo) bool { return ready(p) == want })
		}
	}
	renewed = s.leaseRenewTime()
	if d := brokerOutage - time.Since(t0); d > 0 {
		time.Sleep(d)
	}
	if r := s.leaseRenewTime(); !r.Equal(renewed) {
		t.Errorf("the Lease was renewed while the broker was down: %v, then %v", renewed, r)
	}
	if after := containerIDs(t, n, all...); asJSON(after) != asJSON(before) {
		t.Errorf("containers changed while the broker was down: %v -> %v", before, after)
	}

	s.broker.Start(t)
	t1 := time.Now()
	for _, name := range flips {
		want := corev1.ConditionFalse
		if final[name] {
			want = corev1.ConditionTrue
		}
		within(90*time.Second).For(t, fmt.Sprintf("%s Ready=%s in the API", name, want), func() (bool, string) {
			p, err := s.adm.pod(name)
			if err != nil {
				return false, err.Error()
			}
			return podCondition(p, corev1.PodReady) == want, asJSON(p.Status.Conditions)
		})
	}
	t.Logf("the API server had the final state %v after the broker came back", time.Since(t1).Round(100*time.Millisecond))
	s.nodeReady(30 * time.Second)
	within(30*time.Second).For(t, "an empty journal", func() (bool, string) {
		st := mustStatus(t, n)
		return st.JournalBacklog == 0, fmt.Sprint("backlog ", st.JournalBacklog)
	})
	// Anything stale would come now.
	time.Sleep(3 * time.Second)
	events := s.api.AuditEvents(t)[seen:]
	writes := bridgeStatusWrites(events)
	t.Logf("status writes after the outage: %v", writes)
	// showWrites says when pod's status was written, and what with.
	showWrites := func(pod string) {
		t.Logf("the broker came back at %s; the bridge wrote %s's status:", t1.UTC().Format(time.RFC3339Nano), pod)
		for _, e := range events {
			if isBridgeStatusWrite(e) && e.ObjectRef.Name == pod {
				t.Logf("  %s %s %s", e.Received.UTC().Format(time.RFC3339Nano), e.Verb, e.RequestObject)
			}
		}
	}
	for pod, c := range writes {
		if _, flip := final[pod]; !flip {
			t.Errorf("pod %s did not change during the outage and has %d status writes after it, want 0", pod, c)
			showWrites(pod)
		}
	}
	for _, name := range flips {
		if writes[name] != 1 {
			t.Errorf("%s changed during the outage and has %d status writes after it, want 1", name, writes[name])
			showWrites(name)
		}
		p, err := s.adm.pod(name)
		if err != nil {
			t.Fatal(err)
		}
		want := corev1.ConditionFalse
		if final[name] {
			want = corev1.ConditionTrue
		}
		if got := podCondition(p, corev1.PodReady); got != want {
			t.Errorf("%s: Ready=%s in the API after it settled, want %s", name, got, want)
		}
		if r := apiRestarts(p); r != 0 {
			t.Errorf("%s: restart count %d in the API, want 0", name, r)
		}
	}
	if after := containerIDs(t, n, all...); asJSON(after) != asJSON(before) {
		t.Errorf("containers changed across the outage: %v -> %v", before, after)
	}
}

// TestMQTTBridgeRestartAndRefusedMessages: another node's client reads
// nothing of the node's desired state and its forged status never
// reaches the API server; then, with the bridge killed, messages
// published with the bridge's identity that do not decode, are over the
// node's size limit, or are older than what the node stored are refused,
// and pods created and deleted meanwhile converge once the bridge is
// back, with no pod restarted. A bridge restarted while the API server
// is down deletes nothing on the node.
func TestMQTTBridgeRestartAndRefusedMessages(t *testing.T) {
	s := newMQTTSetup(t, "e2e-mqtt-refuse")
	const maxBytes = 64 << 10
	s.nodeMQTT(fmt.Sprintf("maxMessageBytes: %d", maxBytes))
	n := s.node
	n.outside()
	n.start()
	s.nodeReady(60 * time.Second)
	ctl := t.TempDir()
	s.adm.create("pods", ctlPod("web", n.name, ctl))
	s.adm.create("pods", apiPod("gone", n.name, "while true; do sleep 1; done"))
	web := s.apiPodRunning("web", 60*time.Second)
	s.apiPodRunning("gone", 60*time.Second)
	before := containerIDs(t, n, "web")
	images := findPod(mustStatus(t, n), "web").Images
	// A pod with the service account token volume the API server adds by
	// default: its tokens go as a Secret the bridge makes, sealed to the
	// node. This bridge signs nothing, so it has no key that outlives it
	// to keep its own copy of them with: restarted, it requests them
	// anew and sends them once (TestMQTTSignedDesiredState has a signing
	// bridge read its copy back and send nothing).
	s.adm.create("configmaps", &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt", Namespace: "default"}, Data: map[string]string{"ca.crt": string(s.api.CA.CertPEM())}})
	withToken := apiPod("with-token", n.name, "test -s /var/run/secrets/kubernetes.io/serviceaccount/token && exec sleep 100000")
	withToken.Spec.AutomountServiceAccountToken = nil
	s.adm.create("pods", withToken)
	s.apiPodRunning("with-token", 60*time.Second)
	tokenIDs := containerIDs(t, n, "with-token")
	tokenTopic := omqtt.DesiredTopic(n.name, omqtt.KindSecrets, "default", omqtt.TokensSecretName("with-token"))

	// Another node reads nothing of this one's and writes nothing for it.
	other := connectPeer(t, s.broker, "other")
	other.subscribe(t, omqtt.Prefix+"nodes/"+n.name+"/desired/#")
	forged := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: web.UID},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Forged"}}
	body, err := forged.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	// Its generation is above any the node will use: had the bridge
	// taken it, it would ignore every later status of web.
	payload := omqtt.Envelope{Kind: "Pod", Generation: 1 << 60, Encoding: omqtt.EncodingProtobuf, Body: body}.Marshal()
	other.publish(t, omqtt.PodStatusTopic(n.name, "default", "web"), true, string(payload))
	// The positive controls: a status of web after it, and a pod
	// published to the node.
	setCtl(t, ctl, "web", true)
	s.adm.create("pods", apiPod("acl-control", n.name, "while true; do sleep 1; done"))
	s.apiPodRunning("acl-control", 60*time.Second)
	within(30*time.Second).For(t, "web NotReady in the API", func() (bool, string) {
		p, err := s.adm.pod("web")
		if err != nil {
			return false, err.Error()
		}
		return podCondition(p, corev1.PodReady) == corev1.ConditionFalse, asJSON(p.Status)
	})
	select {
	case m := <-other.inbox:
		t.Errorf("another node received %s (%d bytes) of this node's desired state", m.Topic(), len(m.Payload()))
	default:
	}
	if p, _ := s.adm.pod("web"); p.Status.Phase != corev1.PodRunning || p.Status.Reason != "" {
		t.Errorf("web in the API after another node's forged status: %s", asJSON(p.Status))
	}
	if c := logCount(t, s.bridgeLog, "Forged"); c != 0 {
		t.Errorf("the bridge saw another node's forged status (%d log lines)", c)
	}
	setCtl(t, ctl, "web", false)
	within(30*time.Second).For(t, "web Ready in the API", func() (bool, string) {
		p, err := s.adm.pod("web")
		if err != nil {
			return false, err.Error()
		}
		return podCondition(p, corev1.PodReady) == corev1.ConditionTrue, asJSON(p.Status)
	})

	// The bridge dies; a client with its identity publishes bad
	// messages to the node's desired topics.
	tokenStored := logCount(t, n.logPath(), `msg="mqtt: desired object stored"`, tokenTopic)
	if tokenStored == 0 {
		t.Fatalf("the node never stored %s", tokenTopic)
	}
	s.killBridge()
	bad := connectPeer(t, s.broker, bridgeCN)
	topic := omqtt.DesiredTopic(n.name, omqtt.KindPods, "default", "web")
	bad.subscribe(t, topic)
	m := bad.next(t)
	e, err := omqtt.UnmarshalEnvelope(m.Payload())
	if err != nil {
		t.Fatalf("retained %s: %v", topic, err)
	}
	var pod corev1.Pod
	if err := pod.Unmarshal(e.Body); err != nil {
		t.Fatalf("retained %s: %v", topic, err)
	}
	envelope := func(p *corev1.Pod, gen uint64) string {
		b, err := p.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return string(omqtt.Envelope{Kind: "Pod", Generation: gen, Encoding: omqtt.EncodingProtobuf, Body: b}.Marshal())
	}
	changed := func(image string) *corev1.Pod {
		p := pod.DeepCopy()
		p.Spec.Containers[0].Image = image
		return p
	}
	big := changed("refused:big")
	big.Annotations = map[string]string{"e2e/padding": strings.Repeat("x", 2*maxBytes)}
	refused := logCount(t, n.logPath(), `msg="mqtt message refused; the store keeps what it had"`)
	stale := logCount(t, n.logPath(), `msg="mqtt: older generation than the store's ignored"`)
	bad.publish(t, topic, false, "not an outpost envelope")
	bad.publish(t, topic, false, envelope(big, e.Generation+1000))
	bad.publish(t, topic, false, envelope(changed("refused:old"), e.Generation-1))
	waitLog(t, n.logPath(), refused, 15*time.Second, "the undecodable message refused", `msg="mqtt message refused; the store keeps what it had"`, "reason=envelope")
	waitLog(t, n.logPath(), refused, 15*time.Second, "the oversized message refused", `msg="mqtt message refused; the store keeps what it had"`, "reason=size")
	waitLog(t, n.logPath(), stale, 15*time.Second, "the older generation ignored", `msg="mqtt: older generation than the store's ignored"`, topic)
	bad.Disconnect(100)

	// Churn while the bridge is down.
	s.adm.create("pods", apiPod("new-1", n.name, "while true; do sleep 1; done"))
	s.adm.create("pods", apiPod("new-2", n.name, "while true; do sleep 1; done"))
	ctx, cancel := s.adm.ctx()
	err = s.adm.core.Delete().Namespace("default").Resource("pods").Name("gone").Do(ctx).Error()
	cancel()
	if err != nil {
		t.Fatalf("delete pod gone: %v", err)
	}
	setCtl(t, ctl, "web", true)
	n.waitPod("web", 15*time.Second, "not ready on the node", func(p *agent.PodInfo) bool { return !ready(p) })

	s.startBridge()
	s.apiPodRunning("new-1", 60*time.Second)
	s.apiPodRunning("new-2", 60*time.Second)
	within(60*time.Second).For(t, "gone stopped and deleted", func() (bool, string) {
		if _, err := s.adm.pod("gone"); !apierrors.IsNotFound(err) {
			return false, fmt.Sprint("in the API: ", err)
		}
		return findPod(mustStatus(t, n), "gone") == nil, "still on the node"
	})
	within(30*time.Second).For(t, "web NotReady in the API", func() (bool, string) {
		p, err := s.adm.pod("web")
		if err != nil {
			return false, err.Error()
		}
		return podCondition(p, corev1.PodReady) == corev1.ConditionFalse, asJSON(p.Status)
	})
	if after := containerIDs(t, n, "web"); asJSON(after) != asJSON(before) {
		t.Errorf("web's containers changed: %v -> %v", before, after)
	}
	if c := logCount(t, n.logPath(), `msg="mqtt: desired object stored"`, tokenTopic); c != tokenStored+1 {
		t.Errorf("the restarted bridge sent with-token's tokens again %d times, want once", c-tokenStored)
	}
	if after := containerIDs(t, n, "with-token"); asJSON(after) != asJSON(tokenIDs) {
		t.Errorf("with-token's containers changed: %v -> %v", tokenIDs, after)
	}
	if got := findPod(mustStatus(t, n), "web").Images; got != images {
		t.Errorf("web's images on the node %q, were %q", got, images)
	}
	for _, name := range []string{"web", "acl-control"} {
		p, err := s.adm.pod(name)
		if err != nil {
			t.Fatal(err)
		}
		if r := apiRestarts(p); r != 0 {
			t.Errorf("%s: restart count %d in the API, want 0", name, r)
		}
	}

	// A bridge that starts while the API server is down has nothing to
	// publish from: it must publish nothing, not the deletion of every
	// object the broker holds for the node.
	s.killBridge()
	s.api.Stop()
	deleted := logCount(t, n.logPath(), `msg="mqtt: desired object deleted"`)
	connected := logCount(t, s.bridgeLog, `msg="mqtt broker connected"`)
	heard := logCount(t, s.bridgeLog, `msg="mqtt node"`, "node="+n.name)
	s.startBridge()
	waitLog(t, s.bridgeLog, connected, 30*time.Second, "the new bridge connected to the broker", `msg="mqtt broker connected"`)
	waitLog(t, s.bridgeLog, heard, 10*time.Second, "the new bridge heard of the node", `msg="mqtt node"`, "node="+n.name)
	time.Sleep(5 * time.Second)
	if c := logCount(t, n.logPath(), `msg="mqtt: desired object deleted"`); c != deleted {
		t.Errorf("%d desired objects deleted on the node by a bridge with no API server", c-deleted)
	}
	s.api.Start(t)
	s.adm.create("pods", apiPod("after-api", n.name, "while true; do sleep 1; done"))
	s.apiPodRunning("after-api", 60*time.Second)
	for _, name := range []string{"web", "acl-control", "new-1", "new-2"} {
		if p := findPod(mustStatus(t, n), name); p == nil || !running(p) {
			t.Errorf("%s not running on the node after the bridge restarted without an API server: %+v", name, p)
		}
	}
	if after := containerIDs(t, n, "web"); asJSON(after) != asJSON(before) {
		t.Errorf("web's containers changed: %v -> %v", before, after)
	}
}

// nodeMQTT adds a field to the node's mqtt section (the last of its
// config file, as newMQTTSetup writes it). Call it before the node
// starts.
func (s *mqttSetup) nodeMQTT(field string) {
	s.t.Helper()
	f, err := os.OpenFile(s.node.cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		s.t.Fatal(err)
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "  %s\n", field); err != nil {
		s.t.Fatal(err)
	}
}

// leaseRenewTime returns the renew time of the node's Lease.
func (s *mqttSetup) leaseRenewTime() time.Time {
	s.t.Helper()
	ctx, cancel := s.adm.ctx()
	defer cancel()
	var l coordv1.Lease
	if err := s.adm.coor.Get().Namespace("kube-node-lease").Resource("leases").Name(s.node.name).Do(ctx).Into(&l); err != nil {
		s.t.Fatalf("lease of %s: %v", s.node.name, err)
	}
	if l.Spec.RenewTime == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Time
}

// nodeReadyStatus returns the status of the Node's Ready condition and
// a description of it.
func (s *mqttSetup) nodeReadyStatus() (corev1.ConditionStatus, string) {
	ctx, cancel := s.adm.ctx()
	defer cancel()
	var node corev1.Node
	if err := s.adm.core.Get().Resource("nodes").Name(s.node.name).Do(ctx).Into(&node); err != nil {
		return "", err.Error()
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status, string(c.Status) + " " + c.Reason
		}
	}
	return "", "no Ready condition"
}

// bridgeStatusWrites counts, per pod, the status writes of the bridge
// in events.
func bridgeStatusWrites(events []env.AuditEvent) map[string]int {
	out := map[string]int{}
	for _, e := range events {
		if isBridgeStatusWrite(e) {
			out[e.ObjectRef.Name]++
		}
	}
	return out
}

// isBridgeStatusWrite says whether e is the bridge writing a pod's status.
func isBridgeStatusWrite(e env.AuditEvent) bool {
	return e.User.Username == bridgeUser && e.ObjectRef.Resource == "pods" && e.ObjectRef.Subresource == "status" && (e.Verb == "patch" || e.Verb == "update")
}

// ctlPod is an apiPod that is ready while the file named like it does
// not exist in the host directory ctl.
func ctlPod(name, node, ctl string) *corev1.Pod {
	p := apiPod(name, node, "while true; do sleep 1; done")
	dir := corev1.HostPathDirectory
	p.Spec.Volumes = []corev1.Volume{{Name: "ctl", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: ctl, Type: &dir}}}}
	c := &p.Spec.Containers[0]
	c.VolumeMounts = []corev1.VolumeMount{{Name: "ctl", MountPath: "/ctl"}}
	c.ReadinessProbe = &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 1,
		ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "!", "-e", "/ctl/" + name}}}}
	return p
}

// setCtl makes the ctlPod name not ready (notReady) or ready.
func setCtl(t *testing.T, ctl, name string, notReady bool) {
	t.Helper()
	path := filepath.Join(ctl, name)
	if notReady {
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	} else if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
}

// logPath is the agent's log file.
func (n *node) logPath() string { return filepath.Join(n.dir, "agent.log") }

// logCount counts the lines of the log at path that contain every one
// of subs.
func logCount(t *testing.T, path string, subs ...string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		all := true
		for _, s := range subs {
			if !strings.Contains(line, s) {
				all = false
				break
			}
		}
		if all && line != "" {
			n++
		}
	}
	return n
}

// waitLog waits until the log at path has more than after lines with
// every one of subs.
func waitLog(t *testing.T, path string, after int, timeout time.Duration, what string, subs ...string) {
	t.Helper()
	within(timeout).For(t, what, func() (bool, string) {
		c := logCount(t, path, subs...)
		return c > after, fmt.Sprintf("%d lines with %q in %s", c, subs, filepath.Base(path))
	})
}

// runningTasks returns the IDs of the containers with a running task in
// the node's containerd.
func (n *node) runningTasks(t *testing.T) map[string]bool {
	t.Helper()
	cl := n.ctrd.Client(t, n.ns)
	ctx, cancel := context.WithTimeout(namespacesCtx(context.Background(), n.ns), 10*time.Second)
	defer cancel()
	cs, err := cl.Containers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, c := range cs {
		task, err := c.Task(ctx, nil)
		if err != nil {
			continue
		}
		if st, err := task.Status(ctx); err == nil && st.Status == client.Running {
			out[c.ID()] = true
		}
	}
	return out
}

// containerIDOf returns the container ID in a value of containerIDs.
func containerIDOf(v string) string {
	id, _, _ := strings.Cut(v, "@")
	_, id, _ = strings.Cut(id, "://")
	return id
}

// brokerPort is the broker's port.
func brokerPort(t *testing.T, b *env.MosquittoTLS) int {
	t.Helper()
	_, p, err := net.SplitHostPort(b.Addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// cutTCP drops every TCP packet to or from port on the loopback of the
// node's network namespace, where the agent reaches the broker through
// the forwarder: no FIN, no RST, a half-open connection. It returns the
// function that restores the link; t's cleanup does too.
func (n *node) cutTCP(t *testing.T, port int) (restore func()) {
	t.Helper()
	const table = "e2e_mqtt_cut"
	rules := fmt.Sprintf(`table inet %[1]s {
	chain output {
		type filter hook output priority filter; policy accept;
		oifname "lo" tcp dport %[2]d drop
		oifname "lo" tcp sport %[2]d drop
	}
}
`, table, port)
	cmd := exec.Command("ip", "netns", "exec", n.netns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v\n%s", err, out)
	}
	done := false
	restore = func() {
		if done {
			return
		}
		done = true
		if out, err := exec.Command("ip", "netns", "exec", n.netns, "nft", "delete", "table", "inet", table).CombinedOutput(); err != nil {
			t.Errorf("nft delete table: %v\n%s", err, out)
		}
	}
	t.Cleanup(restore)
	return restore
}
