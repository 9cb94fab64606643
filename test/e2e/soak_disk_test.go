package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

func init() { addSoakTrial(30, "DyingDisk", soakDyingDisk) }

// soakDyingDisk is trial 3 of docs/soak.md: the agent's state directory
// on a small loop-mounted ext4 that fills up, round after round, and at
// last is remounted read-only by the kernel after an error, as a dying
// SD card is, until a power cut lets it be checked and mounted again. Pods keep running (the same containers); `outpost status`,
// the log (once per change) and the Node's StoreWritable condition say
// what is wrong; when space returns they clear and the store converges:
// the pods changed meanwhile are stored, their status reaches the API
// server, and an agent killed with SIGKILL comes back to the same pods.
// After each round, and after SIGKILLs while the disk is full or
// read-only, the store opens read-only and passes bbolt's check.
func soakDyingDisk(t *testing.T, sc soakScale, r *soakResult) {
	rounds := sc.n(2, 5)
	disk := newLoopDisk(t, 32)
	api := env.StartAPIServer(t)
	adm := newAdmin(t, api)
	n := newNode(t, "soak-disk")
	n.setStateDir(disk.dir)
	n.connect(api)
	n.write("steady.yaml", podManifest("steady", "Always", "while true; do sleep 1; done"))
	n.write("crashy.yaml", podManifest("crashy", "Always", "sleep 2; exit 1"))
	n.start()
	// Static pods are named <name>-<node>.
	pod := func(name string) string { return name + "-" + n.name }
	n.waitPod(pod("steady"), 90*time.Second, "running", running)
	n.waitPod(pod("crashy"), 90*time.Second, "started", func(p *agent.PodInfo) bool { return agentRestarts(p) >= 0 })
	ids := containerIDs(t, n, pod("steady"))
	within(90*time.Second).For(t, "the Node's StoreWritable condition True", func() (bool, string) {
		c := storeCondition(adm, n.name)
		return c != nil && c.Status == corev1.ConditionTrue, asJSON(c)
	})

	kills, opens, warned, cleared := 0, 0, 0, 0
	refused := 0  // full-disk rounds in which the disk refused a store write
	churned := "" // the churn pod of the last round
	counts := func(done string) {
		r.set("%s (%d with store writes refused for space); %d SIGKILLs, store opened %d/%d; %d NoSpace/ReadOnly warnings, %d clears, each said in status, log and Node; steady kept its container until the power cut",
			done, refused, kills, opens, opens, warned, cleared)
	}
	for i := range rounds {
		counts(fmt.Sprintf("%d of %d full-disk rounds", i, rounds))
		warnsBefore := n.logCount("store takes no writes")
		backBefore := n.logCount("store takes writes again")
		refusedBefore := n.logCount(syscall.ENOSPC.Error())
		restartsBefore := agentRestarts(findPod(mustStatus(t, n), pod("crashy")))

		// The disk fills while pods change: one comes, the last round's
		// goes, crashy keeps restarting.
		filler := disk.fill(t)
		name := fmt.Sprintf("churn%d", i)
		n.write(name+".yaml", podManifest(name, "Always", "while true; do sleep 1; done"))
		// A 512 KiB config map does not fit in the store file's free
		// pages: its write is refused for space.
		blob := fmt.Sprintf("blob%d", i)
		n.write(blob+".yaml", fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s}\ndata: {blob: %s}\n", blob, strings.Repeat("x", 512<<10)))
		if churned != "" {
			os.Remove(filepath.Join(n.manifests, churned+".yaml"))
			os.Remove(filepath.Join(n.manifests, "blob"+strings.TrimPrefix(churned, "churn")+".yaml"))
		}
		n.waitStore(90*time.Second, store.ReasonNoSpace)
		within(60*time.Second).For(t, "a store write refused for space in the (debug) log", func() (bool, string) {
			return n.logCount(syscall.ENOSPC.Error()) > refusedBefore, ""
		})
		refused++
		waitStoreCondition(t, adm, n.name, corev1.ConditionFalse, store.ReasonNoSpace)
		if got := n.logCount("store takes no writes") - warnsBefore; got != 1 {
			t.Errorf("round %d: %d log warnings that the store takes no writes, want 1", i, got)
		}
		warned++
		if got := containerIDs(t, n, pod("steady")); asJSON(got) != asJSON(ids) {
			t.Fatalf("round %d: steady's container changed on a full disk: %v -> %v", i, ids, got)
		}

		// Killed and started again on the full disk: the store opens,
		// the agent finds its pods and says the disk is full.
		if i%2 == 0 {
			n.kill()
			kills++
			opens++
			n.checkStore(t)
			n.start()
			n.waitStore(90*time.Second, store.ReasonNoSpace)
			if got := containerIDs(t, n, pod("steady")); asJSON(got) != asJSON(ids) {
				t.Fatalf("round %d: steady's container changed across an agent restart on a full disk: %v -> %v", i, ids, got)
			}
		}

		// Space returns: status, log and Node clear, the changes are
		// stored and their status reaches the API server.
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		n.waitStore(90*time.Second, "")
		waitStoreCondition(t, adm, n.name, corev1.ConditionTrue, agent.ReasonStoreWritable)
		if got := n.logCount("store takes writes again") - backBefore; got != 1 {
			t.Errorf("round %d: %d log notes that the store takes writes again, want 1", i, got)
		}
		cleared++
		n.waitPod(pod(name), 90*time.Second, "running", running)
		within(90*time.Second).For(t, "the mirror pod of "+name+" Running in the API", func() (bool, string) {
			p, err := adm.pod(pod(name))
			if err != nil {
				return false, err.Error()
			}
			return p.Status.Phase == corev1.PodRunning, asJSON(p.Status)
		})
		if churned != "" {
			within(60*time.Second).For(t, churned+" gone", func() (bool, string) {
				return findPod(mustStatus(t, n), pod(churned)) == nil, ""
			})
		}
		churned = name

		// The store holds what changed: killed, the agent comes back to
		// the same pods.
		want := containerIDs(t, n, pod("steady"), pod(name))
		n.kill()
		kills++
		opens++
		pods, blobs := n.checkStore(t)
		if !blobs[blob] || len(blobs) != 1 {
			t.Errorf("round %d: store has config maps %v, want %s alone", i, blobs, blob)
		}
		for _, p := range []string{"steady", "crashy", name} {
			if !pods[pod(p)] {
				t.Errorf("round %d: pod %s not in the store after space returned (store has %v)", i, p, pods)
			}
		}
		if len(pods) != 3 {
			t.Errorf("round %d: store has pods %v, want steady, crashy and %s", i, pods, name)
		}
		n.start()
		if got := containerIDs(t, n, pod("steady"), pod(name)); asJSON(got) != asJSON(want) {
			t.Fatalf("round %d: containers changed across a SIGKILL after space returned: %v -> %v", i, want, got)
		}
		if after := agentRestarts(n.waitPod(pod("crashy"), 60*time.Second, "synced", func(*agent.PodInfo) bool { return true })); after < restartsBefore {
			t.Errorf("round %d: crashy's restart count went back from %d to %d", i, restartsBefore, after)
		}
	}
	counts(fmt.Sprintf("%d of %d full-disk rounds", rounds, rounds))

	// The kernel remounts the disk read-only after an error, under the
	// running agent.
	warnsBefore := n.logCount("store takes no writes")
	disk.fail(t)
	// A pod added meanwhile cannot be stored (nor get its pod directory).
	n.write("late.yaml", podManifest("late", "Always", "while true; do sleep 1; done"))
	if w := n.waitStore(90*time.Second, store.ReasonReadOnly); !strings.Contains(w.Message, syscall.EROFS.Error()) {
		t.Errorf("read-only: status says %q, want the refused write's error", w.Message)
	}
	waitStoreCondition(t, adm, n.name, corev1.ConditionFalse, store.ReasonReadOnly)
	if got := n.logCount("store takes no writes") - warnsBefore; got != 1 {
		t.Errorf("read-only: %d log warnings that the store takes no writes, want 1", got)
	}
	warned++
	if got := containerIDs(t, n, pod("steady")); asJSON(got) != asJSON(ids) {
		t.Fatalf("steady's container changed on a read-only disk: %v -> %v", ids, got)
	}
	restarts := agentRestarts(findPod(mustStatus(t, n), pod("steady")))
	n.kill()
	kills++
	opens++
	n.checkStore(t)
	counts(fmt.Sprintf("%d of %d full-disk rounds, then read-only", rounds, rounds))

	// The file system stays read-only until it is checked and mounted
	// again, which the pods' bind mounts of their files allow only after
	// a reboot: the power is cut, the disk repaired, the agent started.
	n.ctrd.PowerCutThen(t, func() {
		os.RemoveAll(filepath.Join("/run/containerd/runc", n.ns))
		n.removePodNetns()
		disk.repair(t)
	})
	n.start()
	n.waitStore(90*time.Second, "")
	waitStoreCondition(t, adm, n.name, corev1.ConditionTrue, agent.ReasonStoreWritable)
	cleared++
	for _, p := range []string{"steady", "crashy", churned, "late"} {
		n.waitPod(pod(p), 90*time.Second, "back after the repair", func(p *agent.PodInfo) bool { return agentRestarts(p) >= 0 })
	}
	n.waitPod(pod("late"), 60*time.Second, "running", running)
	if got := agentRestarts(n.waitPod(pod("steady"), 60*time.Second, "running", running)); got != restarts+1 {
		t.Errorf("steady's restart count after the reboot = %d, want %d", got, restarts+1)
	}
	n.kill()
	kills++
	opens++
	if pods, _ := n.checkStore(t); len(pods) != 4 || !pods[pod("late")] {
		t.Errorf("store after the repair has pods %v, want steady, crashy, %s and late", pods, churned)
	}
	counts(fmt.Sprintf("%d of %d full-disk rounds, then read-only and repaired after a power cut", rounds, rounds))
}

