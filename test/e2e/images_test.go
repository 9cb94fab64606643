package e2e

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// forwarder makes a loopback address of the host (a registry) reachable at
// the same address inside the node's network namespace, where the agent
// runs and pulls, and counts the connections made through it: the pulls
// the agent tried.
type forwarder struct {
	ln     net.Listener
	conns  atomic.Int64
	paused atomic.Bool

	mu   sync.Mutex
	open map[net.Conn]bool
	wg   sync.WaitGroup
}

// forward starts a forwarder for addr, stopped in the test's cleanup.
func (n *node) forward(addr string) *forwarder {
	n.t.Helper()
	var ln net.Listener
	err := inNetns("/run/netns/"+n.netns, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		n.t.Fatalf("listen on %s in the node's namespace: %v", addr, err)
	}
	f := &forwarder{ln: ln, open: map[net.Conn]bool{}}
	f.wg.Add(1)
	go f.serve(addr)
	n.t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		for c := range f.open {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

func (f *forwarder) serve(target string) {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return // closed
		}
		if f.paused.Load() {
			c.Close() // the link is down
			continue
		}
		f.conns.Add(1)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.track(c, true)
			defer f.track(c, false)
			defer c.Close()
			up, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				return // the registry is down: the agent sees the connection closed
			}
			f.track(up, true)
			defer f.track(up, false)
			defer up.Close()
			done := make(chan struct{}, 2)
			pipe := func(dst, src net.Conn) {
				io.Copy(dst, src)
				dst.(*net.TCPConn).CloseWrite()
				done <- struct{}{}
			}
			go pipe(up, c)
			go pipe(c, up)
			<-done
			<-done
		}()
	}
}

// pause cuts the link: open connections are closed and new ones are
// closed as soon as they are accepted, until resume.
func (f *forwarder) pause() {
	f.paused.Store(true)
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.open {
		c.Close()
	}
}

// resume restores the link cut by pause.
func (f *forwarder) resume() { f.paused.Store(false) }

func (f *forwarder) track(c net.Conn, open bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if open {
		f.open[c] = true
	} else {
		delete(f.open, c)
	}
}

