package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

const webPod = `apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  containers:
  - name: httpd
    image: ` + env.TestImage + `
    command: [httpd, -f, -p, "8080", -h, /var/www]
    ports: [{name: http, containerPort: 8080}]
    readinessProbe:
      httpGet: {path: /, port: http}
      periodSeconds: 1
    livenessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 2
`

const sensorPod = `apiVersion: v1
kind: Pod
metadata: {name: sensor}
spec:
  containers:
  - name: sampler
    image: ` + env.TestImage + `
    command: [sh, -c, 'echo "started on $NODE_NAME"; while true; do sleep 1; done']
    env:
    - name: NODE_NAME
      valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
`

func podManifest(name, policy, script string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s}
spec:
  restartPolicy: %s
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: %s
    command: [sh, -c, %q]
`, name, policy, env.TestImage, script)
}

// TestE2EStaticPodLifecycle runs static pods from manifest files on a real
// containerd: a web server with probes reachable on its pod IP, a crash
// loop with backoff, OnFailure and Never pods, ignored file names, logs,
// and a removed manifest stopping its pod.
func TestE2EStaticPodLifecycle(t *testing.T) {
	n := newNode(t, "e2e-life")
	n.write("web.yaml", webPod)
	n.write("crash.yaml", podManifest("crash", "Always", "echo boom; exit 1"))
	n.write("once.yaml", podManifest("once", "OnFailure", "echo done; exit 0"))
	n.write("never.yaml", podManifest("never", "Never", "exit 2"))
	for _, ignored := range []string{"web.yaml.bak", ".web.yaml.swp", "other.backup", "README", "web.yaml~"} {
		n.write(ignored, strings.Replace(webPod, "name: web,", "name: ignored,", 1))
	}
	n.start()

	web := n.waitPod("web-e2e-life", 60*time.Second, "running and ready", func(p *agent.PodInfo) bool { return running(p) && ready(p) })
	if web.Status.PodIP == "" || !strings.HasPrefix(web.Status.PodIP, "10.42.0.") {
		t.Fatalf("web pod IP %q, want one from 10.42.0.0/24", web.Status.PodIP)
	}
	out, err := n.fetch("http://" + web.Status.PodIP + ":8080/")
	if err != nil || !strings.Contains(out, "hello from outpost") {
		t.Fatalf("fetch from pod IP: %v: %q", err, out)
	}
	n.checkShimStart(t)
	n.checkShimProcs(t)

	n.waitPod("crash-e2e-life", 60*time.Second, "restarted and backing off", func(p *agent.PodInfo) bool {
		c := p.Status.ContainerStatuses[0]
		return c.RestartCount >= 1 && c.State.Waiting != nil && c.State.Waiting.Reason == "CrashLoopBackOff" &&
			c.LastTerminationState.Terminated != nil && c.LastTerminationState.Terminated.ExitCode == 1
	})
	n.waitPod("once-e2e-life", 30*time.Second, "Succeeded", func(p *agent.PodInfo) bool { return p.Status.Phase == corev1.PodSucceeded })
	never := n.waitPod("never-e2e-life", 30*time.Second, "Failed", func(p *agent.PodInfo) bool { return p.Status.Phase == corev1.PodFailed })
	if c := never.Status.ContainerStatuses[0]; c.RestartCount != 0 || c.State.Terminated == nil || c.State.Terminated.ExitCode != 2 {
		t.Fatalf("Never pod restarted or lost its exit code: %+v", c)
	}

	s, err := n.status()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Pods) != 4 {
		var names []string
		for _, p := range s.Pods {
			names = append(names, p.Name)
		}
		t.Fatalf("pods %v: ignored file names were read", names)
	}

	logs, err := n.outpost("logs", "default/crash-e2e-life", "--previous")
	if err != nil || !strings.Contains(logs, "boom") {
		t.Fatalf("logs --previous: %v: %q", err, logs)
	}
	if got, _ := n.outpost("logs", "once-e2e-life"); !strings.Contains(got, "done") {
		t.Fatalf("logs of once: %q", got)
	}

	// A removed file stops its pod and removes its containers.
	os.Remove(filepath.Join(n.manifests, "crash.yaml"))
	deadline := time.Now().Add(20 * time.Second)
	within(20*time.Second).For(t, "the pod of a removed manifest gone from the status", func() (bool, string) {
		s, err := n.status()
		return err == nil && findPod(s, "crash-e2e-life") == nil, fmt.Sprintf("status error %v", err)
	})
	for time.Now().Before(deadline) {
		if !strings.Contains(run(t, "ctr", "-a", n.ctrd.Address, "-n", n.ns, "containers", "ls", "-q"), "-main-") ||
			!strings.Contains(run(t, "ctr", "-a", n.ctrd.Address, "-n", n.ns, "containers", "ls", "-q"), "crash") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if ls := run(t, "ctr", "-a", n.ctrd.Address, "-n", n.ns, "containers", "ls"); strings.Contains(ls, "crash") {
		t.Fatalf("containers of the removed pod remain:\n%s", ls)
	}
}

// TestE2EImageGroupsInEveryContainer: a container's process has the
// groups the image's /etc/group gives its user (root is in wheel, 10,
// in the test image), also when the pods of one image start at once and
// the runtime reads the image for the first of them only.
func TestE2EImageGroupsInEveryContainer(t *testing.T) {
	n := newNode(t, "e2e-groups")
	const pods = 4
	for i := range pods {
		n.write(fmt.Sprintf("groups-%d.yaml", i), podManifest(fmt.Sprintf("groups-%d", i), "Never", "grep Groups /proc/self/status"))
	}
	n.start()
	for i := range pods {
		name := fmt.Sprintf("groups-%d-e2e-groups", i)
		logs := n.succeededLogs(name)
		if !slices.Equal(groupsLine(logs), []string{"0", "10"}) {
			t.Fatalf("pod %s: process groups %q, want 0 and 10 (root and wheel)", name, logs)
		}
	}
}

// TestE2ENoTmpfsOnRun: as under CRI, a container's /run is the image's,
// not the tmpfs of containerd's default spec, which would hide what the
// image has there; a volume mounted on /run is still mounted.
func TestE2ENoTmpfsOnRun(t *testing.T) {
	n := newNode(t, "e2e-run")
	const check = `if grep " /run " /proc/mounts; then :; else echo "no mount on /run"; fi`
	n.write("plain.yaml", podManifest("plain", "Never", check))
	n.write("vol.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: vol}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: %s
    command: [sh, -c, %q]
    volumeMounts: [{name: run, mountPath: /run}]
  volumes:
  - name: run
    emptyDir: {medium: Memory}
`, env.TestImage, check))
	n.start()
	for name, want := range map[string]string{"plain-e2e-run": "no mount on /run", "vol-e2e-run": " /run tmpfs "} {
		logs := n.succeededLogs(name)
		if !strings.Contains(logs, want) {
			t.Errorf("pod %s: /run mounts %q, want %q", name, logs, want)
		}
	}
}

