package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// badSpecPod has no image in one container and, in the other, a volume
// mount of no volume, a port name longer than 15 characters and a
// readiness probe on a port name the container does not have.
const badSpecPod = `apiVersion: v1
kind: Pod
metadata: {name: badspec}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: noimage
    command: [sleep, "600"]
  - name: main
    image: ` + env.TestImage + `
    command: [sleep, "600"]
    volumeMounts: [{name: data, mountPath: /data}]
    ports: [{name: metrics-endpoint-1, containerPort: 9090}]
    readinessProbe:
      tcpSocket: {port: web}
`

const badQuantityPod = `apiVersion: v1
kind: Pod
metadata: {name: quantity}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: ` + env.TestImage + `
    command: [sh, -c, 'echo up; sleep 600']
    resources:
      limits: {memory: %s}
`

// TestBadInput runs a manifest file holding a good pod and a pod with a bad
// spec, and a second file whose pod has a quantity that does not parse.
// The good pod runs; the bad ones are Failed with reason InvalidPod and a
// message naming each bad field, in `outpost status -o json` and in
// `outpost status NS/POD`, and nothing is made for them: no container in
// containerd, no pod directory, no log directory. So it stays after an
// agent restart. Fixing the second file runs its pod, and the good pod of
// the first file is never touched.
func TestBadInput(t *testing.T) {
	n := newNode(t, "e2e-bad")
	n.write("apps.yaml", podManifest("good", "Always", "echo up; sleep 600")+"---\n"+badSpecPod)
	n.write("quantity.yaml", strings.Replace(badQuantityPod, "%s", "12Q", 1))
	n.start()

	good := n.waitPod("good-e2e-bad", 30*time.Second, "running", running)
	wantMsg := map[string][]string{
		"badspec-e2e-bad": {
			"spec.containers[0].image: is required",
			`spec.containers[1].ports[0].name: "metrics-endpoint-1" is not a valid port name: must be no more than 15 characters`,
			`spec.containers[1].volumeMounts[0].name: "data" is not a volume of the pod`,
			`spec.containers[1].readinessProbe.tcpSocket.port: "web" is not the name of a port of this container`,
		},
		"quantity-e2e-bad": {`spec.containers[0].resources.limits.memory: invalid value "12Q"`},
	}
	invalid := func(p *agent.PodInfo) bool {
		return p.Status.Phase == corev1.PodFailed && p.Status.Reason == agent.ReasonInvalidPod
	}
	checkInvalid := func(when string) map[string]string {
		t.Helper()
		uids := map[string]string{}
		for name, msgs := range wantMsg {
			p := n.waitPod(name, 15*time.Second, "Failed with reason InvalidPod", invalid)
			rest := p.Status.Message
			for _, m := range msgs {
				i := strings.Index(rest, m)
				if i < 0 {
					t.Fatalf("%s: pod %s: message\n%s\nlacks, in order, %q", when, name, p.Status.Message, m)
				}
				rest = rest[i+len(m):]
			}
			if len(p.Status.ContainerStatuses) != 0 || p.Status.PodIP != "" || p.Status.StartTime != nil {
				t.Fatalf("%s: pod %s has run-time status: %+v", when, name, p.Status)
			}
			uids[name] = p.UID
			out, err := n.outpost("status", "default/"+name)
			if err != nil || !regexp.MustCompile(`(?m)^STATUS +Failed\n`).MatchString(out) || !regexp.MustCompile(`(?m)^REASON +InvalidPod\n`).MatchString(out) ||
				!regexp.MustCompile(`(?m)^MESSAGE +`+regexp.QuoteMeta(msgs[0])).MatchString(out) {
				t.Fatalf("%s: outpost status default/%s: %v\n%s", when, name, err, out)
			}
		}
		// Nothing was made for them in containerd or on disk.
		ls := run(t, "ctr", "-a", n.ctrd.Address, "-n", n.ns, "containers", "ls", "-q")
		if !strings.Contains(ls, strings.TrimPrefix(good.Status.ContainerStatuses[0].ContainerID, "containerd://")) {
			t.Fatalf("%s: the good pod's container is not in containerd:\n%s", when, ls)
		}
		for name, uid := range uids {
			if strings.Contains(ls, uid[:12]) {
				t.Fatalf("%s: containerd has a container of invalid pod %s (%s):\n%s", when, name, uid, ls)
			}
			for _, dir := range []string{filepath.Join(n.dir, "state", "pods", uid), filepath.Join(n.dir, "logs", "default_"+name+"_"+uid)} {
				if _, err := os.Stat(dir); !os.IsNotExist(err) {
					t.Fatalf("%s: invalid pod %s has %s: %v", when, name, dir, err)
				}
			}
		}
		table, err := n.outpost("status")
		if err != nil {
			t.Fatalf("%s: outpost status: %v\n%s", when, err, table)
		}
		for _, want := range []string{"apps.yaml: document 2 (Pod badspec): spec.containers[0].image: is required", "quantity.yaml: document 1 (Pod quantity): "} {
			if !strings.Contains(table, want) {
				t.Fatalf("%s: outpost status lacks the manifest error %q:\n%s", when, want, table)
			}
		}
		t.Logf("%s: outpost status:\n%s", when, table)
		return uids
	}
	uids := checkInvalid("first start")
	if out, err := n.outpost("status", "default/badspec-e2e-bad"); err == nil {
		t.Logf("outpost status default/badspec-e2e-bad:\n%s", out)
	}

	n.stop()
	n.start()
	if again := checkInvalid("after an agent restart"); again["quantity-e2e-bad"] != uids["quantity-e2e-bad"] {
		t.Fatalf("UIDs changed across a restart: %v, then %v", uids, again)
	}

	// The fixed file gives a new pod that runs; the good pod is the same.
	n.write("quantity.yaml", strings.Replace(badQuantityPod, "%s", "64Mi", 1))
	fixed := n.waitPod("quantity-e2e-bad", 20*time.Second, "running once fixed", running)
	if fixed.UID == uids["quantity-e2e-bad"] || fixed.Status.Reason != "" {
		t.Fatalf("fixed pod: uid %s (was %s), reason %q", fixed.UID, uids["quantity-e2e-bad"], fixed.Status.Reason)
	}
	n.waitLogs("quantity-e2e-bad", 10*time.Second, "up")
	now := n.waitPod("good-e2e-bad", 5*time.Second, "still running", running)
	if got, want := now.Status.ContainerStatuses[0].ContainerID, good.Status.ContainerStatuses[0].ContainerID; got != want || now.UID != good.UID {
		t.Fatalf("good pod disturbed: container %s, was %s", got, want)
	}
	n.waitPod("badspec-e2e-bad", 5*time.Second, "still Failed", invalid)
}