// inNetns runs fn on a thread switched into the network namespace at
// nsPath; a socket fn opens stays in that namespace. The thread goes back
// to its own namespace afterwards (see dialInNetns).
func inNetns(nsPath string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		ns, err := netns.GetFromPath(nsPath)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
			errc <- err
			return
		}
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// imagePod is a static pod of one container of image that sleeps, with
// pullPolicy ("" leaves it to the defaulting).
func imagePod(name, image, pullPolicy string) string {
	policy := ""
	if pullPolicy != "" {
		policy = "\n    imagePullPolicy: " + pullPolicy
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s%s
    command: [sleep, "600"]
`, name, image, policy)
}

// waiting returns the reason the pod's first container waits, "" if it
// does not.
func waiting(p *agent.PodInfo) string {
	if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Waiting == nil {
		return ""
	}
	return p.Status.ContainerStatuses[0].State.Waiting.Reason
}

// TestImagesPullFromRegistry runs a pod whose image is only in a registry
// on the loopback: the agent pulls it over plain HTTP and runs it. A
// second pod of the same image with imagePullPolicy Always pulls it again
// although it is present.
func TestImagesPullFromRegistry(t *testing.T) {
	reg := env.StartRegistry(t)
	n := newNode(t, "e2e-pull")
	fw := n.forward(reg.Host)
	ref := reg.PushTestImage(t, "e2e/busybox", "1.35")
	// The tag is not latest: the default policy is IfNotPresent.
	n.write("pulled.yaml", imagePod("pulled", ref, ""))
	n.start()
	p := n.waitPod("pulled-e2e-pull", 60*time.Second, "running", running)
	if c := p.Status.ContainerStatuses[0]; c.Image != ref || !strings.Contains(c.ImageID, "@sha256:") {
		t.Fatalf("container image %q id %q, want %s and a digest", c.Image, c.ImageID, ref)
	}
	if p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("restarted: %+v", p.Status.ContainerStatuses[0])
	}
	pulls := fw.conns.Load()
	if pulls == 0 {
		t.Fatal("pod running but no connection reached the registry")
	}

	n.write("always.yaml", imagePod("always", ref, "Always"))
	n.waitPod("always-e2e-pull", 60*time.Second, "running", running)
	if fw.conns.Load() == pulls {
		t.Fatal("imagePullPolicy Always started the pod without going to the registry")
	}
}

// TestImagesPullBackoffUntilPushed runs a pod whose image the registry
// does not have: the pod shows ErrImagePull, then ImagePullBackOff in
// `outpost status -o json`. Once the image is pushed the agent's next try,
// 10 s after the first, pulls it and the pod runs, with no agent restart.
func TestImagesPullBackoffUntilPushed(t *testing.T) {
	reg := env.StartRegistry(t)
	n := newNode(t, "e2e-late")
	n.forward(reg.Host)
	ref := reg.Ref("e2e/late", "1.35")
	n.write("late.yaml", imagePod("late", ref, ""))
	n.start()
	seen := map[string]bool{}
	p := n.waitPod("late-e2e-late", 60*time.Second, "backing off", func(p *agent.PodInfo) bool {
		seen[waiting(p)] = true
		return waiting(p) == "ImagePullBackOff"
	})
	failed := time.Now()
	msg := p.Status.ContainerStatuses[0].State.Waiting.Message
	if !strings.Contains(msg, ref) || !strings.Contains(msg, "Back-off pulling image") {
		t.Fatalf("ImagePullBackOff message %q", msg)
	}
	t.Logf("waiting reasons seen before the push: %v", seen)
	if !hasEvent(p, "Failed", ref) {
		t.Fatalf("no Failed event for the pull: %+v", p.Events)
	}
	agentPID := n.agent.Process.Pid

	reg.PushTestImage(t, "e2e/late", "1.35")
	p = n.waitPod("late-e2e-late", 25*time.Second, "running after the push", running)
	t.Logf("running %v after the backoff began", time.Since(failed).Round(100*time.Millisecond))
	if n.agent.Process.Pid != agentPID {
		t.Fatal("the agent was restarted")
	}
	if c := p.Status.ContainerStatuses[0]; c.RestartCount != 0 || c.Image != ref {
		t.Fatalf("container %+v", c)
	}
}

// TestImagesOfflineIfNotPresent pulls an image from the registry, then
// stops the registry and the agent. With no registry in reach, a new pod
// of that image with imagePullPolicy IfNotPresent starts without any try
// to reach the registry; one with Always tries, and, as outpost runs what
// it has when offline, starts too.
func TestImagesOfflineIfNotPresent(t *testing.T) {
	reg := env.StartRegistry(t)
	n := newNode(t, "e2e-offline")
	fw := n.forward(reg.Host)
	ref := reg.PushTestImage(t, "e2e/busybox", "1.35")
	n.write("first.yaml", imagePod("first", ref, "IfNotPresent"))
	n.start()
	n.waitPod("first-e2e-offline", 60*time.Second, "running", running)

	n.stop()
	reg.Stop()
	before := fw.conns.Load()
	n.write("offline.yaml", imagePod("offline", ref, "IfNotPresent"))
	n.start()
	n.waitPod("offline-e2e-offline", 30*time.Second, "running with the registry down", running)
	n.waitPod("first-e2e-offline", 30*time.Second, "still running", running)
	if got := fw.conns.Load(); got != before {
		t.Fatalf("%d connections to the registry for an IfNotPresent image that is present", got-before)
	}

	n.write("always.yaml", imagePod("always", ref, "Always"))
	n.waitPod("always-e2e-offline", 30*time.Second, "running on the present image", running)
	if fw.conns.Load() == before {
		t.Fatal("imagePullPolicy Always did not try the registry")
	}
}

// TestImagesImportedFromImageDir copies an image tarball, slowly, into
// the image directory of a running agent whose pod waits for that image
// with imagePullPolicy Never: the agent imports the tarball once the copy
// is complete (never half-written) and the pod starts.
func TestImagesImportedFromImageDir(t *testing.T) {
	n := newNode(t, "e2e-drop")
	const image = "outpost.test/dropped:1"
	imageDir := filepath.Join(n.dir, "images")
	if err := os.MkdirAll(imageDir, 0o755); err != nil {
		t.Fatal(err)
	}
	n.write("dropped.yaml", imagePod("dropped", image, "Never"))
	n.start()
	p := n.waitPod("dropped-e2e-drop", 30*time.Second, "waiting for its image", func(p *agent.PodInfo) bool {
		return waiting(p) == "ErrImageNeverPull"
	})
	if msg := p.Status.ContainerStatuses[0].State.Waiting.Message; !strings.Contains(msg, image) {
		t.Fatalf("ErrImageNeverPull message %q", msg)
	}

	// Copy in chunks over 4 s, two poll intervals: each poll sees the
	// file still growing.
	data, err := os.ReadFile(env.TestImageTarballAs(t, image))
	if err != nil {
		t.Fatal(err)
	}
	dst, err := os.Create(filepath.Join(imageDir, "dropped.tar"))
	if err != nil {
		t.Fatal(err)
	}
	const chunks = 8
	for i := range chunks {
		if _, err := dst.Write(data[i*len(data)/chunks : (i+1)*len(data)/chunks]); err != nil {
			t.Fatal(err)
		}
		if err := dst.Sync(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	copied := time.Now()
	n.waitPod("dropped-e2e-drop", 20*time.Second, "running from the imported image", running)
	t.Logf("running %v after the copy ended", time.Since(copied).Round(100*time.Millisecond))

	log, err := os.ReadFile(filepath.Join(n.dir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(log), "import image tarball") {
		t.Fatalf("a half-copied tarball was imported:\n%s", log)
	}
	if !strings.Contains(string(log), "imported images") || !strings.Contains(string(log), "dropped.tar") {
		t.Fatalf("no import of dropped.tar logged:\n%s", log)
	}

	// Started again, as after a reboot, the agent does not import the
	// unchanged tarball again: its image is in containerd as the import
	// left it.
	restart := func() string {
		t.Helper()
		n.stop()
		before := len(readAgentLog(t, n))
		n.start()
		var since string
		within(20*time.Second).For(t, "the agent's start-up look at its image directory", func() (bool, string) {
			since = readAgentLog(t, n)[before:]
			return strings.Contains(since, "dropped.tar"), since
		})
		return since
	}
	if since := restart(); strings.Contains(since, "imported images") || !strings.Contains(since, "image tarball imported before") {
		t.Fatalf("the unchanged tarball was imported again at start:\n%s", since)
	}
	// An image gone from containerd comes back from its tarball at the
	// next start.
	run(t, "ctr", "-a", n.ctrd.Address, "-n", n.ns, "images", "rm", image)
	if since := restart(); !strings.Contains(since, "imported images") {
		t.Fatalf("the tarball of a removed image was not imported again at start:\n%s", since)
	}
	// So does a tarball that changed while the agent was down.
	n.stop()
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(filepath.Join(imageDir, "dropped.tar"), later, later); err != nil {
		t.Fatal(err)
	}
	if since := restart(); !strings.Contains(since, "imported images") {
		t.Fatalf("a changed tarball was not imported again at start:\n%s", since)
	}
	n.waitPod("dropped-e2e-drop", 20*time.Second, "running after the restarts", running)
}

// readAgentLog returns the node's agent log so far.
func readAgentLog(t *testing.T, n *node) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.dir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
