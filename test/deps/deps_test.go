package deps

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/outpost-edge/outpost"

// buildTags are the tags every build of cmd/outpost uses (the Makefile's
// BUILDTAGS): grpcnotrace keeps grpc from linking golang.org/x/net/trace,
// whose html/template use of reflect disables the linker's dead-method
// elimination (22 MB instead of 28 MB for linux/amd64).
const buildTags = "grpcnotrace"

var update = flag.Bool("update", false, "rewrite testdata/linked-*.txt from the current build")

// pkg is one package as `go list -deps` reports it.
type pkg struct {
	path     string
	standard bool
	imports  []string
	// testImports are the imports of its _test.go files.
	testImports []string
}

func goList(t *testing.T, goos, goarch string, patterns ...string) []pkg {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go command not in PATH")
	}
	args := append([]string{"list", "-tags", buildTags, "-deps", "-f", `{{.ImportPath}}|{{.Standard}}|{{join .Imports ","}}|{{join .TestImports ","}},{{join .XTestImports ","}}`}, patterns...)
	cmd := exec.Command("go", args...)
	cmd.Dir = "../.."
	// -mod=readonly: a go.mod or go.sum that needs a change fails the
	// test instead of being rewritten under the developer.
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0", "GOFLAGS=-mod=readonly -buildvcs=false")
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, "|", 4)
		p := pkg{path: f[0], standard: f[1] == "true"}
		if f[2] != "" {
			p.imports = strings.Split(f[2], ",")
		}
		for _, imp := range strings.Split(f[3], ",") {
			if imp != "" && !slices.Contains(p.testImports, imp) {
				p.testImports = append(p.testImports, imp)
			}
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func under(path, prefix string) bool { return path == prefix || strings.HasPrefix(path, prefix+"/") }

func own(rel string) string { return module + "/" + rel }

// forbiddenInBinary may never be linked into cmd/outpost.
var forbiddenInBinary = []struct{ prefix, why string }{
	{"k8s.io/client-go/kubernetes", "the all-groups Clientset and its scheme link every API group (43 MB vs 26 MB for linux/arm64)"},
	{"k8s.io/kubernetes", "k8s.io/kubernetes is not a library"},
	{"k8s.io/client-go/dynamic", "the dynamic client is not needed: build REST clients over a small scheme"},
	{"k8s.io/client-go/applyconfigurations", "apply configurations link every API group"},
	{"k8s.io/client-go/informers", "informers keep caches in memory; watches write to the store"},
	{"golang.org/x/net/trace", "build with -tags " + buildTags + ": its html/template disables dead-method elimination"},
	{"text/template", "its reflect method calls keep every exported method of every type in the binary"},
	{"html/template", "its reflect method calls keep every exported method of every type in the binary"},
	{"github.com/containerd/containerd/v2/client", "agent/containerd/ctrd is the agent's client: the v2 client links go-cmp, distribution/reference and API services the agent never calls, whose initialisers keep memory"},
	{"github.com/google/go-cmp", "a test library; containerd's pkg/protobuf links it (use agent/containerd/ctrd's stores, not containerd's proxies)"},
	{"github.com/distribution/reference", "its init compiles regular expressions kept for the process's life; agent/containerd/imageio normalizes references"},
}

// TestBuildsUseTags checks that every build of the binary in the Makefile
// and the scripts passes buildTags.
func TestBuildsUseTags(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mk), "\nBUILDTAGS := "+buildTags+"\n") {
		t.Errorf("Makefile: want the line `BUILDTAGS := %s`", buildTags)
	}
	files, _ := filepath.Glob("../../scripts/*.sh")
	files = append(files, "../../Makefile", "../e2e/node_test.go")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			build := strings.Contains(line, "go build") || strings.Contains(line, "$(GO) build") || strings.Contains(line, `"build",`)
			if build && strings.Contains(line, "./cmd/outpost") && !strings.Contains(line, buildTags) && !strings.Contains(line, "BUILDTAGS") {
				t.Errorf("%s:%d: builds cmd/outpost without -tags %s", strings.TrimPrefix(f, "../../"), i+1, buildTags)
			}
		}
	}
}

func TestBinaryLinksNoForbiddenPackage(t *testing.T) {
	for _, p := range goList(t, "linux", "arm64", "./cmd/outpost") {
		for _, f := range forbiddenInBinary {
			if under(p.path, f.prefix) {
				t.Errorf("cmd/outpost links %s: %s", p.path, f.why)
			}
		}
	}
}