// TestE2EHostPIDAndIPC: a pod with hostPID and hostIPC runs in the
// host's PID and IPC namespaces, with the host's /dev/shm; a pod without
// them has namespaces of its own.
func TestE2EHostPIDAndIPC(t *testing.T) {
	n := newNode(t, "e2e-hostns")
	shm, err := os.CreateTemp("/dev/shm", "outpost-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	shm.Close()
	t.Cleanup(func() { os.Remove(shm.Name()) })
	script := fmt.Sprintf(`echo "pid $(readlink /proc/self/ns/pid) ipc $(readlink /proc/self/ns/ipc)"; test -e %s && echo "host shm"; :`, shm.Name())
	n.write("own.yaml", podManifest("own", "Never", script))
	n.write("host.yaml", strings.Replace(podManifest("host", "Never", script), "spec:\n", "spec:\n  hostPID: true\n  hostIPC: true\n", 1))
	n.start()
	var hostNS []string
	for _, ns := range []string{"pid", "ipc"} {
		l, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil {
			t.Fatal(err)
		}
		hostNS = append(hostNS, ns+" "+l)
	}
	hostNS = append(hostNS, "host shm")
	for name, host := range map[string]bool{"own-e2e-hostns": false, "host-e2e-hostns": true} {
		logs := n.succeededLogs(name)
		for _, want := range hostNS {
			if strings.Contains(logs, want) != host {
				t.Errorf("pod %s: %q, the host's %q: in it %v, want %v", name, logs, want, !host, host)
			}
		}
	}
}

// succeededLogs waits up to a minute for pod name to succeed and returns
// what `outpost logs` prints of it.
func (n *node) succeededLogs(name string) string {
	n.t.Helper()
	n.waitPod(name, 60*time.Second, "Succeeded", func(p *agent.PodInfo) bool { return p.Status.Phase == corev1.PodSucceeded })
	logs, err := n.outpost("logs", name)
	if err != nil {
		n.t.Fatalf("logs of %s: %v\n%s", name, err, logs)
	}
	return logs
}

// groupsLine returns the groups of a /proc/PID/status Groups line in out.
func groupsLine(out string) []string {
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "Groups:" {
			return f[1:]
		}
	}
	return nil
}

