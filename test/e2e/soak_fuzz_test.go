package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

func init() { addSoakTrial(70, "Fuzz", soakFuzz) }

// soakFuzz is trial 7 of docs/soak.md, its first half: every fuzz target
// of the repository (every `func FuzzX(f *testing.F)` in a _test.go file)
// run by `go test -fuzz` for SOAK_FUZZTIME each (quick 3s, full 1m), its
// seed corpus being the target's f.Add seeds and its testdata/fuzz/FuzzX
// files. A failing input is written there by go test, and fails the
// trial. With SOAK_KEEP_CORPUS=1 the inputs a run found interesting are
// copied from go's fuzz cache into testdata/fuzz, to be committed.
func soakFuzz(t *testing.T, sc soakScale, r *soakResult) {
	each := sc.d(3*time.Second, time.Minute)
	if v := os.Getenv("SOAK_FUZZTIME"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("SOAK_FUZZTIME=%q: %v", v, err)
		}
		each = d
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	targets := fuzzTargets(t, root)
	if len(targets) == 0 {
		t.Fatal("no fuzz targets found")
	}
	cache := strings.TrimSpace(cmdOut("go", "env", "GOCACHE"))
	keep := os.Getenv("SOAK_KEEP_CORPUS") == "1"
	var execs, interesting, kept int64
	failed := 0
	for i, tg := range targets {
		cmd := exec.Command("go", "test", "-run", "^$", "-fuzz", "^"+tg.name+"$", "-fuzztime", each.String(), "./"+tg.dir)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		n, in := fuzzCounts(string(out))
		execs += n
		interesting += in
		if err != nil {
			failed++
			t.Errorf("%s in ./%s: %v\n%s", tg.name, tg.dir, err, lastLines(string(out), 40))
		}
		if keep && err == nil {
			k, kerr := keepCorpus(root, cache, tg)
			if kerr != nil {
				t.Errorf("%s: keep corpus: %v", tg.name, kerr)
			}
			kept += int64(k)
		}
		r.set("%d of %d targets × %v; %s executions; %d new interesting inputs; %d failed%s", i+1, len(targets), each, humanCount(execs), interesting, failed, keptNote(keep, kept))
	}
}

// fuzzTarget is a fuzz function and its package's directory, relative to
// the repository's root.
type fuzzTarget struct{ dir, name string }

var fuzzFunc = regexp.MustCompile(`^func (Fuzz\w+)\(\w+ \*testing\.F\)`)

// fuzzTargets lists the fuzz functions of the repository's test files.
func fuzzTargets(t *testing.T, root string) []fuzzTarget {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files", "*_test.go").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	var targets []fuzzTarget
	for _, f := range strings.Fields(string(out)) {
		fh, err := os.Open(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			if m := fuzzFunc.FindStringSubmatch(sc.Text()); m != nil {
				targets = append(targets, fuzzTarget{filepath.Dir(f), m[1]})
			}
		}
		fh.Close()
	}
	return targets
}

var (
	fuzzExecs = regexp.MustCompile(`execs: (\d+)`)
	fuzzNew   = regexp.MustCompile(`new interesting: (\d+)`)
)

// fuzzCounts reads the executions and new interesting inputs from go
// test -fuzz's last progress line.
func fuzzCounts(out string) (execs, interesting int64) {
	if m := fuzzExecs.FindAllStringSubmatch(out, -1); m != nil {
		execs, _ = strconv.ParseInt(m[len(m)-1][1], 10, 64)
	}
	if m := fuzzNew.FindAllStringSubmatch(out, -1); m != nil {
		interesting, _ = strconv.ParseInt(m[len(m)-1][1], 10, 64)
	}
	return execs, interesting
}

// keepCorpus copies the inputs in go's fuzz cache for tg that its
// testdata/fuzz lacks, and returns how many it copied.
func keepCorpus(root, cache string, tg fuzzTarget) (int, error) {
	mod := strings.TrimSpace(cmdOut("go", "list", "-C", root, "-m"))
	src := filepath.Join(cache, "fuzz", mod, tg.dir, tg.name)
	if tg.dir == "." {
		src = filepath.Join(cache, "fuzz", mod, tg.name)
	}
	ents, err := os.ReadDir(src)
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	dst := filepath.Join(root, tg.dir, "testdata", "fuzz", tg.name)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		p := filepath.Join(dst, e.Name())
		if _, err := os.Stat(p); err == nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return n, err
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func keptNote(keep bool, kept int64) string {
	if !keep {
		return ""
	}
	return fmt.Sprintf("; %d inputs kept in testdata/fuzz", kept)
}

// humanCount writes n with a k or M suffix.
func humanCount(n int64) string {
	switch {
	case n >= 10_000_000:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 10_000:
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.FormatInt(n, 10)
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