// layerRules says which of our own packages a package may import, by
// prefix; DESIGN.md's layout table.
var layerRules = []struct {
	from   string
	forbid []string
}{
	{"store", []string{"agent", "sync", "netproxy", "arm", "cmd", "test"}},
	{"agent", []string{"sync", "netproxy", "cmd", "test"}},
	{"netproxy", []string{"agent", "sync", "cmd", "test"}},
	{"sync", []string{"agent", "netproxy", "cmd", "test"}},
	{"arm", []string{"agent", "sync", "netproxy", "store", "internal", "cmd", "test"}},
	{"internal", []string{"agent", "sync", "netproxy", "store", "cmd", "test"}},
}

// stdLeaves import only the standard library: arm reads board facts
// from files, and every layer shares internal/report's status types.
var stdLeaves = []string{"arm", "internal/report"}

// adapters names the one package tree allowed to import each heavy
// dependency directly.
var adapters = []struct{ dep, only string }{
	{"github.com/containerd/containerd", "agent/containerd"},
	{"github.com/google/nftables", "netproxy/nft"},
	{"github.com/vishvananda/netlink", "netproxy/podnet"},
	{"k8s.io/client-go", "sync/kube"},
	{"github.com/eclipse/paho.mqtt.golang", "sync/mqtt"},
	{"go.etcd.io/bbolt", "store"},
	{"github.com/mdlayher/netlink", "netproxy/nft"},
	{"github.com/vishvananda/netns", "netproxy/podnet"},
	{"google.golang.org/grpc", "agent/prober"},
}

// testAdapterExtra lets a tree's tests use a dependency its code does
// not: agent/server's tests are the API server's side of exec, attach
// and port-forward (client-go's SPDY streams), as kubectl's are;
// agent/containerd's fake containerd task service has gRPC's signatures.
var testAdapterExtra = map[string][]string{
	"k8s.io/client-go":       {"agent/server"},
	"google.golang.org/grpc": {"agent/containerd"},
}

// adapterExtra lets a second tree use a dependency where DESIGN.md says so.
var adapterExtra = map[string][]string{
	"k8s.io/client-go": {"sync/bridge"},
	// containerd's API is gRPC: its client dials and reads statuses.
	"google.golang.org/grpc": {"agent/containerd/ctrd"},
}

// testEnvAllowed lets a package's own tests start parts of the end-to-end
// environment (test/e2e/env), with the reason they are not under test/.
var testEnvAllowed = map[string]string{
	// Its tests drive its unexported loops (the watches, the status
	// patches, the certificate rotation) against a real API server, at
	// a fake clock; from test/ they could reach only what the agent's
	// binary shows.
	"sync/kube": "tests of unexported loops against a real kube-apiserver",
	// The agent's own containerd client, tested against a real
	// containerd beside containerd's v2 client, which only tests link.
	"agent/containerd/ctrd":    "a containerd client tested against a real containerd",
	"agent/containerd/imageio": "pull, import and unpack compared with containerd's v2 client on a real containerd",
}