// containerIDs maps each container of the pods to its ID and start time,
// as the running agent sees them.
func containerIDs(t *testing.T, n *node, pods ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, name := range pods {
		p := n.waitPod(name, 30*time.Second, "synced", func(*agent.PodInfo) bool { return true })
		for _, c := range p.Status.ContainerStatuses {
			if c.State.Running == nil {
				t.Fatalf("pod %s container %s not running", name, c.Name)
			}
			out[name+"/"+c.Name] = fmt.Sprintf("%s@%s restarts=%d", c.ContainerID, c.State.Running.StartedAt.UTC().Format(time.RFC3339), c.RestartCount)
		}
	}
	return out
}

// TestE2EAgentRestartKeepsContainers kills the agent with SIGKILL and
// starts it again: the same containers keep running (same IDs and start
// times), and the logs keep flowing.
func TestE2EAgentRestartKeepsContainers(t *testing.T) {
	n := newNode(t, "e2e-restart")
	n.write("web.yaml", webPod)
	n.write("sensor.yaml", sensorPod)
	n.start()
	n.waitPod("web-e2e-restart", 60*time.Second, "ready", func(p *agent.PodInfo) bool { return running(p) && ready(p) })
	n.waitPod("sensor-e2e-restart", 60*time.Second, "running", running)
	before := containerIDs(t, n, "web-e2e-restart", "sensor-e2e-restart")

	for i := range 3 {
		n.kill()
		n.start()
		n.waitPod("web-e2e-restart", 30*time.Second, "ready again", func(p *agent.PodInfo) bool { return running(p) && ready(p) })
		after := containerIDs(t, n, "web-e2e-restart", "sensor-e2e-restart")
		for k, v := range before {
			if after[k] != v {
				t.Fatalf("restart %d: container %s changed: %s → %s", i+1, k, v, after[k])
			}
		}
	}
	logs, err := n.outpost("logs", "sensor-e2e-restart")
	if err != nil || !strings.Contains(logs, "started on e2e-restart") {
		t.Fatalf("sensor logs: %v %q", err, logs)
	}
}

