package store

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const crashChildEnv = "OUTPOST_STORE_CRASH_CHILD"

// TestMain lets the crash test re-run this binary as the writer it kills.
func TestMain(m *testing.M) {
	if path := os.Getenv(crashChildEnv); path != "" {
		crashChild(path)
		return
	}
	os.Exit(m.Run())
}

// crashChild writes desired pods and journal entries from two goroutines
// until it is killed, printing each write after the store acknowledged it.
func crashChild(path string) {
	s, err := Open(path, Options{NodeName: "crash"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	start, _ := strconv.Atoi(os.Getenv("OUTPOST_STORE_CRASH_START"))
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		mu.Lock()
		fmt.Fprintf(out, format+"\n", args...)
		out.Flush()
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := start + w; ; i += 2 {
				name := fmt.Sprintf("p%06d", i)
				if err := s.Pods().Put(SourceAPI, pod("default", name, "img")); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(4)
				}
				say("pod %s", name)
				key := fmt.Sprintf("pod/default/k%d", i%7)
				if _, err := s.Append(key, []byte(strconv.Itoa(i))); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(5)
				}
				say("journal %s %d", key, i)
			}
		})
	}
	wg.Wait()
}

// TestCrashSafety kills a writer with SIGKILL at random moments 50 times;
// after each kill the store must open, pass bbolt's consistency check, and
// hold every write acknowledged before the kill.
func TestCrashSafety(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test runs a child process 50 times; skipped with -short")
	}
	path := filepath.Join(t.TempDir(), FileName)
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	ackedPods := map[string]bool{}
	ackedJournal := map[string]int{} // newest acknowledged value per key
	next := 0
	for round := range 50 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+path, "OUTPOST_STORE_CRASH_START="+strconv.Itoa(next))
		stdout, err := cmd.StdoutPipe()
		must(t, err)
		cmd.Stderr = os.Stderr
		must(t, cmd.Start())
		lines := make(chan string, 1024)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		// Wait for the first acknowledged write, then kill at a random moment.
		first, ok := <-lines
		if !ok {
			cmd.Wait()
			t.Fatalf("round %d: child wrote nothing (exit %v)", round, cmd.ProcessState)
		}
		time.Sleep(time.Duration(rng.IntN(80)) * time.Millisecond)
		must(t, cmd.Process.Signal(syscall.SIGKILL))
		record := func(l string) {
			f := strings.Fields(l)
			switch f[0] {
			case "pod":
				ackedPods[f[1]] = true
				n, _ := strconv.Atoi(strings.TrimPrefix(f[1], "p"))
				next = max(next, n+2)
			case "journal":
				v, _ := strconv.Atoi(f[2])
				ackedJournal[f[1]] = max(ackedJournal[f[1]], v)
			}
		}
		record(first)
		for l := range lines {
			record(l)
		}
		cmd.Wait()

		s, err := Open(path, Options{}) // runs bbolt's consistency check
		if err != nil {
			t.Fatalf("round %d: reopen after SIGKILL: %v", round, err)
		}
		list, err := s.Pods().List()
		if err != nil {
			t.Fatalf("round %d: list: %v", round, err)
		}
		have := map[string]bool{}
		for _, r := range list {
			have[r.Object.Name] = true
		}
		for name := range ackedPods {
			if !have[name] {
				t.Fatalf("round %d: acknowledged pod %s lost", round, name)
			}
		}
		pend, err := s.Pending(0, 0)
		must(t, err)
		stored := map[string]int{}
		for _, e := range pend {
			stored[e.Key], _ = strconv.Atoi(string(e.Value))
		}
		for key, v := range ackedJournal {
			// The stored value may be newer than the last acknowledged one
			// (written but killed before it was printed), never older.
			if stored[key] < v {
				t.Fatalf("round %d: journal %s holds %d, but %d was acknowledged", round, key, stored[key], v)
			}
		}
		s.Close()
	}
	t.Logf("50 kills survived; %d pods and %d journal keys acknowledged", len(ackedPods), len(ackedJournal))
}
