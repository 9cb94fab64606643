package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/test/e2e/env"

	opmqtt "github.com/outpost-edge/outpost/sync/mqtt"
)

// Log lines of the agent the signed tests count.
const (
	logRefusedSig = `msg="mqtt message refused; the store keeps what it had"`
	logReplay     = `msg="mqtt: signed message older than the last index read and not listed in it ignored`
	logStored     = `msg="mqtt: desired object stored"`
)

// TestMQTTSignedDesiredState runs an MQTT node that trusts the bridge's
// signing key (`outpost bridge keygen`), with a third party on the
// broker who holds the bridge's broker identity (as anyone who can
// publish there may) but not its key:
//   - a forged pod (the right topic, another key) and a valid signed
//     message moved to another topic are refused and counted, an empty
//     retained payload deletes nothing, and the pod keeps its container;
//   - a signed message of a deleted pod published again is ignored, and
//     again after the agent restarts and after the broker lost its
//     retained messages, while the bridge's own messages go on being
//     taken;
//   - a key rotated in: the node trusts old and new, the bridge moves to
//     the new key and publishes everything again signed with it, the old
//     key is dropped, and what the old key signs is refused; no
//     container restarts throughout.
func TestMQTTSignedDesiredState(t *testing.T) {
	s := newMQTTSetupWith(t, "e2e-mqtt-signed", mqttOptions{signed: true})
	n := s.node
	n.outside()
	n.start()
	s.nodeReady(60 * time.Second)
	s.apply(mqttWebConfig)
	s.apply(mqttWebSecret)
	s.apply(fmt.Sprintf(mqttWebPod, n.name, env.TestImage))
	s.adm.create("pods", apiPod("gone", n.name, "while true; do sleep 1; done"))
	// A pod with the default service account token volume: its tokens
	// Secret goes sealed to the node, and the bridge keeps its own copy.
	s.adm.create("configmaps", &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt", Namespace: "default"}, Data: map[string]string{"ca.crt": string(s.api.CA.CertPEM())}})
	withToken := apiPod("with-token", n.name, "test -s /var/run/secrets/kubernetes.io/serviceaccount/token && exec sleep 100000")
	withToken.Spec.AutomountServiceAccountToken = nil
	s.adm.create("pods", withToken)
	s.apiPodRunning("web", 60*time.Second)
	s.apiPodRunning("gone", 60*time.Second)
	s.apiPodRunning("with-token", 60*time.Second)
	before := containerIDs(t, n, "web")
	logs := n.logPath()

	// What the bridge retains for the two pods, signed. The third party
	// holds the bridge's broker identity: while it is connected the
	// bridge is not (the broker takes the CN as the client ID), so the
	// bridge is stopped meanwhile.
	webTopic := opmqtt.DesiredTopic(n.name, opmqtt.KindPods, "default", "web")
	goneTopic := opmqtt.DesiredTopic(n.name, opmqtt.KindPods, "default", "gone")
	tokensTopic := opmqtt.DesiredTopic(n.name, opmqtt.KindSecrets, "default", opmqtt.TokensSecretName("with-token"))
	var webOld, goneOld []byte
	var e opmqtt.Envelope
	var tokensGen uint64
	refused := logCount(t, logs, logRefusedSig, "reason=signature")
	s.asBridge(func(third *mqttPeer) {
		third.subscribe(t, webTopic, goneTopic, tokensTopic)
		retained := map[string][]byte{}
		for len(retained) < 3 {
			m := third.next(t)
			if len(m.Payload()) > 0 {
				retained[m.Topic()] = m.Payload()
			}
		}
		webOld, goneOld = retained[webTopic], retained[goneTopic]
		tokensGen = sealedGeneration(t, tokensTopic, retained[tokensTopic])
		if d, err := opmqtt.Decode(webOld); err != nil || d.Envelope == nil || d.Envelope.SignedBy == "" {
			t.Fatalf("the bridge's pod message is not signed: %+v, %v", d, err)
		}

		// A forged pod: the bridge's message with another command and a
		// generation far ahead, signed with a key the node does not trust.
		var err error
		if e, err = opmqtt.UnmarshalEnvelope(webOld); err != nil {
			t.Fatal(err)
		}
		var pod corev1.Pod
		if err := pod.Unmarshal(e.Body); err != nil {
			t.Fatal(err)
		}
		pod.Spec.Containers[0].Command = []string{"sh", "-c", "echo forged; sleep 100000"}
		if e.Body, err = pod.Marshal(); err != nil {
			t.Fatal(err)
		}
		e.Generation += 1 << 40
		forger, err := opmqtt.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		third.publish(t, webTopic, true, string(opmqtt.NewSigner(forger).Seal(webTopic, e)))
		// The bridge's own signed message, moved to another pod's topic.
		third.publish(t, opmqtt.DesiredTopic(n.name, opmqtt.KindPods, "default", "copy"), true, string(goneOld))
		waitLog(t, logs, refused+1, 30*time.Second, "the forged pod and the moved message refused", logRefusedSig, "reason=signature")
		// An empty retained payload: the pod stays.
		third.publish(t, webTopic, true, "")
	})

	// The pod's delete, then its signed message published again.
	ctx, cancel := s.adm.ctx()
	err := s.adm.core.Delete().Namespace("default").Resource("pods").Name("gone").Do(ctx).Error()
	cancel()
	if err != nil {
		t.Fatalf("delete pod gone: %v", err)
	}
	within(60*time.Second).For(t, "pod gone stopped and removed from the node", func() (bool, string) {
		return findPod(mustStatus(t, n), "gone") == nil, "still on the node"
	})
	replays := logCount(t, logs, logReplay, goneTopic)
	s.asBridge(func(third *mqttPeer) {
		third.publish(t, goneTopic, true, string(goneOld))
		waitLog(t, logs, replays, 30*time.Second, "the deleted pod's old message ignored as a replay", logReplay, goneTopic)
	})
	// The bridge's messages are still taken: a pod made now runs.
	s.adm.create("pods", apiPod("after-replay", n.name, "while true; do sleep 1; done"))
	s.apiPodRunning("after-replay", 60*time.Second)
	if got := logCount(t, logs, logRefusedSig, "reason=signature"); got != refused+2 {
		t.Errorf("%d messages refused for their signature, want 2 (the forged pod, the moved message)", got-refused)
	}
	checkSignedPods(t, n, before, "after the forged, moved, empty and replayed messages")

	// The agent restarted (its floor is in its store): the replay again.
	n.kill()
	n.start()
	s.nodeReady(60 * time.Second)
	replays = logCount(t, logs, logReplay, goneTopic)
	s.asBridge(func(third *mqttPeer) {
		// The bridge restarted twice since the pod's tokens were sent;
		// it read its own copy back each time, and sent them no more.
		third.subscribe(t, tokensTopic)
		if g := sealedGeneration(t, tokensTopic, third.next(t).Payload()); g != tokensGen {
			t.Errorf("the pod's tokens were sent again (generation %d, then %d) after the bridge restarted with its key", tokensGen, g)
		}
		third.publish(t, goneTopic, false, string(goneOld))
		waitLog(t, logs, replays, 30*time.Second, "the replay ignored again after the agent restarted", logReplay, goneTopic)
	})
	checkSignedPods(t, n, before, "after the agent restarted")

	// The broker lost its retained messages: the bridge publishes
	// everything again, with new generations, and the node takes them;
	// the old message published again is still a replay.
	stored := logCount(t, logs, logStored, webTopic)
	s.broker.Stop(t)
	checkBrokerStore(t, s.broker, []string{tokensTopic, opmqtt.BridgeTokensTopic(n.name, "default", opmqtt.TokensSecretName("with-token"))}, "s3cret")
	s.broker.RemovePersistence(t)
	s.broker.Start(t)
	waitLog(t, logs, stored, 90*time.Second, "web published to the node again", logStored, webTopic)
	replays = logCount(t, logs, logReplay, goneTopic)
	s.asBridge(func(third *mqttPeer) {
		third.publish(t, goneTopic, true, string(goneOld))
		waitLog(t, logs, replays, 30*time.Second, "the replay ignored after the broker lost its retained messages", logReplay, goneTopic)
	})
	checkSignedPods(t, n, before, "after the broker lost its retained messages")

	// Rotation. 1: the node trusts the old key and a new one.
	newKey := s.signingKey + ".new"
	out, err := exec.Command(outpostBin, "bridge", "keygen", newKey).CombinedOutput()
	if err != nil {
		t.Fatalf("outpost bridge keygen: %v: %s", err, out)
	}
	oldPub := signingPublicKey(t, s.signingKey)
	newPub := strings.TrimSpace(string(out))
	editFile(t, n.cfg, fmt.Sprintf("trustedKeys: [%q]", oldPub), fmt.Sprintf("trustedKeys: [%q, %q]", oldPub, newPub))
	n.kill()
	n.start()
	s.nodeReady(60 * time.Second)
	// 2: the bridge signs with the new key: everything is published
	// again, signed with it, and taken.
	stored = logCount(t, logs, logStored, webTopic)
	editFile(t, s.bridgeCfg, "signingKeyFile: "+s.signingKey, "signingKeyFile: "+newKey)
	s.killBridge()
	s.startBridge()
	waitLog(t, logs, stored, 60*time.Second, "web published again with the new key", logStored, webTopic)
	s.adm.create("pods", apiPod("after-rotation", n.name, "while true; do sleep 1; done"))
	s.apiPodRunning("after-rotation", 60*time.Second)
	// 3: the old key dropped; what it signed is refused.
	editFile(t, n.cfg, fmt.Sprintf("trustedKeys: [%q, %q]", oldPub, newPub), fmt.Sprintf("trustedKeys: [%q]", newPub))
	n.kill()
	n.start()
	s.nodeReady(60 * time.Second)
	refused = logCount(t, logs, logRefusedSig, "reason=signature", webTopic)
	e.Generation += 1 << 40
	oldSigner := readSigner(t, s.signingKey)
	s.asBridge(func(third *mqttPeer) {
		third.publish(t, webTopic, false, string(oldSigner.Seal(webTopic, e)))
		waitLog(t, logs, refused, 30*time.Second, "a message signed with the dropped key refused", logRefusedSig, "reason=signature", webTopic)
	})
	checkSignedPods(t, n, before, "after the key rotation")
	s.apiPodRunning("after-rotation", 30*time.Second)
}

// asBridge stops the bridge, runs f with a client of the bridge's broker
// identity, and starts the bridge again.
func (s *mqttSetup) asBridge(f func(*mqttPeer)) {
	s.t.Helper()
	s.killBridge()
	p := connectPeer(s.t, s.broker, bridgeCN)
	f(p)
	p.Disconnect(250)
	s.startBridge()
}

// checkSignedPods fails t unless web runs the containers it ran before
// and gone, deleted, is not back.
func checkSignedPods(t *testing.T, n *node, before map[string]string, when string) {
	t.Helper()
	if after := containerIDs(t, n, "web"); asJSON(after) != asJSON(before) {
		t.Errorf("web's containers changed %s: %v -> %v", when, before, after)
	}
	st := mustStatus(t, n)
	if findPod(st, "gone") != nil {
		t.Errorf("the deleted pod gone is back on the node %s", when)
	}
	if findPod(st, "copy") != nil {
		t.Errorf("a pod copy runs on the node %s", when)
	}
}

// signingPublicKey is the public key of a key file, as `outpost bridge
// pubkey` prints it.
func signingPublicKey(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command(outpostBin, "bridge", "pubkey", path).CombinedOutput()
	if err != nil {
		t.Fatalf("outpost bridge pubkey: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

func readSigner(t *testing.T, path string) *opmqtt.Signer {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	key, err := opmqtt.ParsePrivateKey(b)
	if err != nil {
		t.Fatal(err)
	}
	return opmqtt.NewSigner(key)
}

// editFile replaces old, which must be in the file, by new.
func editFile(t *testing.T, path, old, new string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), old) {
		t.Fatalf("%s does not hold %q:\n%s", path, old, b)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(b), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// sealedGeneration is the generation of a sealed Secret's envelope.
func sealedGeneration(t *testing.T, topic string, payload []byte) uint64 {
	t.Helper()
	e, err := opmqtt.UnmarshalEnvelope(payload)
	if err != nil {
		t.Fatalf("%s: %v", topic, err)
	}
	if e.Encoding != opmqtt.EncodingSealed {
		t.Fatalf("%s: encoding %s, want sealed", topic, e.Encoding)
	}
	return e.Generation
}

// jwtHeader starts every service account token: `{"alg":` in base64url.
const jwtHeader = "eyJhbGciOi"

// checkBrokerStore reads the persistence database of the stopped broker
// (what it retains, as written to its disk) and fails if any of secrets
// or any service account token is in it. Each of topics must be, so the
// file is the one the broker used.
func checkBrokerStore(t *testing.T, b *env.MosquittoTLS, topics []string, secrets ...string) {
	t.Helper()
	db, err := os.ReadFile(b.DBFile)
	if err != nil {
		t.Fatalf("the broker's persistence database: %v", err)
	}
	for _, topic := range topics {
		if !strings.Contains(string(db), topic) {
			t.Errorf("the broker's database holds nothing at %s", topic)
		}
	}
	for _, v := range append(secrets, jwtHeader) {
		if strings.Contains(string(db), v) {
			t.Errorf("the broker's database holds %q in clear", v)
		}
	}
}
