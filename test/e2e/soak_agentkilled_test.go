package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

func init() { addSoakTrial(10, "AgentKilled", soakAgentKilled) }

// soakAgentKilled is trial 1 of docs/soak.md: the agent killed with
// SIGKILL at random moments (60 quick, 200 full) while pods are added,
// edited and removed, readiness probes flap and a Service comes, goes and
// changes its port. After each kill the store opens (`outpost status`
// reads it with no agent). At the end every desired pod runs exactly one
// container, the edited pod runs its last edit, removed pods left no
// container, every pod has an address of its own and a network namespace
// of its own, none left over, and the nftables rules send each Service to
// exactly its ready backends.
func soakAgentKilled(t *testing.T, sc soakScale, r *soakResult) {
	kills := sc.n(60, 200)
	n := newNode(t, "soak-kill")
	n.outside() // a route, without which the node's own cluster IP traffic is dropped
	ctl, out := t.TempDir(), t.TempDir()
	stable := []string{"web-a", "web-b", "alpha"}
	n.write("web-a.yaml", backendPod("web-a", ctl))
	n.write("web-b.yaml", backendPod("web-b", ctl))
	n.write("alpha.yaml", podManifest("alpha", "Always", "while true; do sleep 1; done"))
	edits := 0
	n.write("edited.yaml", editedPod(out, edits))
	web2 := soakService{}
	n.write("services.yaml", web2.manifest())

	// Probes flap: the readiness files of web-b and of the churned pods
	// come and go until the end.
	flapCtx, stopFlap := newStop()
	var flapWG sync.WaitGroup
	flapWG.Add(1)
	go func() {
		defer flapWG.Done()
		rng := rand.New(rand.NewPCG(11, uint64(time.Now().UnixNano())))
		names := []string{"web-b", "churn0", "churn1", "churn2"}
		for {
			select {
			case <-flapCtx:
				return
			case <-time.After(time.Duration(200+rng.IntN(600)) * time.Millisecond):
			}
			f := filepath.Join(ctl, names[rng.IntN(len(names))]+"-"+n.name)
			if _, err := os.Stat(f); err == nil {
				os.Remove(f)
			} else {
				os.WriteFile(f, nil, 0o644)
			}
		}
	}()
	defer func() { stopFlap(); flapWG.Wait() }()

	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	present := map[string]bool{}
	opened, added, removed := 0, 0, 0
	for i := range kills {
		switch op := rng.IntN(4); op {
		case 0, 1:
			name := fmt.Sprintf("churn%d", rng.IntN(3))
			if present[name] {
				os.Remove(filepath.Join(n.manifests, name+".yaml"))
				delete(present, name)
				removed++
			} else {
				n.write(name+".yaml", backendPod(name, ctl))
				present[name] = true
				added++
			}
		case 2:
			edits++
			n.write("edited.yaml", editedPod(out, edits))
		case 3:
			web2.change(rng)
			n.write("services.yaml", web2.manifest())
		}
		n.start()
		time.Sleep(time.Duration(200+rng.IntN(1300)) * time.Millisecond)
		n.kill()
		// The store opens after every kill: `outpost status` reads it
		// with no agent running.
		s, err := n.status()
		if err != nil {
			t.Fatalf("kill %d: the store does not open: outpost status: %v", i+1, err)
		}
		if s.From != "store" {
			t.Fatalf("kill %d: outpost status answered from %q with no agent running; want the store", i+1, s.From)
		}
		opened++
		r.set("%d of %d kills; store opened %d/%d; %d pods added, %d removed, %d edits, %d Service changes", i+1, kills, opened, i+1, added, removed, edits, web2.changes)
	}
	stopFlap()
	flapWG.Wait()
	// All ready at the end, so the rules' endpoints are known.
	ents, _ := os.ReadDir(ctl)
	for _, e := range ents {
		os.Remove(filepath.Join(ctl, e.Name()))
	}
	n.start()

	want := append([]string(nil), stable...)
	want = append(want, "edited")
	for name := range present {
		want = append(want, name)
	}
	sort.Strings(want)
	for _, name := range want {
		n.waitPod(name+"-"+n.name, 90*time.Second, "running and ready", func(p *agent.PodInfo) bool { return running(p) && ready(p) })
	}
	within(30*time.Second).For(t, fmt.Sprintf("one running task for each of %v after %d kills", want, kills), func() (bool, string) {
		tasks := runningTasks(t, n)
		ok := len(tasks) == len(want)
		for _, name := range want {
			if tasks[podUIDPrefix(t, n, name+"-"+n.name)] != 1 {
				ok = false
			}
		}
		return ok, fmt.Sprintf("running tasks per pod %v", tasks)
	})
	within(30*time.Second).For(t, fmt.Sprintf("the edited pod running edit %d", edits), func() (bool, string) {
		b, _ := os.ReadFile(filepath.Join(out, "edit"))
		return strings.TrimSpace(string(b)) == fmt.Sprint(edits), fmt.Sprintf("it wrote %q", b)
	})
	s, err := n.status()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	ips := map[string]string{}
	backends := map[string]bool{}
	for _, p := range s.Pods {
		names = append(names, strings.TrimSuffix(p.Name, "-"+n.name))
		ip := p.Status.PodIP
		if other, dup := ips[ip]; dup || ip == "" {
			t.Errorf("pod %s has address %q, as %s has", p.Name, ip, other)
		}
		ips[ip] = p.Name
		if strings.HasPrefix(p.Name, "web-") || strings.HasPrefix(p.Name, "churn") {
			backends[ip] = true
		}
	}
	sort.Strings(names)
	if !slices.Equal(names, want) {
		t.Errorf("status lists pods %v; want %v", names, want)
	}
	pinned := 0
	for e := range netnsEntries() {
		if strings.HasPrefix(e, n.netnsPrefix) {
			pinned++
		}
	}
	if pinned != len(want) {
		t.Errorf("%d pod network namespaces for %d pods", pinned, len(want))
	}

	// The rules: every Service's cluster IP and port to exactly the ready
	// backends, and nothing for a Service that is gone.
	wantRules := map[string]map[string]bool{"10.43.0.80 . tcp . 80": backends}
	if web2.present {
		wantRules[fmt.Sprintf("10.43.0.81 . tcp . %d", web2.port)] = backends
	}
	var got map[string]map[string]bool
	within(30*time.Second).For(t, "the nftables rules matching the Services", func() (bool, string) {
		got = endpointRules(t, n)
		return fmt.Sprint(got) == fmt.Sprint(wantRules), fmt.Sprintf("rules %v; want %v", got, wantRules)
	})
	reachAll(t, n.netns, "10.43.0.80", func() []string {
		var w []string
		for _, name := range want {
			if strings.HasPrefix(name, "web-") || strings.HasPrefix(name, "churn") {
				w = append(w, name+"-"+n.name)
			}
		}
		return w
	}()...)
	r.set("%d kills; store opened %d/%d; %d pods added, %d removed, %d edits, %d Service changes; end: %d pods, 1 container each, edit %d running, 0 left over, %d addresses, 0 twice, %d namespaces; rules match %d Services", kills, opened, kills, added, removed, edits, web2.changes, len(want), edits, len(ips), pinned, len(wantRules))
}

