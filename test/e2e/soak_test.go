package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/test/e2e/env"
)

// soakScale is SOAK_SCALE: quick (the whole suite under 15 minutes) or
// full (under 90).
type soakScale struct{ full bool }

// n is quick's count at quick scale and full's at full scale.
func (s soakScale) n(quick, full int) int {
	if s.full {
		return full
	}
	return quick
}

// d is quick's duration at quick scale and full's at full scale.
func (s soakScale) d(quick, full time.Duration) time.Duration {
	if s.full {
		return full
	}
	return quick
}

func (s soakScale) String() string {
	if s.full {
		return "full"
	}
	return "quick"
}

// soakResult is one trial's line in the report: its counts, set as the
// trial goes, so a trial that fails part way says how far it got.
type soakResult struct {
	name   string
	mu     sync.Mutex
	counts string
	failed bool
	took   time.Duration
}

// set replaces the trial's counts.
func (r *soakResult) set(format string, args ...any) {
	r.mu.Lock()
	r.counts = fmt.Sprintf(format, args...)
	r.mu.Unlock()
}

func (r *soakResult) line() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	verdict := "pass"
	if r.failed {
		verdict = "FAIL"
	}
	return fmt.Sprintf("%-14s %s  %-7s %s", r.name, verdict, r.took.Round(time.Second), r.counts)
}

// soakTrial is one trial of the suite: its place in the run (ten times
// its number in docs/soak.md), its name and its function.
type soakTrial struct {
	n    int
	name string
	run  func(t *testing.T, sc soakScale, r *soakResult)
}

// soakTrials are the trials of `make soak`, each added by its file's init.
var soakTrials []soakTrial

// addSoakTrial adds a trial to the suite, to run in the order of n.
func addSoakTrial(n int, name string, run func(t *testing.T, sc soakScale, r *soakResult)) {
	soakTrials = append(soakTrials, soakTrial{n, name, run})
	sort.Slice(soakTrials, func(i, j int) bool { return soakTrials[i].n < soakTrials[j].n })
}

// soakResults are the trials run by this process, for TestMain's report.
var soakResults []*soakResult

// TestSoak runs the reliability trials of `make soak`, one subtest each,
// at SOAK_SCALE (quick or full); SOAK_TRIALS, a regular expression, picks
// some. Without SOAK_SCALE it skips: `go test ./...` does not run it.
func TestSoak(t *testing.T) {
	scale := os.Getenv("SOAK_SCALE")
	if scale == "" {
		t.Skip("the soak trials run with `make soak` (SOAK_SCALE=quick|full)")
	}
	if scale != "quick" && scale != "full" {
		t.Fatalf("SOAK_SCALE=%q: want quick or full", scale)
	}
	env.RequireRoot(t)
	pick := regexp.MustCompile(os.Getenv("SOAK_TRIALS"))
	sc := soakScale{full: scale == "full"}
	for _, tr := range soakTrials {
		if !pick.MatchString(tr.name) {
			continue
		}
		r := &soakResult{name: tr.name, counts: "did not start"}
		soakResults = append(soakResults, r)
		start := time.Now()
		ok := t.Run(tr.name, func(t *testing.T) { tr.run(t, sc, r) })
		r.mu.Lock()
		r.failed, r.took = !ok, time.Since(start)
		r.mu.Unlock()
		fmt.Printf("soak: %s\n", r.line())
	}
}

// writeSoakReport prints the trials' lines and `N passed, N failed`, and
// writes them to SOAK_REPORT (a markdown file) when it is set; TestMain
// calls it after the tests.
func writeSoakReport() {
	if len(soakResults) == 0 {
		return
	}
	passed, failed := 0, 0
	var lines []string
	for _, r := range soakResults {
		lines = append(lines, r.line())
		if r.failed {
			failed++
		} else {
			passed++
		}
	}
	total := fmt.Sprintf("%d passed, %d failed", passed, failed)
	fmt.Printf("\nsoak (%s):\n%s\n%s\n", os.Getenv("SOAK_SCALE"), strings.Join(lines, "\n"), total)
	path := os.Getenv("SOAK_REPORT")
	if path == "" {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# outpost soak report\n\n")
	fmt.Fprintf(&b, "- date: %s\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "- scale: %s\n", os.Getenv("SOAK_SCALE"))
	fmt.Fprintf(&b, "- commit: %s\n", strings.TrimSpace(cmdOut("git", "-C", "../..", "describe", "--always", "--dirty")))
	fmt.Fprintf(&b, "- machine: %s, %d CPUs\n", strings.TrimSpace(cmdOut("uname", "-srm")), runtime.NumCPU())
	fmt.Fprintf(&b, "- containerd: %s\n", strings.TrimSpace(cmdOut("containerd", "--version")))
	fmt.Fprintf(&b, "\n| trial | result | time | counts |\n|---|---|---|---|\n")
	for _, r := range soakResults {
		r.mu.Lock()
		verdict := "pass"
		if r.failed {
			verdict = "**FAIL**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", r.name, verdict, r.took.Round(time.Second), strings.ReplaceAll(r.counts, "|", "/"))
		r.mu.Unlock()
	}
	fmt.Fprintf(&b, "\n%s\n", total)
	err := os.MkdirAll(filepath.Dir(path), 0o755)
	if err == nil {
		err = os.WriteFile(path, []byte(b.String()), 0o644)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak: write report: %v\n", err)
	}
}

// cmdOut is the command's output, or the error when it fails.
func cmdOut(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return fmt.Sprintf("(%s: %v)", name, err)
	}
	return string(out)
}
