package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/outpost-edge/outpost/internal/waittest"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// BenchmarkPeersReboot is issue 18's offline reboot row: 30 static pods
// (busybox httpd, an httpGet readiness probe every 10 s) on a node with
// no API server, brought back after a power cut: the agent, containerd,
// the shims and the containers killed at once, containerd's state and
// the runc state wiped and the network namespaces lost, as a reboot
// loses /run. Then containerd starts, every peer waits rebootSettle,
// and the figure is the time from
// the node agent's start to the 30 containers started again
// (reboot-ms), and the CPU the machine spent meanwhile (reboot-cpu-ms,
// all processes: the cores are busy throughout, and this figure moves
// less from run to run than the time). Each pod's command touches a
// file in a hostPath directory before it execs httpd, and the benchmark
// counts the files.
//
// BENCH_PEER picks the node: outpost (the default); kubelet, upstream
// kubelet standalone with the same 30 pods as static manifests, on a
// private containerd with its CRI plugin and a CNI bridge; or runc, the
// floor: the same 30 containers from bundles made beforehand, run with
// bare `runc create` and `runc start`, all at once, timed from the first
// create; or containerd, the floor of a node agent on containerd (see
// rebootContainerd). outpost-crun, crun and containerd-crun are outpost,
// the bare floor and the floor on containerd with crun as the OCI
// runtime. One iteration is the whole run: -benchtime 1x. With
// BENCH_REBOOT_IDLE (a duration), outpost's agent is left that long
// after the reboot and its RSS and anonymous memory are reported.
func BenchmarkPeersReboot(b *testing.B) {
	env.RequireRoot(b)
	peer := cmp.Or(os.Getenv("BENCH_PEER"), "outpost")
	b.StopTimer()
	started := filepath.Join(b.TempDir(), "started")
	if err := os.Mkdir(started, 0o777); err != nil {
		b.Fatal(err)
	}
	var took, cpu time.Duration
	switch peer {
	case "outpost":
		took, cpu = rebootOutpost(b, started, "")
	case "outpost-crun":
		took, cpu = rebootOutpost(b, started, "crun")
	case "kubelet":
		took, cpu = rebootKubelet(b, started)
	case "runc", "crun":
		took, cpu = rebootFloor(b, started, peer)
	case "containerd":
		took, cpu = rebootContainerd(b, started, "", false)
	case "containerd-crun":
		took, cpu = rebootContainerd(b, started, "crun", false)
	case "containerd-tasks":
		took, cpu = rebootContainerd(b, started, "", true)
	default:
		b.Fatalf("BENCH_PEER=%q: want outpost, outpost-crun, kubelet, runc, crun, containerd, containerd-crun or containerd-tasks", peer)
	}
	b.ReportMetric(float64(took.Milliseconds()), "reboot-ms")
	b.ReportMetric(float64(cpu.Milliseconds()), "reboot-cpu-ms")
}

// machineCPU is the CPU time all the machine's cores have spent busy
// since boot (benchHostCPU): what a window costs the machine, whichever
// processes spent it, and steadier from run to run than the window's
// length when the cores are busy throughout.
func machineCPU(b *testing.B) time.Duration {
	b.Helper()
	busy, _ := benchHostCPU(b)
	return time.Duration(busy) * time.Second / benchClockTicks
}

// rebootPod is static pod i's manifest: it marks its start in /started.
func rebootPod(i int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: boot-%02d, namespace: default}
spec:
  terminationGracePeriodSeconds: 2
  enableServiceLinks: false
  containers:
  - name: web
    image: %s
    imagePullPolicy: Never
    command: [sh, -c, %q]
    readinessProbe:
      httpGet: {path: /, port: 8080}
      periodSeconds: 10
    volumeMounts: [{name: started, mountPath: /started}]
  volumes:
  - name: started
    hostPath: {path: %%s, type: Directory}
