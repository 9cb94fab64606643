package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// waitLogs polls `outpost logs` of a pod (with its args, such as -c) until
// want is in them, for at most timeout, and returns the logs.
func (n *node) waitLogs(pod string, timeout time.Duration, want string, args ...string) string {
	n.t.Helper()
	var out string
	within(timeout).For(n.t, fmt.Sprintf("%q in the logs of %s %v", want, pod, args), func() (bool, string) {
		var err error
		out, err = n.outpost(append([]string{"logs", pod}, args...)...)
		return err == nil && strings.Contains(out, want), fmt.Sprintf("%v\n%s", err, out)
	})
	return out
}

// unmountAtExit kills the agent at the end of the test and unmounts what
// it left mounted below the node's directory (the tmpfs of secret and
// projected volumes), which would otherwise keep the temp dir from being
// removed. The pods' containers may still run: they have copies of the
// mounts in their own mount namespaces.
func (n *node) unmountAtExit() {
	n.t.Cleanup(func() {
		n.kill()
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			n.t.Logf("read mountinfo: %v", err)
			return
		}
		var below []string
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], n.dir+"/") {
				below = append(below, f[4])
			}
		}
		for i := len(below) - 1; i >= 0; i-- { // innermost first
			unmount(below[i])
		}
	})
}

// hasEvent reports whether the pod has an event of that reason whose
// message contains msg.
func hasEvent(p *agent.PodInfo, reason, msg string) bool {
	for _, e := range p.Events {
		if e.Reason == reason && strings.Contains(e.Message, msg) {
			return true
		}
	}
	return false
}

// TestE2ELivenessRestart runs a container whose exec liveness probe fails
// after a few seconds: the agent kills it and starts it again, counting the
// restart (restartCount 1, the last termination kept) and recording an
// Unhealthy event, while the pod stays Running.
func TestE2ELivenessRestart(t *testing.T) {
	n := newNode(t, "e2e-live")
	n.write("live.yaml", `apiVersion: v1
kind: Pod
metadata: {name: live}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: `+env.TestImage+`
    command: [sh, -c, 'touch /tmp/healthy; sleep 3; rm /tmp/healthy; sleep 600']
    livenessProbe:
      exec: {command: [test, -f, /tmp/healthy]}
      periodSeconds: 1
      failureThreshold: 1
`)
	n.start()
	first := n.waitPod("live-e2e-live", 30*time.Second, "running", running)
	firstID := first.Status.ContainerStatuses[0].ContainerID

	p := n.waitPod("live-e2e-live", 35*time.Second, "restarted once by its liveness probe", func(p *agent.PodInfo) bool {
		c := p.Status.ContainerStatuses[0]
		return c.RestartCount == 1 && c.State.Running != nil
	})
	c := p.Status.ContainerStatuses[0]
	if c.ContainerID == firstID {
		t.Fatalf("restart count 1 but the same container %s", c.ContainerID)
	}
	if last := c.LastTerminationState.Terminated; last == nil || last.ContainerID != firstID {
		t.Fatalf("last termination state %+v, want the first container %s", c.LastTerminationState, firstID)
	}
	if p.Status.Phase != corev1.PodRunning {
		t.Fatalf("phase %s, want Running", p.Status.Phase)
	}
	if !hasEvent(p, "Unhealthy", "Liveness probe failed") {
		t.Fatalf("no Unhealthy liveness event: %+v", p.Events)
	}
}