// TestE2EPowerCutRecovery simulates a power cut with no network: agent,
// containerd, shims and containers all killed at once, containerd's
// runtime state wiped as a reboot wipes /run, the node's network
// namespace recreated empty. Started again, the agent brings every pod back
// from its store, with the same pod IPs.
func TestE2EPowerCutRecovery(t *testing.T) {
	n := newNode(t, "e2e-power")
	n.write("web.yaml", webPod)
	n.write("sensor.yaml", sensorPod)
	n.start()
	web, _ := n.waitWebAndSensor("")
	ip := web.Status.PodIP

	n.powerCut(t)

	start := time.Now()
	n.start()
	web, _ = n.waitWebAndSensor("back, ")
	took := time.Since(start)
	t.Logf("pods back %v after the agent started", took.Round(10*time.Millisecond))
	if took > 5*time.Second {
		b, _ := os.ReadFile(filepath.Join(n.dir, "agent.log"))
		t.Logf("slow recovery; agent log:\n%s", b)
	}
	if web.Status.PodIP != ip {
		t.Fatalf("pod IP changed across the power cut: %s → %s", ip, web.Status.PodIP)
	}
	if c := web.Status.ContainerStatuses[0]; c.RestartCount != 1 {
		t.Fatalf("restart count after power cut = %d, want 1", c.RestartCount)
	}
	out, err := n.fetch("http://" + ip + ":8080/")
	if err != nil || !strings.Contains(out, "hello from outpost") {
		t.Fatalf("fetch after power cut: %v: %q", err, out)
	}
}

// TestE2EPowerCutStartsTheSpares runs the pods until the agent has made
// each container's next attempt ahead (a spare, agent/spare.go), cuts the
// power, and checks that the agent started again brings the pods back on
// their spares, reachable in their networks, logging, and that each gets
// a spare again.
func TestE2EPowerCutStartsTheSpares(t *testing.T) {
	n := newNode(t, "e2e-spare")
	n.write("web.yaml", webPod)
	n.write("sensor.yaml", sensorPod)
	n.start()
	web, _ := n.waitWebAndSensor("")
	ip := web.Status.PodIP
	spares := n.waitSpares(t, 2)
	for _, id := range spares {
		if !strings.HasSuffix(id, "-1") {
			t.Fatalf("spares %q: want each one of attempt 1", spares)
		}
	}

	n.powerCut(t)
	n.start()
	web, sensor := n.waitWebAndSensor("back, ")
	for _, p := range []*agent.PodInfo{web, sensor} {
		c := p.Status.ContainerStatuses[0]
		if id := strings.TrimPrefix(c.ContainerID, "containerd://"); !slices.Contains(spares, id) || c.RestartCount != 1 {
			t.Errorf("pod %s runs %s (restarts %d) after the power cut, want one of the spares %q (restarts 1)", p.Name, c.ContainerID, c.RestartCount, spares)
		}
	}
	if out, err := n.fetch("http://" + ip + ":8080/"); err != nil || !strings.Contains(out, "hello from outpost") {
		t.Fatalf("fetch after power cut: %v: %q", err, out)
	}
	n.waitLogs("sensor-e2e-spare", 10*time.Second, "started on e2e-spare")
	// The attempts started from the spares get theirs in turn.
	for _, id := range n.waitSpares(t, 2) {
		if !strings.HasSuffix(id, "-2") {
			t.Fatalf("spares after the power cut %q: want each one of attempt 2", id)
		}
	}
}

// waitWebAndSensor waits until webPod is ready and sensorPod running on
// the node (what prefixes the waits' descriptions) and returns them.
func (n *node) waitWebAndSensor(what string) (web, sensor *agent.PodInfo) {
	n.t.Helper()
	web = n.waitPod("web-"+n.name, 60*time.Second, what+"ready", func(p *agent.PodInfo) bool { return running(p) && ready(p) })
	sensor = n.waitPod("sensor-"+n.name, 60*time.Second, what+"running", running)
	return web, sensor
}

