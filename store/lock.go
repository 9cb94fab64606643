package store

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"syscall"
)

// lockHolder names the process holding an flock on path, from /proc/locks,
// or says it could not tell.
func lockHolder(path string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return "holder unknown"
	}
	f, err := os.Open("/proc/locks")
	if err != nil {
		return "holder unknown"
	}
	defer f.Close()
	dev := fmt.Sprintf(":%d", st.Ino)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// 1: FLOCK  ADVISORY  WRITE 1234 fe:01:5678 0 EOF
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] != "FLOCK" || !strings.HasSuffix(fields[5], dev) {
			continue
		}
		pid := fields[4]
		comm, _ := os.ReadFile("/proc/" + pid + "/comm")
		name := strings.TrimSpace(string(comm))
		if name == "" {
			name = "unknown"
		}
		return fmt.Sprintf("flock held by pid %s (%s)", pid, name)
	}
	return "holder unknown"
}