// TestE2EReadinessToggles runs a container that creates and removes the
// file its exec readiness probe tests, in a loop: the pod's Ready condition
// goes True, then False, then True again, with the container never
// restarted.
func TestE2EReadinessToggles(t *testing.T) {
	n := newNode(t, "e2e-ready")
	n.write("flip.yaml", `apiVersion: v1
kind: Pod
metadata: {name: flip}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: `+env.TestImage+`
    command: [sh, -c, 'while true; do touch /tmp/ready; sleep 3; rm -f /tmp/ready; sleep 3; done']
    readinessProbe:
      exec: {command: [test, -f, /tmp/ready]}
      periodSeconds: 1
      failureThreshold: 1
`)
	n.start()
	notRestarted := func(p *agent.PodInfo) bool {
		return running(p) && p.Status.ContainerStatuses[0].RestartCount == 0
	}
	n.waitPod("flip-e2e-ready", 30*time.Second, "ready", func(p *agent.PodInfo) bool { return notRestarted(p) && ready(p) })
	p := n.waitPod("flip-e2e-ready", 15*time.Second, "not ready", func(p *agent.PodInfo) bool { return notRestarted(p) && !ready(p) })
	if p.Status.ContainerStatuses[0].Ready {
		t.Fatalf("pod not Ready but its container is: %+v", p.Status.ContainerStatuses[0])
	}
	p = n.waitPod("flip-e2e-ready", 15*time.Second, "ready again", func(p *agent.PodInfo) bool { return notRestarted(p) && ready(p) })
	if !p.Status.ContainerStatuses[0].Ready {
		t.Fatalf("pod Ready but its container is not: %+v", p.Status.ContainerStatuses[0])
	}
}

// TestE2EInitContainers runs two init containers that append to a shared
// emptyDir, the second checking that the first ran, then a main container
// that prints the file: both lines arrive in order, and both init
// containers end terminated with exit code 0.
func TestE2EInitContainers(t *testing.T) {
	n := newNode(t, "e2e-init")
	n.write("init.yaml", `apiVersion: v1
kind: Pod
metadata: {name: init}
spec:
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: first
    image: `+env.TestImage+`
    command: [sh, -c, 'echo first >> /work/out']
    volumeMounts: [{name: work, mountPath: /work}]
  - name: second
    image: `+env.TestImage+`
    command: [sh, -c, 'test "$(cat /work/out)" = first && echo second >> /work/out']
    volumeMounts: [{name: work, mountPath: /work}]
  containers:
  - name: main
    image: `+env.TestImage+`
    command: [sh, -c, 'cat /work/out; echo end; sleep 600']
    volumeMounts: [{name: work, mountPath: /work}]
  volumes:
  - name: work
    emptyDir: {}
`)
	n.start()
	p := n.waitPod("init-e2e-init", 30*time.Second, "running", running)
	if len(p.Status.InitContainerStatuses) != 2 {
		t.Fatalf("init container statuses: %+v", p.Status.InitContainerStatuses)
	}
	for i, want := range []string{"first", "second"} {
		c := p.Status.InitContainerStatuses[i]
		if c.Name != want || c.State.Terminated == nil || c.State.Terminated.ExitCode != 0 || c.RestartCount != 0 {
			t.Fatalf("init container %d: %+v, want %s terminated with exit 0 and no restart", i, c, want)
		}
	}
	if !ready(p) {
		t.Fatalf("pod running with init done but not Ready: %+v", p.Status.Conditions)
	}
	logs := n.waitLogs("init-e2e-init", 10*time.Second, "end", "-c", "main")
	if logs != "first\nsecond\nend\n" {
		t.Fatalf("main container printed %q, want the init containers' lines in order", logs)
	}
}

const configObjects = `apiVersion: v1
kind: ConfigMap
metadata: {name: app-config}
data:
  greeting: %s
  mode: fast
---
apiVersion: v1
kind: Secret
metadata: {name: app-secret}
stringData:
  password: s3cret
  token: tok123
`

