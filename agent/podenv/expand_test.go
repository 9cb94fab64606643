package podenv

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func mapLookup(m map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

// Cases follow kubelet's third_party/forked/golang/expansion tests.
func TestExpand(t *testing.T) {
	vars := mapLookup(map[string]string{"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_EMPTY": "", "VAR_REF": "$(VAR_A)"})
	tests := []struct{ in, want string }{
		{"", ""},
		{"plain", "plain"},
		{"$(VAR_A)", "A"},
		{"___$(VAR_B)___", "___B___"},
		{"$(VAR_A)-$(VAR_B)-$(VAR_C)", "A-B-C"},
		{"$(VAR_C)$(VAR_A)", "CA"},
		{"$(VAR_EMPTY)x", "x"},
		{"$(VAR_REF)", "$(VAR_A)"}, // values are not expanded again
		{"$(VAR_DNE)", "$(VAR_DNE)"},
		{"$()", "$()"},
		{"$$(VAR_A)", "$(VAR_A)"},
		{"$$$(VAR_A)", "$A"},
		{"$$$$(VAR_A)", "$$(VAR_A)"},
		{"$$", "$"},
		{"$$$", "$$"},
		{"$", "$"},
		{"x$", "x$"},
		{"$(VAR_A)$", "A$"},
		{"$(VAR_A", "$(VAR_A"},
		{"$(VAR_A$(VAR_B)", "$(VAR_A$(VAR_B)"},
		{"$(VAR_A$(VAR_B))", "$(VAR_A$(VAR_B))"},
		{"$?_boo_$!", "$?_boo_$!"},
		{"$VAR_A", "$VAR_A"},
		{"$é$(VAR_A)", "$éA"},
		{"(VAR_A)", "(VAR_A)"},
	}
	for _, tt := range tests {
		if got := Expand(tt.in, vars); got != tt.want {
			t.Errorf("Expand(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestLookupLaterEntryWins(t *testing.T) {
	l := Lookup([]string{"A=1", "B=x=y", "A=2", "C"})
	for name, want := range map[string]string{"A": "2", "B": "x=y", "C": ""} {
		if got, ok := l(name); !ok || got != want {
			t.Errorf("lookup(%q) = %q, %v; want %q", name, got, ok, want)
		}
	}
	if _, ok := l("D"); ok {
		t.Error("lookup(D) found a value")
	}
}

func FuzzExpand(f *testing.F) {
	for _, s := range []string{"$(A)", "$$(A)", "$$$(A)", "$(A", "$", "$(", "a$b", "$()", "$(A)$(B)$$"} {
		f.Add(s, "A", "va")
	}
	f.Fuzz(func(t *testing.T, s, name, val string) {
		lookup := mapLookup(map[string]string{name: val})
		got := Expand(s, lookup)
		if !strings.Contains(s, "$") && got != s {
			t.Fatalf("Expand(%q) = %q, want input unchanged", s, got)
		}
		// Escaping every "$" makes any input literal.
		if esc := Expand(strings.ReplaceAll(s, "$", "$$"), lookup); esc != s {
			t.Fatalf("Expand(escaped %q) = %q", s, esc)
		}
		if !strings.Contains(name, ")") {
			if got := Expand("<$("+name+")>", lookup); got != "<"+val+">" {
				t.Fatalf("Expand of reference to %q = %q, want %q", name, got, "<"+val+">")
			}
		}
	})
}

func FuzzFieldRef(f *testing.F) {
	for _, s := range []string{"metadata.name", "metadata.labels['app']", "metadata.annotations['a/b']", "metadata.labels['", "['x']", "status.podIPs", "metadata.labels['a']']"} {
		f.Add(s)
	}
	pod := testPod()
	f.Fuzz(func(t *testing.T, path string) {
		p, key, ok := SplitSubscript(path)
		if ok && p+"['"+key+"']" != path {
			t.Fatalf("SplitSubscript(%q) = %q, %q: does not rebuild the input", path, p, key)
		}
		if !ok && p != path {
			t.Fatalf("SplitSubscript(%q) changed an unsubscripted path to %q", path, p)
		}
		v, err := FieldRefValue(pod, &corev1.ObjectFieldSelector{FieldPath: path}, "", "")
		if err != nil && v != "" {
			t.Fatalf("FieldRefValue(%q) returned %q with error %v", path, v, err)
		}
		if err != nil && !strings.Contains(err.Error(), "fieldRef") {
			t.Fatalf("error %q does not name the fieldRef", err)
		}
	})
}

func TestFormatMap(t *testing.T) {
	got := FormatMap(map[string]string{"b": "x\ny", "a": `q"uote`, "c": ""})
	want := "a=\"q\\\"uote\"\nb=\"x\\ny\"\nc=\"\""
	if got != want {
		t.Errorf("FormatMap = %q, want %q", got, want)
	}
	if FormatMap(nil) != "" {
		t.Error("FormatMap(nil) is not empty")
	}
}
