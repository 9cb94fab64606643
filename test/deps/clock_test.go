package deps

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// wallClock matches direct uses of the wall clock that components must
// make through internal/clock instead.
var wallClock = regexp.MustCompile(`\btime\.(Now|Sleep|After|AfterFunc|Tick|NewTimer|NewTicker|Since|Until)\(`)

// TestComponentsUseInjectedClock fails when non-test code in a component
// package calls the wall clock directly; tests then could not drive time.
func TestComponentsUseInjectedClock(t *testing.T) {
	for _, dir := range []string{"agent", "store", "sync", "netproxy", "arm"} {
		root := filepath.Join("..", "..", dir)
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if os.IsNotExist(err) {
					return nil
				}
				return err
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for i, line := range strings.Split(string(data), "\n") {
				if m := wallClock.FindString(line); m != "" && !strings.HasPrefix(strings.TrimSpace(line), "//") {
					t.Errorf("%s:%d calls %s; take a clock.Clock instead", strings.TrimPrefix(path, "../../"), i+1, strings.TrimSuffix(m, "("))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