// newStop returns a channel closed by the function, which may be called
// more than once.
func newStop() (<-chan struct{}, func()) {
	c := make(chan struct{})
	var once sync.Once
	return c, func() { once.Do(func() { close(c) }) }
}

// editedPod writes its edit number to out/edit when it starts, then
// sleeps: the file says which edit runs.
func editedPod(out string, edit int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: edited}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    env: [{name: EDIT, value: "%d"}]
    command: [sh, -c, 'echo $EDIT > /out/edit; while true; do sleep 1; done']
    volumeMounts: [{name: out, mountPath: /out}]
  volumes:
  - name: out
    hostPath: {path: %s, type: Directory}
`, env.TestImage, edit, out)
}

// soakService is the churned Service web2: present or not, on port 80
// or 81, always in front of the app=web pods; the file also holds web.
type soakService struct {
	present bool
	port    int
	changes int
}

func (s *soakService) change(rng *rand.Rand) {
	s.changes++
	switch {
	case !s.present:
		s.present, s.port = true, 80+rng.IntN(2)
	case rng.IntN(2) == 0:
		s.present = false
	default:
		s.port = 161 - s.port
	}
}

func (s *soakService) manifest() string {
	m := `apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.43.0.80
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
`
	if s.present {
		m += fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: web2}
spec:
  clusterIP: 10.43.0.81
  selector: {app: web}
  ports: [{port: %d, targetPort: 8080}]
`, s.port)
	}
	return m
}

// endpointElem is an element of the endpoints-k<k> maps of docs/services.md:
// cluster IP . protocol . port . draw : endpoint . port.
var endpointElem = regexp.MustCompile(`(\d+\.\d+\.\d+\.\d+ \. tcp \. \d+) \. 0x[0-9a-f]+ : (\d+\.\d+\.\d+\.\d+) \. \d+`)

// endpointRules returns, from the node's `inet outpost` table, each
// Service port's endpoints as its endpoint maps hold them.
func endpointRules(t *testing.T, n *node) map[string]map[string]bool {
	t.Helper()
	out := run(t, "ip", "netns", "exec", n.netns, "nft", "list", "table", "inet", "outpost")
	got := map[string]map[string]bool{}
	for _, m := range endpointElem.FindAllStringSubmatch(out, -1) {
		if got[m[1]] == nil {
			got[m[1]] = map[string]bool{}
		}
		got[m[1]][m[2]] = true
	}
	return got
}
