package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// mkdirs makes dirs under root; a real cgroupfs makes the control files
// itself and rmdir takes them, so empty directories stand in for
// cgroups here, and a cgroup.procs file with PIDs for a busy one.
func mkdirs(t *testing.T, root string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// left lists the directories under root, relative, sorted.
func left(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && p != root {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return err
	})
	slices.Sort(out)
	return out
}

// v1 is a hybrid cgroup v1 layout: two hierarchies, unified (v2), and
// cpu as a symbolic link to cpu,cpuacct as systemd mounts it.
func v1(t *testing.T) string {
	root := t.TempDir()
	mkdirs(t, root, "memory", "pids", "cpu,cpuacct", "unified")
	if err := os.Symlink("cpu,cpuacct", filepath.Join(root, "cpu")); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestRemovePodInEveryHierarchy(t *testing.T) {
	root := v1(t)
	for _, h := range []string{"memory", "pids", "cpu,cpuacct", "unified"} {
		mkdirs(t, root, h+"/outpost/poda/c1", h+"/outpost/poda/c2", h+"/outpost/podb/c1", h+"/other")
	}
	tr := Tree{Root: root, Parent: "/outpost"}
	if err := tr.RemovePod("a"); err != nil {
		t.Fatal(err)
	}
	if err := tr.RemovePod("a"); err != nil {
		t.Fatalf("a second RemovePod: %v, want no error for cgroups already gone", err)
	}
	if err := tr.RemoveContainer("b", "c1"); err != nil {
		t.Fatal(err)
	}
	want := []string{}
	for _, h := range []string{"cpu,cpuacct", "memory", "pids", "unified"} {
		want = append(want, h, h+"/other", h+"/outpost", h+"/outpost/podb")
	}
	slices.Sort(want)
	if got := left(t, root); !slices.Equal(got, want) {
		t.Errorf("left %v\nwant %v", got, want)
	}
}

func TestBusyCgroupIsLeftAndReported(t *testing.T) {
	root := t.TempDir()
	// cgroup v2: one hierarchy.
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu memory pids\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mkdirs(t, root, "outpost/poda/idle", "outpost/poda/busy")
	if err := os.WriteFile(filepath.Join(root, "outpost/poda/busy/cgroup.procs"), []byte("4242\n4243\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	killed := fakeKill(t, nil)
	err := Tree{Root: root, Parent: "/outpost"}.RemovePod("a")
	var busy *BusyError
	if !errors.As(err, &busy) || busy.Dir != filepath.Join(root, "outpost/poda/busy") || strings.Join(busy.PIDs, " ") != "4242 4243" {
		t.Fatalf("RemovePod of a pod with processes: %v, want a BusyError for its busy cgroup naming 4242 4243", err)
	}
	if got := left(t, root); !slices.Equal(got, []string{"outpost", "outpost/poda", "outpost/poda/busy"}) {
		t.Errorf("left %v, want the busy cgroup and those above it", got)
	}
	if want := slices.Repeat([]int{4242, 4243}, removeTries-1); !slices.Equal(*killed, want) {
		t.Errorf("killed %v, want 4242 and 4243 before each of the %d retries", *killed, removeTries-1)
	}
}

// fakeKill replaces killProcess for the test: it records the PIDs and
// calls then, if not nil, after each.
func fakeKill(t *testing.T, then func(pid int)) *[]int {
	var killed []int
	old := killProcess
	killProcess = func(pid int) error {
		killed = append(killed, pid)
		if then != nil {
			then(pid)
		}
		return nil
	}
	t.Cleanup(func() { killProcess = old })
	return &killed
}

func TestPodCgroupWithProcessesLeftIsKilledAndRemoved(t *testing.T) {
	root := t.TempDir()
	mkdirs(t, root, "memory/outpost/poda/c1", "pids/outpost/poda/c1")
	procs := filepath.Join(root, "memory/outpost/poda/c1/cgroup.procs")
	if err := os.WriteFile(procs, []byte("4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The killed process leaves its cgroup, as the kernel's would.
	killed := fakeKill(t, func(int) { os.Remove(procs) })
	if err := (Tree{Root: root, Parent: "/outpost"}).RemovePod("a"); err != nil {
		t.Fatalf("RemovePod: %v, want its process killed and its cgroups removed", err)
	}
	if !slices.Equal(*killed, []int{4242}) {
		t.Errorf("killed %v, want [4242]", *killed)
	}
	if got := left(t, root); !slices.Equal(got, []string{"memory", "memory/outpost", "pids", "pids/outpost"}) {
		t.Errorf("left %v, want only the parents", got)
	}
}

func TestBusyContainerCgroupIsRetriedNotKilled(t *testing.T) {
	root := t.TempDir()
	mkdirs(t, root, "memory/outpost/poda/c1")
	if err := os.WriteFile(filepath.Join(root, "memory/outpost/poda/c1/cgroup.procs"), []byte("4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	killed := fakeKill(t, nil)
	var busy *BusyError
	if err := (Tree{Root: root, Parent: "/outpost"}).RemoveContainer("a", "c1"); !errors.As(err, &busy) {
		t.Fatalf("RemoveContainer of a busy cgroup: %v, want a BusyError", err)
	}
	if len(*killed) > 0 {
		t.Errorf("killed %v of a live pod's container cgroup, want none", *killed)
	}
}

func TestNamesThatAreNotOnePathElementAreRefused(t *testing.T) {
	tr := Tree{Root: t.TempDir(), Parent: "/outpost"}
	for _, uid := range []string{"", ".", "..", "a/b", "../../etc"} {
		if err := tr.RemovePod(uid); err == nil {
			t.Errorf("RemovePod(%q): no error", uid)
		}
		if err := tr.RemoveContainer("a", uid); err == nil {
			t.Errorf("RemoveContainer(a, %q): no error", uid)
		}
	}
}

// TestFrozenPodCgroupIsThawedToKill: a pod cgroup that a killed runc left
// frozen (v1's freezer.state, v2's cgroup.freeze) is thawed before its
// processes are killed, or they could not die; one not frozen is left as
// it is.
func TestFrozenPodCgroupIsThawedToKill(t *testing.T) {
	root := v1(t)
	mkdirs(t, root, "freezer/outpost/poda/c1", "memory/outpost/poda/c1", "unified/outpost/poda/c1", "freezer/outpost/podb")
	write := func(rel, v string) {
		if err := os.WriteFile(filepath.Join(root, rel), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(rel string) string {
		b, _ := os.ReadFile(filepath.Join(root, rel))
		return string(b)
	}
	write("freezer/outpost/poda/c1/freezer.state", "FROZEN\n")
	write("unified/outpost/poda/c1/cgroup.freeze", "1\n")
	write("freezer/outpost/podb/freezer.state", "FROZEN\n")
	procs := filepath.Join(root, "memory/outpost/poda/c1/cgroup.procs")
	write("memory/outpost/poda/c1/cgroup.procs", "4242\n")
	var states []string
	fakeKill(t, func(int) {
		states = append(states, read("freezer/outpost/poda/c1/freezer.state"), read("unified/outpost/poda/c1/cgroup.freeze"))
		// Thawed and killed, the process leaves; so do the control files.
		for _, f := range []string{procs, filepath.Join(root, "freezer/outpost/poda/c1/freezer.state"), filepath.Join(root, "unified/outpost/poda/c1/cgroup.freeze")} {
			os.Remove(f)
		}
	})
	if err := (Tree{Root: root, Parent: "/outpost"}).RemovePod("a"); err != nil {
		t.Fatalf("RemovePod: %v", err)
	}
	if !slices.Equal(states, []string{"THAWED", "0"}) {
		t.Errorf("at the kill the cgroup was %q, want thawed in both hierarchies", states)
	}
	if got := read("freezer/outpost/podb/freezer.state"); got != "FROZEN\n" {
		t.Errorf("another pod's cgroup: %q, want it left frozen", got)
	}
}