// waitSpares waits, for at most 30 s, until the node's containerd holds
// want spares and returns their IDs.
func (n *node) waitSpares(t *testing.T, want int) []string {
	t.Helper()
	cl := n.ctrd.Client(t, n.ns)
	var ids []string
	within(30*time.Second).For(t, fmt.Sprintf("%d spares", want), func() (bool, string) {
		var err error
		if ids, err = spareIDs(namespacesCtx(context.Background(), n.ns), cl); err != nil {
			return false, err.Error()
		}
		return len(ids) == want, fmt.Sprintf("%q", ids)
	})
	return ids
}

// spareIDs returns the IDs of the spares in cl's namespace in ctx: the
// containers with the agent's spare label that have no task (never
// started).
func spareIDs(ctx context.Context, cl *client.Client) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cs, err := cl.Containers(ctx, fmt.Sprintf("labels.%q", agent.LabelSpare))
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, c := range cs {
		if _, err := c.Task(ctx, nil); errdefs.IsNotFound(err) {
			ids = append(ids, c.ID())
		}
	}
	return ids, nil
}

// powerCut kills the agent and cuts the node's power: containerd, its
// shims and the containers die at once, and what a reboot empties goes.
func (n *node) powerCut(t *testing.T) {
	t.Helper()
	n.kill()
	n.ctrd.PowerCutThen(t, func() {
		// A reboot empties /run, runc's state with it.
		os.RemoveAll(filepath.Join("/run/containerd/runc", n.ns))
		// A reboot loses every network namespace and the bridge: the
		// test's are this node's pods' (and the node's own, made anew).
		n.removePodNetns()
		run(t, "ip", "netns", "delete", n.netns)
		addNetns(t, n.netns)
	})
}

// checkShimStart checks that containerd started the node's running tasks
// with the shim start binary beside outpost (TestMain builds it there, as
// the packages install it): containerd 1.6 and later record a task's
// runtime binary in its bundle.
func (n *node) checkShimStart(t *testing.T) {
	t.Helper()
	want := filepath.Join(filepath.Dir(outpostBin), "containerd-shim-outpost-v2")
	tasks := n.runningTasks(t)
	if len(tasks) == 0 {
		t.Fatal("no running task")
	}
	for id := range tasks {
		got, err := os.ReadFile(filepath.Join(n.ctrd.State, "io.containerd.runtime.v2.task", n.ns, id, "shim-binary-path"))
		if err != nil || string(got) != want {
			t.Errorf("task %s: runtime binary %q (%v), want %s", id, got, err, want)
		}
	}
}

// checkShimProcs checks that the runc shims serving the node's
// containerd run with GOMAXPROCS 1 when it is containerd 1.6 or 1.7:
// containerd-shim-outpost-v2 starts their runc shims so, where their
// own start gives 4 (2's runc shim starts its own).
func (n *node) checkShimProcs(t *testing.T) {
	t.Helper()
	gomaxprocs := ""
	if v := strings.TrimPrefix(n.ctrd.Version, "v"); strings.HasPrefix(v, "1.6.") || strings.HasPrefix(v, "1.7.") {
		gomaxprocs = "1"
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	shims := 0
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		args := strings.Split(string(cmdline), "\x00")
		if err != nil || !strings.HasSuffix(args[0], "containerd-shim-runc-v2") || !slices.Contains(args, n.ctrd.Address) {
			continue
		}
		shims++
		environ, err := os.ReadFile(filepath.Join(filepath.Dir(p), "environ"))
		if err != nil {
			continue // gone meanwhile
		}
		var got string
		for _, kv := range strings.Split(string(environ), "\x00") {
			if v, ok := strings.CutPrefix(kv, "GOMAXPROCS="); ok {
				got = v // the last one counts
			}
		}
		if gomaxprocs != "" && got != gomaxprocs {
			t.Errorf("runc shim %s %q: GOMAXPROCS=%s, want %s", filepath.Base(filepath.Dir(p)), args, got, gomaxprocs)
		}
	}
	if shims == 0 {
		t.Error("no runc shim serves the node's containerd")
	}
}
