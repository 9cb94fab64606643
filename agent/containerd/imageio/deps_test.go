package imageio

import (
	"os/exec"
	"strings"
	"testing"
)

// forbidden are the packages imageio exists not to link, and why; with
// tree, the packages under path too.
var forbidden = []struct {
	path string
	tree bool
	why  string
}{
	{"github.com/containerd/containerd/v2/client", false, "the client imageio replaces"},
	{"github.com/containerd/containerd/v2/core/images/archive", true, "links distribution/reference"},
	{"github.com/containerd/containerd/v2/pkg/protobuf", false, "links go-cmp (containerd's content, snapshot and lease proxies link it)"},
	{"github.com/distribution/reference", true, "compiles its regular expressions at init"},
	{"github.com/google/go-cmp", true, "a test library, allocating at init"},
}

// TestLinksNoForbiddenPackage: imageio's code (not its tests) links none
// of the packages it exists to avoid.
func TestLinksNoForbiddenPackage(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go command not in PATH")
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if p == f.path || f.tree && strings.HasPrefix(p, f.path+"/") {
				t.Errorf("imageio links %s: %s", p, f.why)
			}
		}
	}
}