// TestPackageLayering checks the layout's rules on every package and on
// its test files too: a unit test may use what its package may (and the
// test support of its own tree), nothing under test/; a test that needs
// the end-to-end environment (a real API server, containerd, a netns)
// lives under test/.
func TestPackageLayering(t *testing.T) {
	for _, p := range goList(t, "linux", "amd64", "./...") {
		if !under(p.path, module) {
			continue
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p.path, module), "/")
		for _, r := range layerRules {
			if !under(rel, r.from) {
				continue
			}
			for _, imp := range p.testImports {
				if strings.HasSuffix(imp, "_test") || under(imp, p.path) {
					continue // its own external test package
				}
				if _, ok := testEnvAllowed[rel]; ok && under(imp, own("test/e2e/env")) {
					continue
				}
				for _, f := range r.forbid {
					if under(imp, own(f)) {
						t.Errorf("a test of %s imports %s: DESIGN.md forbids %s/ importing %s/ (a test that needs it goes under test/)", rel, strings.TrimPrefix(imp, module+"/"), r.from, f)
					}
				}
			}
			for _, imp := range p.imports {
				for _, f := range r.forbid {
					if under(imp, own(f)) {
						t.Errorf("%s imports %s: DESIGN.md forbids %s/ importing %s/", rel, strings.TrimPrefix(imp, module+"/"), r.from, f)
					}
				}
			}
		}
		for _, leaf := range stdLeaves {
			if !under(rel, leaf) {
				continue
			}
			for _, imp := range p.imports {
				if !isStd(imp) {
					t.Errorf("%s imports %s: %s/ is a leaf on the standard library", rel, imp, leaf)
				}
			}
		}
		if under(rel, "test") || under(rel, "cmd") {
			continue // tests and main may reach anything
		}
		for i, imp := range append(p.imports, p.testImports...) {
			inTest := i >= len(p.imports)
			for _, a := range adapters {
				if !under(imp, a.dep) && !strings.HasPrefix(imp, a.dep+"/") {
					continue
				}
				allowed := append([]string{a.only}, adapterExtra[a.dep]...)
				if inTest {
					allowed = append(allowed, testAdapterExtra[a.dep]...)
				}
				if !slices.ContainsFunc(allowed, func(o string) bool { return under(rel, o) }) {
					t.Errorf("%s imports %s directly; only %s may (one adapter per heavy dependency)", rel, imp, strings.Join(allowed, ", "))
				}
			}
		}
	}
}

func isStd(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

// TestLinkedPackagesList compares the non-standard packages linked into
// cmd/outpost for each target with the committed list, so every new
// dependency shows up in review. Run `go test ./test/deps -update` to
// accept a change.
func TestLinkedPackagesList(t *testing.T) {
	for _, target := range [][2]string{{"linux", "arm64"}, {"linux", "arm"}, {"linux", "amd64"}} {
		var got []string
		for _, p := range goList(t, target[0], target[1], "./cmd/outpost") {
			if !p.standard {
				got = append(got, p.path)
			}
		}
		slices.Sort(got)
		file := filepath.Join("testdata", "linked-"+target[0]+"-"+target[1]+".txt")
		text := strings.Join(got, "\n") + "\n"
		if *update {
			if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		wantData, err := os.ReadFile(file)
		if err != nil {
			t.Fatalf("%v (run `go test ./test/deps -update` to create it)", err)
		}
		want := strings.Split(strings.TrimSpace(string(wantData)), "\n")
		var added, removed []string
		for _, g := range got {
			if !slices.Contains(want, g) {
				added = append(added, g)
			}
		}
		for _, w := range want {
			if !slices.Contains(got, w) {
				removed = append(removed, w)
			}
		}
		if len(added)+len(removed) > 0 {
			t.Errorf("%s/%s: packages linked into cmd/outpost changed (review, then `go test ./test/deps -update`):\n  added:   %s\n  removed: %s",
				target[0], target[1], strings.Join(added, "\n           "), strings.Join(removed, "\n           "))
		}
	}
}

// testSupport reports whether path is one of our test-support packages
// (agent/runtimetest, internal/clock/clocktest, netproxy/nfttest, …):
// fakes and helpers named like net/http/httptest.
func testSupport(path string) bool {
	return under(path, module) && strings.HasSuffix(path[strings.LastIndex(path, "/")+1:], "test")
}

// TestOnlyTestsImportTestSupport fails when code that is not a test (nor
// itself test support) imports a test-support package: fakes stay out of
// production packages and out of the binary.
func TestOnlyTestsImportTestSupport(t *testing.T) {
	for _, p := range goList(t, "linux", "amd64", "./...") {
		if !under(p.path, module) || under(p.path, own("test")) || testSupport(p.path) {
			continue
		}
		for _, imp := range p.imports {
			if testSupport(imp) {
				t.Errorf("%s imports %s: only tests may use test support", strings.TrimPrefix(p.path, module+"/"), strings.TrimPrefix(imp, module+"/"))
			}
		}
	}
}

// TestShimStartLinksOnlyTheStandardLibrary keeps the shim start binary
// small: containerd runs it for every task it creates, and its reason to
// exist is to start faster than containerd-shim-runc-v2.
func TestShimStartLinksOnlyTheStandardLibrary(t *testing.T) {
	for _, p := range goList(t, "linux", "arm64", "./cmd/containerd-shim-outpost-v2") {
		if !p.standard && p.path != own("cmd/containerd-shim-outpost-v2") {
			t.Errorf("cmd/containerd-shim-outpost-v2 links %s", p.path)
		}
	}
}