// TestE2EConfigMapSecretDownwardAPI runs a pod on a static ConfigMap and
// Secret: configMap and secret volumes with items and defaultMode, a
// downwardAPI volume of the labels, env from configMapKeyRef, secretKeyRef
// and fieldRef, and envFrom with prefixes. The container prints what it
// sees. Editing the ConfigMap's manifest then changes the mounted file
// inside the running container, which is not restarted.
func TestE2EConfigMapSecretDownwardAPI(t *testing.T) {
	n := newNode(t, "e2e-conf")
	n.unmountAtExit()
	n.write("config.yaml", fmt.Sprintf(configObjects, "hello"))
	n.write("conf.yaml", `apiVersion: v1
kind: Pod
metadata: {name: conf, labels: {app: conf, tier: edge}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: `+env.TestImage+`
    command:
    - sh
    - -c
    - |
      echo "env GREETING=$GREETING PASSWORD=$PASSWORD MY_POD=$MY_POD MY_NODE=$MY_NODE CM_mode=$CM_mode SEC_token=$SEC_token"
      echo "cfg files: $(ls /etc/cfg) mode $(stat -L -c %a /etc/cfg/greet.txt)"
      echo "sec files: $(ls /etc/sec) mode $(stat -L -c %a /etc/sec/tok) value $(cat /etc/sec/tok)"
      echo "labels: $(cat /etc/info/labels)"
      while true; do echo "greet=$(cat /etc/cfg/greet.txt)"; sleep 1; done
    env:
    - name: GREETING
      valueFrom: {configMapKeyRef: {name: app-config, key: greeting}}
    - name: PASSWORD
      valueFrom: {secretKeyRef: {name: app-secret, key: password}}
    - name: MY_POD
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: MY_NODE
      valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
    envFrom:
    - prefix: CM_
      configMapRef: {name: app-config}
    - prefix: SEC_
      secretRef: {name: app-secret}
    volumeMounts:
    - {name: cfg, mountPath: /etc/cfg}
    - {name: sec, mountPath: /etc/sec}
    - {name: info, mountPath: /etc/info}
  volumes:
  - name: cfg
    configMap:
      name: app-config
      defaultMode: 0440
      items: [{key: greeting, path: greet.txt}]
  - name: sec
    secret:
      secretName: app-secret
      defaultMode: 0400
      items: [{key: token, path: tok}]
  - name: info
    downwardAPI:
      items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]
`)
	n.start()
	first := n.waitPod("conf-e2e-conf", 30*time.Second, "running", running)
	logs := n.waitLogs("conf-e2e-conf", 10*time.Second, "greet=")
	for _, want := range []string{
		"env GREETING=hello PASSWORD=s3cret MY_POD=conf-e2e-conf MY_NODE=e2e-conf CM_mode=fast SEC_token=tok123\n",
		"cfg files: greet.txt mode 440\n",
		"sec files: tok mode 400 value tok123\n",
		`labels: app="conf"` + "\n",
		"greet=hello\n",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
	if !strings.Contains(logs, `tier="edge"`) {
		t.Errorf("downwardAPI labels lack tier=\"edge\":\n%s", logs)
	}
	if t.Failed() {
		t.FailNow()
	}

	n.write("config.yaml", fmt.Sprintf(configObjects, "bonjour"))
	n.waitLogs("conf-e2e-conf", 25*time.Second, "greet=bonjour")
	p := n.waitPod("conf-e2e-conf", 5*time.Second, "running", running)
	if got, want := p.Status.ContainerStatuses[0].ContainerID, first.Status.ContainerStatuses[0].ContainerID; got != want {
		t.Fatalf("container changed from %s to %s on a ConfigMap edit; want the file updated in place", want, got)
	}
}

// TestE2EMissingConfigMap runs pods that reference a ConfigMap that does
// not exist, by env and by volume, beside a pod that needs none: as with
// kubelet, the one by env waits with reason CreateContainerConfigError
// naming the ConfigMap, the one by volume in ContainerCreating with a
// FailedMount event naming it, while the third runs. Adding the
// ConfigMap starts them.
func TestE2EMissingConfigMap(t *testing.T) {
	n := newNode(t, "e2e-missing")
	n.write("byenv.yaml", `apiVersion: v1
kind: Pod
metadata: {name: byenv}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: `+env.TestImage+`
    command: [sh, -c, 'echo "value=$VALUE"; sleep 600']
    env:
    - name: VALUE
      valueFrom: {configMapKeyRef: {name: absent, key: value}}
`)
	n.write("byvol.yaml", `apiVersion: v1
kind: Pod
metadata: {name: byvol}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: `+env.TestImage+`
    command: [sh, -c, 'echo "file=$(cat /cfg/value)"; sleep 600']
    volumeMounts: [{name: cfg, mountPath: /cfg}]
  volumes:
  - name: cfg
    configMap: {name: absent}
`)
	n.write("ok.yaml", podManifest("ok", "Always", "sleep 600"))
	n.start()
	n.waitPod("ok-e2e-missing", 30*time.Second, "running", running)
	for _, name := range []string{"byenv-e2e-missing", "byvol-e2e-missing"} {
		reason := "CreateContainerConfigError"
		if name == "byvol-e2e-missing" {
			reason = "ContainerCreating"
		}
		p := n.waitPod(name, 15*time.Second, "waiting with "+reason+" and the ConfigMap named", func(p *agent.PodInfo) bool {
			w := p.Status.ContainerStatuses[0].State.Waiting
			if w == nil || w.Reason != reason {
				return false
			}
			if reason == "CreateContainerConfigError" {
				return strings.Contains(w.Message, "absent")
			}
			for _, e := range p.Events {
				if e.Reason == "FailedMount" && strings.Contains(e.Message, "absent") {
					return true
				}
			}
			return false
		})
		if p.Status.Phase != corev1.PodPending || ready(p) {
			t.Fatalf("pod %s: phase %s ready %v, want Pending and not ready", name, p.Status.Phase, ready(p))
		}
	}
	// The pod without the reference was not held up by the others.
	n.waitPod("ok-e2e-missing", 5*time.Second, "still running", running)

	n.write("absent.yaml", `apiVersion: v1
kind: ConfigMap
metadata: {name: absent}
data: {value: here}
`)
	n.waitPod("byenv-e2e-missing", 15*time.Second, "running once the ConfigMap exists", running)
	n.waitPod("byvol-e2e-missing", 15*time.Second, "running once the ConfigMap exists", running)
	n.waitLogs("byenv-e2e-missing", 5*time.Second, "value=here")
	n.waitLogs("byvol-e2e-missing", 5*time.Second, "file=here")
}

// TestE2EHostPort runs busybox httpd on containerPort 8080 published as
// hostPort 18080, and fetches it from inside the node's network namespace
// through the node's own address (the bridge gateway, 10.42.0.1:18080):
// the DNAT rule for traffic the node itself sends reaches the pod.
func TestE2EHostPort(t *testing.T) {
	n := newNode(t, "e2e-hostport")
	n.write("hp.yaml", `apiVersion: v1
kind: Pod
metadata: {name: hp}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: `+env.TestImage+`
    command: [sh, -c, 'mkdir -p /www && echo "served by hostport pod" > /www/index.html && exec httpd -f -p 8080 -h /www']
    ports: [{containerPort: 8080, hostPort: 18080}]
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
`)
	n.start()
	p := n.waitPod("hp-e2e-hostport", 30*time.Second, "running and ready", func(p *agent.PodInfo) bool { return running(p) && ready(p) })
	// The pod itself answers on its own address and port.
	if out, err := n.fetch("http://" + p.Status.PodIP + ":8080/"); err != nil || !strings.Contains(out, "served by hostport pod") {
		t.Fatalf("fetch from pod IP: %v: %q", err, out)
	}
	within(10*time.Second).For(t, "the pod's page through hostPort 10.42.0.1:18080", func() (bool, string) {
		out, err := n.fetch("http://10.42.0.1:18080/")
		return err == nil && strings.Contains(out, "served by hostport pod"), fmt.Sprintf("%v: %q", err, out)
	})
}

// TestE2EPreStopGraceful runs a pod with a preStop exec hook and a SIGTERM
// trap that both append to a file in a hostPath volume, and a grace period
// of 3 s. Removing its manifest runs the hook, then sends SIGTERM (the file
// reads "prestop" then "term"), and the pod is gone within 10 s.
func TestE2EPreStopGraceful(t *testing.T) {
	n := newNode(t, "e2e-prestop")
	marker := t.TempDir()
	n.write("stop.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: stop}
spec:
  terminationGracePeriodSeconds: 3
  containers:
  - name: main
    image: %s
    command: [sh, -c, 'trap "echo term >> /marker/log; exit 0" TERM; echo up; while true; do sleep 1; done']
    volumeMounts: [{name: marker, mountPath: /marker}]
    lifecycle:
      preStop:
        exec: {command: [sh, -c, 'echo prestop >> /marker/log']}
  volumes:
  - name: marker
    hostPath: {path: %s, type: Directory}
`, env.TestImage, marker))
	n.start()
	n.waitPod("stop-e2e-prestop", 30*time.Second, "running", running)
	n.waitLogs("stop-e2e-prestop", 10*time.Second, "up")

	if err := os.Remove(filepath.Join(n.manifests, "stop.yaml")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	within(10*time.Second).For(t, "the pod of the removed manifest gone from the agent's status", func() (bool, string) {
		s, err := n.status()
		if err != nil {
			return false, err.Error()
		}
		if s.From != "agent" {
			return false, "status from " + s.From
		}
		return findPod(s, "stop-e2e-prestop") == nil, "the pod still listed"
	})
	for time.Since(start) < 10*time.Second {
		if !strings.Contains(run(t, "ctr", "-a", n.ctrd.Address, "-n", n.ns, "containers", "ls", "-q"), "-main-") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if ls := run(t, "ctr", "-a", n.ctrd.Address, "-n", n.ns, "containers", "ls", "-q"); strings.Contains(ls, "-main-") {
		t.Fatalf("container of the removed pod remains after 10 s:\n%s", ls)
	}
	t.Logf("pod gone %v after its manifest was removed", time.Since(start).Round(10*time.Millisecond))
	b, err := os.ReadFile(filepath.Join(marker, "log"))
	if err != nil {
		t.Fatalf("preStop marker: %v", err)
	}
	if string(b) != "prestop\nterm\n" {
		t.Fatalf("marker file %q, want the preStop hook's line then the SIGTERM trap's", b)
	}
}

// TestE2EImageStopSignal: a container whose image names a stop signal
// (STOPSIGNAL SIGUSR1) gets that signal when its pod stops, not SIGTERM,
// as kubelet with containerd's CRI sends it.
func TestE2EImageStopSignal(t *testing.T) {
	n := newNode(t, "e2e-stopsig")
	const image = "outpost.test/stopsignal:1"
	n.ctrd.ImportImageConfig(t, n.ns, image, env.ImageConfig{Cmd: []string{"sh"}, StopSignal: "SIGUSR1"})
	marker := t.TempDir()
	n.write("sig.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: sig}
spec:
  terminationGracePeriodSeconds: 10
  containers:
  - name: main
    image: %s
    command: [sh, -c, 'trap "echo usr1 >> /marker/log; exit 0" USR1; trap "echo term >> /marker/log; exit 0" TERM; echo up; while true; do sleep 1; done']
    volumeMounts: [{name: marker, mountPath: /marker}]
  volumes:
  - name: marker
    hostPath: {path: %s, type: Directory}
`, image, marker))
	n.start()
	n.waitPod("sig-e2e-stopsig", 30*time.Second, "running", running)
	n.waitLogs("sig-e2e-stopsig", 10*time.Second, "up")
	if err := os.Remove(filepath.Join(n.manifests, "sig.yaml")); err != nil {
		t.Fatal(err)
	}
	within(8*time.Second).For(t, "the trap's line in the marker file", func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(marker, "log"))
		return err == nil && len(b) > 0, fmt.Sprintf("%q, %v", b, err)
	})
	if b, _ := os.ReadFile(filepath.Join(marker, "log")); string(b) != "usr1\n" {
		t.Fatalf("marker file %q, want the SIGUSR1 trap's line: the image's stop signal", b)
	}
}