// loopDisk is a small ext4 file system on a loop device, mounted with
// errors=remount-ro; it is unmounted and its device detached (and waited
// for until gone) at the end of the test.
type loopDisk struct {
	dir, dev string
}

// newLoopDisk makes a loop disk of mib MiB. Call it before newNode: its
// cleanup then runs after the node's containers are gone, which hold its
// file system through their bind mounts of the pods' files.
func newLoopDisk(t *testing.T, mib int) *loopDisk {
	t.Helper()
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop device support: %v", err)
	}
	tmp := t.TempDir()
	img := filepath.Join(tmp, "disk.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, int64(mib)<<20); err != nil {
		t.Fatal(err)
	}
	d := &loopDisk{dir: filepath.Join(tmp, "state")}
	d.dev = strings.TrimSpace(run(t, "losetup", "--find", "--show", img))
	t.Cleanup(func() { d.remove(t) })
	run(t, "mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096", d.dev)
	if err := os.Mkdir(d.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	run(t, "mount", "-o", "errors=remount-ro", d.dev, d.dir)
	return d
}

// remove unmounts the disk and detaches its device, waiting until the
// device is gone: one still open is only marked to go.
func (d *loopDisk) remove(t *testing.T) {
	for _, m := range mountsUnder(d.dir) { // innermost first
		unmount(m)
	}
	if err := syscall.Unmount(d.dir, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
		t.Errorf("umount %s: %v", d.dir, err)
		unmount(d.dir)
	}
	if out, err := exec.Command("losetup", "-d", d.dev).CombinedOutput(); err != nil {
		t.Errorf("losetup -d %s: %v: %s", d.dev, err, out)
	}
	backing := "/sys/block/" + filepath.Base(d.dev) + "/loop/backing_file"
	within(30*time.Second).For(t, "loop device "+d.dev+" detached", func() (bool, string) {
		b, err := os.ReadFile(backing)
		return err != nil, strings.TrimSpace(string(b))
	})
}

