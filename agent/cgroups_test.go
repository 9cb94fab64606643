package agent_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent/cgroups"
)

// A pod's cgroups go with the pod, an attempt's with the attempt when
// it is collected, and at start those of pods the agent no longer has.
func TestPodCgroupsGoWithTheirPods(t *testing.T) {
	h := newHarness(t)
	root := t.TempDir()
	h.cgroups = cgroups.Tree{Root: root, Parent: "/outpost"}
	hierarchies := []string{"memory", "pids"}
	// runc makes a container's cgroup, and its pod's above it, in every
	// hierarchy; the fake runtime does not, so the test does.
	dir := func(h, uid, id string) string { return filepath.Join(root, h, "outpost", "pod"+uid, id) }
	runc := func(uid, id string) {
		t.Helper()
		for _, hy := range hierarchies {
			if err := os.MkdirAll(dir(hy, uid, id), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	exists := func(uid, id string) bool {
		for _, hy := range hierarchies {
			if _, err := os.Stat(dir(hy, uid, id)); err == nil {
				return true
			}
		}
		return false
	}
	// Left by a pod the agent was removing when it died: its directory
	// says it was the agent's.
	runc("0ld0ld0ld", "c-0")
	if err := os.MkdirAll(filepath.Join(h.dir, "pods", "0ld0ld0ld"), 0o750); err != nil {
		t.Fatal(err)
	}
	// Of a pod the agent has no record of: not its own to remove.
	runc("5trange", "c-0")

	web := newPod("web", corev1.RestartPolicyAlways, ctr("app"))
	uid := string(web.UID)
	// The volumes' teardown removes the pod's directory, the record an
	// agent that dies after it would need to find the pod's cgroups: they
	// must be gone by then.
	var cgroupsAtTeardown []string
	var mu sync.Mutex
	h.teardown = func(podUID string) error {
		mu.Lock()
		defer mu.Unlock()
		if exists(podUID, "") {
			cgroupsAtTeardown = append(cgroupsAtTeardown, podUID)
		}
		return os.RemoveAll(filepath.Join(h.dir, "pods", podUID))
	}
	h.put(web)
	h.start()
	h.synced(0, "app running", func() bool { return h.running(id(web, "app", 0)) })
	runc(uid, id(web, "app", 0))
	h.eventually("the cgroups and directory of a pod the agent was removing removed at its start", func() bool {
		_, err := os.Stat(filepath.Join(h.dir, "pods", "0ld0ld0ld"))
		return !exists("0ld0ld0ld", "") && os.IsNotExist(err)
	})
	if !exists("5trange", "c-0") {
		t.Errorf("the agent removed the cgroups of a pod it has no record of")
	}

	// Two restarts: the first attempt is collected, its cgroup with it.
	h.exit(id(web, "app", 0), 1, "app backing off", func() bool { return h.state(web, "app") == "waiting:CrashLoopBackOff" })
	h.advance(10 * time.Second)
	h.eventually("app restarted", func() bool { return h.running(id(web, "app", 1)) })
	runc(uid, id(web, "app", 1))
	h.exit(id(web, "app", 1), 1, "app backing off again", func() bool { return h.state(web, "app") == "waiting:CrashLoopBackOff" })
	h.advance(20 * time.Second)
	h.eventually("app restarted again", func() bool { return h.running(id(web, "app", 2)) })
	runc(uid, id(web, "app", 2))
	h.eventually("the first attempt's cgroup removed with it", func() bool { return !exists(uid, id(web, "app", 0)) })
	if !exists(uid, id(web, "app", 1)) || !exists(uid, id(web, "app", 2)) {
		t.Errorf("the cgroups of the attempts kept (the last dead one, the running one) were removed")
	}

	if _, err := h.st.Pods().Delete(web.Namespace, web.Name); err != nil {
		t.Fatal(err)
	}
	h.eventually("the pod's cgroups removed in every hierarchy", func() bool { return !exists(uid, "") })
	mu.Lock()
	defer mu.Unlock()
	if len(cgroupsAtTeardown) > 0 {
		t.Errorf("pods %v still had cgroups when their volumes (and directory) were torn down", cgroupsAtTeardown)
	}
}