// TestE2EStartupProbeGatesLiveness runs a container that takes 4 s to
// start, with a liveness probe that fails until then: the startup probe
// holds liveness and readiness back, so the container is never restarted,
// and it becomes started and ready only after its startup probe passes.
func TestE2EStartupProbeGatesLiveness(t *testing.T) {
	n := newNode(t, "e2e-startup")
	n.write("slow.yaml", `apiVersion: v1
kind: Pod
metadata: {name: slow}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: `+env.TestImage+`
    command: [sh, -c, 'sleep 4; touch /tmp/started; while true; do sleep 1; done']
    startupProbe:
      exec: {command: [test, -f, /tmp/started]}
      periodSeconds: 1
      failureThreshold: 30
    livenessProbe:
      exec: {command: [test, -f, /tmp/started]}
      periodSeconds: 1
      failureThreshold: 1
    readinessProbe:
      exec: {command: ["true"]}
      periodSeconds: 1
`)
	n.start()
	early := n.waitPod("slow-e2e-startup", 30*time.Second, "running, not yet started", func(p *agent.PodInfo) bool {
		c := p.Status.ContainerStatuses[0]
		return c.State.Running != nil && c.Started != nil && !*c.Started
	})
	if c := early.Status.ContainerStatuses[0]; c.Ready {
		t.Fatalf("ready before the startup probe passed: %+v", c)
	}
	late := n.waitPod("slow-e2e-startup", 30*time.Second, "started and ready", func(p *agent.PodInfo) bool {
		c := p.Status.ContainerStatuses[0]
		return c.Started != nil && *c.Started && c.Ready
	})
	if c := late.Status.ContainerStatuses[0]; c.RestartCount != 0 {
		t.Fatalf("liveness ran before startup passed: restart count %d", c.RestartCount)
	}
	// Liveness now runs and keeps passing.
	time.Sleep(3 * time.Second)
	after := n.waitPod("slow-e2e-startup", 10*time.Second, "still running", running)
	if c := after.Status.ContainerStatuses[0]; c.RestartCount != 0 {
		t.Fatalf("restart count %d after startup, want 0", c.RestartCount)
	}
}