// mountsUnder returns the mount points below dir, innermost first.
func mountsUnder(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append([]string{f[4]}, out...)
		}
	}
	return out
}

// fill writes a file on the disk until it is full and returns its path.
func (d *loopDisk) fill(t *testing.T) string {
	t.Helper()
	path := filepath.Join(d.dir, "filler")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int{1 << 20, 4 << 10, 512} {
		buf := make([]byte, size)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("fill %s: %v", path, err)
				}
				break
			}
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.dir, &st); err != nil {
		t.Fatal(err)
	}
	if free := st.Bavail * uint64(st.Bsize); free >= 1<<20 {
		t.Fatalf("%s has %d bytes free after filling it", d.dir, free)
	}
	return path
}

// repair unmounts the disk, checks it with e2fsck -fy (once the kernel
// has let go of it: a killed container's mount namespace may hold it a
// moment longer) and mounts it again.
func (d *loopDisk) repair(t *testing.T) {
	t.Helper()
	for _, m := range mountsUnder(d.dir) {
		unmount(m)
	}
	if err := syscall.Unmount(d.dir, 0); err != nil {
		t.Fatalf("umount %s: %v", d.dir, err)
	}
	within(30*time.Second).For(t, "e2fsck of "+d.dev, func() (bool, string) {
		out, err := exec.Command("e2fsck", "-fy", d.dev).CombinedOutput()
		var exit *exec.ExitError
		// 1: errors corrected, as after the error the kernel recorded.
		return err == nil || errors.As(err, &exit) && exit.ExitCode() == 1, string(out)
	})
	run(t, "mount", "-o", "errors=remount-ro", d.dev, d.dir)
}