`, i, env.TestImage, rebootScript(i))
}

// rebootScript is the command of container i.
func rebootScript(i int) string {
	return fmt.Sprintf("touch /started/boot-%02d && exec httpd -f -p 8080 -h /var/www", i)
}

// writeRebootPods writes the 30 manifests into dir.
func writeRebootPods(b *testing.B, dir, started string) {
	b.Helper()
	for i := range peersPods {
		m := fmt.Sprintf(rebootPod(i), started)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("boot-%02d.yaml", i)), []byte(m), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// waitStarted waits until the 30 containers have marked their start in
// dir, polling every 10 ms.
func waitStarted(b *testing.B, dir string, timeout time.Duration) {
	b.Helper()
	waittest.Poll{Timeout: timeout, Every: 10 * time.Millisecond}.For(b, fmt.Sprintf("%d containers started", peersPods), func() (bool, string) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			b.Fatal(err)
		}
		return len(ents) >= peersPods, fmt.Sprintf("%d started", len(ents))
	})
}

// waitSpares waits until the agent on containerd c, namespace ns, has
// made the spares of the 30 containers (spareIDs).
func waitSpares(b *testing.B, c *env.Containerd, ns string, timeout time.Duration) {
	b.Helper()
	cl := c.Client(b, ns)
	ctx := namespaces.WithNamespace(context.Background(), ns)
	waittest.Poll{Timeout: timeout, Every: 100 * time.Millisecond}.For(b, fmt.Sprintf("%d spares made", peersPods), func() (bool, string) {
		ids, err := spareIDs(ctx, cl)
		if err != nil {
			b.Fatal(err)
		}
		return len(ids) >= peersPods, fmt.Sprintf("%d made", len(ids))
	})
}

// clearStarted empties the directory of start marks.
func clearStarted(b *testing.B, dir string) {
	b.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			b.Fatal(err)
		}
	}
}

// rebootOutpost runs the 30 pods on an outpost agent with no API server,
// on the OCI runtime ociRuntime (empty is runc), cuts the power and
// returns how long the agent, started again, takes to start them.
func rebootOutpost(b *testing.B, started, ociRuntime string) (took, cpu time.Duration) {
	b.Helper()
	if ociRuntime != "" {
		if _, err := exec.LookPath(ociRuntime); err != nil {
			b.Skipf("no %s: %v", ociRuntime, err)
		}
	}
	n := newBenchNodeOn(b, "bench-reboot", nil, ociRuntime)
	writeRebootPods(b, filepath.Join(n.dir, "manifests"), started)
	n.startAgent(b)
	waitStarted(b, started, 2*time.Minute)
	// Every pod settled, its probes running, and each container's next
	// attempt made ahead (agent/spare.go), as on a node that has run a while.
	waitSpares(b, n.ctrd, n.netns, 2*time.Minute)
	time.Sleep(2 * time.Second)

	n.kill()
	clearStarted(b, started)
	n.ctrd.PowerCutThen(b, func() {
		// A reboot empties /run: runc's state, the agent's runDir, the
		// network namespaces.
		runcStateTmpfs(b, n.netns)
		if err := env.ResetTmpfs(n.runDir()); err != nil {
			b.Fatal(err)
		}
		n.removePodNetns()
		exec.Command("ip", "netns", "delete", n.netns).Run()
		addNetns(b, n.netns)
	})
	time.Sleep(rebootSettle)
	start, cpu := time.Now(), machineCPU(b)
	n.startAgent(b)
	waitStarted(b, started, 2*time.Minute)
	took, cpu = time.Since(start), machineCPU(b)-cpu
	if v := os.Getenv("BENCH_REBOOT_IDLE"); v != "" {
		// The agent's memory once the reboot's burst is over and the
		// pods have been quiet: what the start left behind.
		idle, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("BENCH_REBOOT_IDLE=%q: %v", v, err)
		}
		time.Sleep(idle)
		st := benchProcStatus(b, n.agentPID(b), "VmRSS", "RssAnon")
		b.ReportMetric(float64(st["VmRSS"])/1024, "agent-rss-MiB")
		b.ReportMetric(float64(st["RssAnon"])/1024, "agent-anon-MiB")
	}
	return took, cpu
}

// rebootKubelet is rebootOutpost with kubelet standalone.
func rebootKubelet(b *testing.B, started string) (took, cpu time.Duration) {
	b.Helper()
	kn := newKubeletNode(b, "bench-reboot", nil)
	writeRebootPods(b, kn.manifests(), started)
	// runc's state of the CRI plugin's containers is on containerd's
	// state tmpfs (env.StartContainerdCRI), which the power cut empties.
	before := netnsEntries()
	kn.start(b)
	waitStarted(b, started, 3*time.Minute)
	time.Sleep(5 * time.Second)

	kn.kill()
	clearStarted(b, started)
	kn.ctrd.PowerCutThen(b, func() {
		kn.removeSandboxNetns(before)
		exec.Command("ip", "netns", "delete", kn.ns.name).Run()
		addNetns(b, kn.ns.name)
		kn.nodeNet(b)
	})
	time.Sleep(rebootSettle)
	start, cpu := time.Now(), machineCPU(b)
	kn.start(b)
	waitStarted(b, started, 3*time.Minute)
	return time.Since(start), machineCPU(b) - cpu
}

// rebootContainerd is the floor of a node agent on containerd: after a
// power cut, as for outpost, a bare client of containerd creates the 30
// containers from the image (a snapshot each, the spec's options that
// outpost's runtime gives them, in as many shim groups as outpost's,
// spread evenly where outpost hashes pod UIDs, with the shim start
// binary beside the outpost under test when there is one)
// and starts their tasks, all at once, one task create at a time in a
// group as outpost's runtime does; no agent, no pod network, no logs
// (the containers' output goes nowhere). Timed from the first create,
// after one pass to warm the caches. A non-empty ociRuntime (crun) is
// the OCI runtime the runc shim runs, as outpost's containerd.ociRuntime
// has it: the specs declare crunSpecVersion, as the bare crun floor's.
// With tasksOnly the boot after the power cut makes no container: it
// starts new tasks for the containers of the boot before, with their
// snapshots, as bare runc starts from bundles made beforehand.
func rebootContainerd(b *testing.B, started, ociRuntime string, tasksOnly bool) (took, cpu time.Duration) {
	b.Helper()
	var taskOpts []client.NewTaskOpts
	var specOpts []oci.SpecOpts
	var ctrd *env.Containerd
	if ociRuntime == "" {
		ctrd = env.StartContainerd(b)
	} else {
		bin, err := exec.LookPath(ociRuntime)
		if err != nil {
			b.Skipf("no %s: %v", ociRuntime, err)
		}
		ctrd = env.StartContainerdV1Only(b)
		taskOpts = append(taskOpts, func(_ context.Context, _ *client.Client, ti *client.TaskInfo) error {
			ti.Options = &options.Options{BinaryName: bin}
			return nil
		})
		specOpts = append(specOpts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			s.Version = crunSpecVersion
			return nil
		})
	}
	ns := fmt.Sprintf("outpost-bench-%d", time.Now().UnixNano()%1e9)
	ctrd.ImportTestImage(b, ns)
	if shim := filepath.Join(filepath.Dir(benchBin()), "containerd-shim-outpost-v2"); isFile(shim) {
		taskOpts = append(taskOpts, client.WithRuntimePath(shim))
	}
	// outpost's shim groups (BENCH_SHIM_GROUPS, as for the agent; 0 is a
	// shim per container).
	groups, err := strconv.Atoi(cmp.Or(os.Getenv("BENCH_SHIM_GROUPS"), "4"))
	if err != nil || groups <= 0 {
		groups = peersPods
	}
	runAll := func(round int) (time.Duration, time.Duration) {
		cl := ctrd.Client(b, ns)
		ctx := namespaces.WithNamespace(context.Background(), ns)
		img, err := cl.GetImage(ctx, env.TestImage)
		if err != nil {
			b.Fatal(err)
		}
		locks := make([]sync.Mutex, groups)
		start, cpu := time.Now(), machineCPU(b)
		var wg sync.WaitGroup
		for i := range peersPods {
			wg.Go(func() {
				id := fmt.Sprintf("boot-%02d-%d", i, round)
				var c client.Container
				var err error
				if tasksOnly && round > 0 {
					id = fmt.Sprintf("boot-%02d-0", i) // the boot before's
					c, err = cl.LoadContainer(ctx, id)
				} else {
					group := fmt.Sprintf("outpost-%d", i%groups)
					c, err = cl.NewContainer(ctx, id,
						client.WithSnapshotter("overlayfs"),
						client.WithNewSnapshot(id, img),
						client.WithNewSpec(
							oci.WithImageConfig(img),
							oci.WithProcessArgs("sh", "-c", rebootScript(i)),
							oci.WithMounts([]specs.Mount{{Destination: "/started", Type: "bind", Source: started, Options: []string{"rbind", "rw"}}}),
							oci.WithCgroup(ctrd.CgroupParent+"/"+id),
							oci.WithAnnotations(map[string]string{"io.containerd.runc.v2.group": group}),
							oci.Compose(specOpts...),
						))
				}
				if err != nil {
					b.Errorf("container %s: %v", id, err)
					return
				}
				locks[i%groups].Lock()
				task, err := c.NewTask(ctx, cio.NullIO, taskOpts...)
				locks[i%groups].Unlock()
				if err != nil {
					b.Errorf("task %s: %v", id, err)
					return
				}
				if err := task.Start(ctx); err != nil {
					b.Errorf("start %s: %v", id, err)
				}
			})
		}
		wg.Wait()
		if b.Failed() {
			b.FailNow()
		}
		waitStarted(b, started, time.Minute)
		took, cpu := time.Since(start), machineCPU(b)-cpu
		if ociRuntime == "crun" {
			// The shim keeps its runtime's state under its root: crun's
			// is a status file, runc's a state.json.
			id := fmt.Sprintf("boot-00-%d", round)
			if _, err := os.Stat(filepath.Join("/run/containerd/runc", ns, id, "status")); err != nil {
				b.Fatalf("task %s not on crun: %v", id, err)
			}
		}
		return took, cpu
	}
	runAll(0)
	clearStarted(b, started)
	ctrd.PowerCutThen(b, func() { runcStateTmpfs(b, ns) })
	time.Sleep(rebootSettle)
	return runAll(1)
}

// runcStateTmpfs empties the runc shim's state of containerd namespace
// ns, as a reboot empties /run, and mounts a tmpfs there for the boot
// after, unmounted and removed in b's cleanup: /run is a tmpfs on a real
// machine, and the bare floors keep their state on one, where this VM's
// /run is on its root file system (ext4 without a journal, whose inode
// allocator takes longer the more files were deleted in the last
// minutes). It is called between the daemon's death and its start, so
// that a daemon in a mount namespace of its own (StartContainerdV1Only)
// sees the tmpfs too.
func runcStateTmpfs(b *testing.B, ns string) {
	b.Helper()
	dir := filepath.Join("/run/containerd/runc", ns)
	if err := os.RemoveAll(dir); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.Remove(dir) }) // after the unmount
	env.Tmpfs(b, dir)
}

// isFile reports whether path names a regular file.
func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// crunSpecVersion is the runtime-spec version the specs on crun declare:
// crun 1.8 refuses the 1.2 of runc's template and of containerd's client
// (outpost asks the runtime, lookOCIRuntime).
const crunSpecVersion = "1.0.0"

// rebootFloor starts the 30 containers with the bare OCI runtime name
// (runc or crun) from bundles made beforehand (after one pass to warm
// the caches, as the agents' first start warms theirs) and returns the
// time from the first create to the last container started. crun runs
// where the host's cgroup v2 hierarchy is out of its sight, as for
// outpost on crun (v1Spawner).
func rebootFloor(b *testing.B, started, name string) (took, cpu time.Duration) {
	b.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		b.Skipf("no %s: %v", name, err)
	}
	dir, err := os.MkdirTemp("", "outpost-floor-")
	if err != nil {
		b.Fatal(err)
	}
	root, rootfs := filepath.Join(dir, "state"), filepath.Join(dir, "rootfs")
	cgroup := "/" + filepath.Base(dir)
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		b.Fatal(err)
	}
	env.WriteTestRootfs(b, rootfs)
	ids := make([]string, peersPods)
	for i := range ids {
		ids[i] = fmt.Sprintf("boot-%02d", i)
	}
	var run func(*exec.Cmd) error
	remove := func() {
		for _, id := range ids {
			run(exec.Command(bin, "--root", root, "delete", "--force", id))
		}
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	// runc's state is on a tmpfs, as /run/runc is on a real machine.
	env.Tmpfs(b, root)
	run = func(cmd *exec.Cmd) error { return cmd.Run() }
	if name != "runc" && env.HybridCgroups() {
		run = newV1Spawner(b).run // after the tmpfs, which its namespace copies
	}
	b.Cleanup(func() {
		remove()
		env.RemoveCgroups(b, cgroup)
	})

	spec := floorSpec(b, "runc", rootfs, started)
	if name != "runc" {
		// crun 1.8 refuses the spec version of runc's template.
		spec.Version = crunSpecVersion
	}
	for i, id := range ids {
		bundle := filepath.Join(dir, id)
		if err := os.Mkdir(bundle, 0o755); err != nil {
			b.Fatal(err)
		}
		s := *spec
		p := *spec.Process
		p.Args = []string{"sh", "-c", rebootScript(i)}
		s.Process = &p
		l := *spec.Linux
		l.CgroupsPath = cgroup + "/" + id
		s.Linux = &l
		s.Hostname = id
		data, err := json.Marshal(&s)
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	runAll := func() (time.Duration, time.Duration) {
		start, cpu := time.Now(), machineCPU(b)
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Go(func() {
				// The container gets runc's stdio: /dev/null, not a pipe
				// this process would wait on; runc logs to a file.
				logPath := filepath.Join(dir, id+".log")
				for _, args := range [][]string{
					{"--root", root, "--log", logPath, "create", "--bundle", filepath.Join(dir, id), id},
					{"--root", root, "--log", logPath, "start", id},
				} {
					if err := run(exec.Command(bin, args...)); err != nil {
						out, _ := os.ReadFile(logPath)
						b.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
						return
					}
				}
			})
		}
		wg.Wait()
		if b.Failed() {
			b.FailNow()
		}
		waitStarted(b, started, time.Minute)
		return time.Since(start), machineCPU(b) - cpu
	}
	runAll()
	remove()
	clearStarted(b, started)
	time.Sleep(rebootSettle)
	return runAll()
}

// floorSpec is runc's default spec (`runc spec`) for the floor's
// containers: the rootfs read-only and shared, no terminal, and the
// directory of start marks bound at /started.
func floorSpec(b *testing.B, runc, rootfs, started string) *specs.Spec {
	b.Helper()
	dir := b.TempDir()
	if out, err := exec.Command(runc, "spec", "--bundle", dir).CombinedOutput(); err != nil {
		b.Fatalf("runc spec: %v\n%s", err, out)
	}
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		b.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		b.Fatalf("runc spec: %v", err)
	}
	s.Root = &specs.Root{Path: rootfs, Readonly: true}
	s.Process.Terminal = false
	s.Mounts = append(s.Mounts, specs.Mount{Destination: "/started", Type: "bind", Source: started, Options: []string{"rbind", "rw"}})
	return &s
}

// v1Spawner starts processes from an OS thread of its own whose mount
// namespace is a slave copy of the host's without /sys/fs/cgroup/unified,
// as env.StartContainerdV1Only gives containerd: a process forked from
// that thread is born in that namespace. For crun 1.8, which refuses a
// hybrid cgroup layout with a controller on v2.
type v1Spawner struct{ reqs chan spawnReq }

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

// newV1Spawner makes the namespace and the thread that serves it until
// b's cleanup.
func newV1Spawner(b *testing.B) *v1Spawner {
	b.Helper()
	s := &v1Spawner{reqs: make(chan spawnReq)}
	ready := make(chan error)
	go func() {
		// Never unlocked: the thread, in its own namespace, ends with
		// the goroutine.
		runtime.LockOSThread()
		err := unix.Unshare(unix.CLONE_NEWNS)
		if err == nil {
			err = unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, "")
		}
		if err == nil {
			err = unix.Unmount("/sys/fs/cgroup/unified", unix.MNT_DETACH)
		}
		ready <- err
		if err != nil {
			return
		}
		for r := range s.reqs {
			r.err <- r.cmd.Start()
		}
	}()
	if err := <-ready; err != nil {
		b.Fatalf("mount namespace without cgroup v2: %v", err)
	}
	b.Cleanup(func() { close(s.reqs) })
	return s
}

// run starts cmd in the namespace and waits for it.
func (s *v1Spawner) run(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	s.reqs <- spawnReq{cmd, errc}
	if err := <-errc; err != nil {
		return err
	}
	return cmd.Wait()
}

// rebootSettle is how long every peer's reboot waits after the power cut
// before its timed part: the kernel tears down the network namespaces
// of the containers that died with the power in the background, which a
// machine that really rebooted does not have to do. Without the wait
// outpost on crun came back about 50 ms later in alternating runs (30
// pod networks with their veths), the bare floors no later.
const rebootSettle = 2 * time.Second