// TestE2ELogRotation has a container write about 200 KiB of output with
// containerLogMaxSize 16Ki and containerLogMaxFiles 3: the log is rotated,
// at most two rotated files are kept beside the live one, and
// `outpost logs` still ends with the last line written.
func TestE2ELogRotation(t *testing.T) {
	n := newNode(t, "e2e-logrot")
	f, err := os.OpenFile(n.cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "containerLogMaxSize: 16Ki\ncontainerLogMaxFiles: 3\n")
	f.Close()
	n.write("chatty.yaml", podManifest("chatty", "Never",
		`for i in $(seq 1 2000); do echo "line $i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; done; echo done-writing`))
	n.start()
	n.waitPod("chatty-e2e-logrot", 60*time.Second, "Succeeded", func(p *agent.PodInfo) bool { return p.Status.Phase == corev1.PodSucceeded })
	dirs, _ := filepath.Glob(filepath.Join(n.dir, "logs", "default_chatty-e2e-logrot_*", "main"))
	if len(dirs) != 1 {
		t.Fatalf("log dirs %v", dirs)
	}
	files, _ := filepath.Glob(filepath.Join(dirs[0], "0.log*"))
	var total int64
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		total += st.Size()
	}
	if len(files) < 2 || len(files) > 3 {
		t.Fatalf("log files %v: want the live one and 1 or 2 rotated", files)
	}
	if total > 3*(16<<10+512) {
		t.Fatalf("logs take %d bytes, more than 3 files of 16 KiB", total)
	}
	out, err := n.outpost("logs", "chatty-e2e-logrot", "--tail", "2")
	if err != nil || out != "line 2000 xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\ndone-writing\n" {
		t.Fatalf("logs --tail 2: %v: %q", err, out)
	}
}