// fail makes the kernel remount the disk read-only as after an error it
// found (ext4's trigger_fs_error, with errors=remount-ro).
func (d *loopDisk) fail(t *testing.T) {
	t.Helper()
	trigger := "/sys/fs/ext4/" + filepath.Base(d.dev) + "/trigger_fs_error"
	if err := os.WriteFile(trigger, []byte("soak: a dying disk\n"), 0o200); err != nil {
		t.Fatalf("make %s fail: %v", d.dir, err)
	}
	if err := os.WriteFile(filepath.Join(d.dir, "probe"), nil, 0o600); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("%s after an error: write gives %v, want EROFS", d.dir, err)
	}
}

// setStateDir points the node's agent at dir for its state.
func (n *node) setStateDir(dir string) {
	n.t.Helper()
	b, err := os.ReadFile(n.cfg)
	if err != nil {
		n.t.Fatal(err)
	}
	old := "stateDir: " + filepath.Join(n.dir, "state") + "\n"
	if !strings.Contains(string(b), old) {
		n.t.Fatalf("%s has no %q", n.cfg, old)
	}
	if err := os.WriteFile(n.cfg, []byte(strings.Replace(string(b), old, "stateDir: "+dir+"\n", 1)), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

// logCount counts the agent log's lines that contain s.
func (n *node) logCount(s string) int {
	b, _ := os.ReadFile(filepath.Join(n.dir, "agent.log"))
	return strings.Count(string(b), s)
}

// waitStore waits until the running agent's status says its store takes
// writes (reason "") or takes none for reason, in JSON and in the table,
// and returns what it said.
func (n *node) waitStore(timeout time.Duration, reason string) agent.StoreWrites {
	n.t.Helper()
	var w agent.StoreWrites
	within(timeout).For(n.t, "status to say the store's writes are "+cmpReason(reason), func() (bool, string) {
		s, err := n.status()
		if err != nil || s.From != "agent" || s.Agent == nil {
			return false, fmt.Sprint(err)
		}
		w = s.Agent.StoreWrites
		if w.Writable != (reason == "") || w.Reason != reason {
			return false, asJSON(w)
		}
		table, err := n.outpost("status")
		says := strings.Contains(table, "STORE TAKES NO WRITES ("+reason+",")
		return err == nil && says == (reason != ""), table
	})
	return w
}

func cmpReason(reason string) string {
	if reason == "" {
		return "fine"
	}
	return "refused: " + reason
}

// checkStore opens the stopped agent's store read-only, runs bbolt's
// check and returns the names of the pods and config maps it holds.
func (n *node) checkStore(t *testing.T) (pods, configMaps map[string]bool) {
	t.Helper()
	st, err := store.Open(filepath.Join(n.stateDir(t), store.FileName), store.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("open the store read-only: %v", err)
	}
	defer st.Close()
	if err := st.Check(); err != nil {
		t.Fatalf("store check: %v", err)
	}
	s, err := agent.ReadStatus(st)
	if err != nil {
		t.Fatalf("read the store: %v", err)
	}
	pods = map[string]bool{}
	for _, p := range s.Pods {
		pods[p.Name] = true
	}
	cms, err := st.ConfigMaps().List()
	if err != nil {
		t.Fatalf("read the store's config maps: %v", err)
	}
	configMaps = map[string]bool{}
	for _, r := range cms {
		configMaps[r.Object.Name] = true
	}
	return pods, configMaps
}

// stateDir is the stateDir of the node's config.
func (n *node) stateDir(t *testing.T) string {
	b, err := os.ReadFile(n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "stateDir: "); ok {
			return v
		}
	}
	t.Fatalf("%s has no stateDir", n.cfg)
	return ""
}

// storeCondition returns the Node's StoreWritable condition, nil when it
// has none or cannot be read.
func storeCondition(adm *admin, name string) *corev1.NodeCondition {
	ctx, cancel := adm.ctx()
	defer cancel()
	var node corev1.Node
	if err := adm.core.Get().Resource("nodes").Name(name).Do(ctx).Into(&node); err != nil {
		return nil
	}
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == agent.NodeStoreWritable {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

func waitStoreCondition(t *testing.T, adm *admin, name string, status corev1.ConditionStatus, reason string) {
	t.Helper()
	within(90*time.Second).For(t, fmt.Sprintf("the Node's StoreWritable condition %s, %s", status, reason), func() (bool, string) {
		c := storeCondition(adm, name)
		return c != nil && c.Status == status && c.Reason == reason, asJSON(c)
	})
}
