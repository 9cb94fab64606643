// Package sdnotify tells systemd about the agent's state, as sd_notify(3)
// does, without libsystemd: a datagram to the socket named by
// $NOTIFY_SOCKET. Under no service manager every call does nothing.
package sdnotify

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// States the agent sends.
const (
	Ready    = "READY=1"
	Stopping = "STOPPING=1"
	Watchdog = "WATCHDOG=1"
)

// Notify sends state to the service manager. It reports whether there is
// one to tell ($NOTIFY_SOCKET set).
func Notify(state string) (bool, error) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return false, nil
	}
	if strings.HasPrefix(path, "@") {
		path = "\x00" + path[1:] // an abstract socket
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return true, fmt.Errorf("sd_notify %s: %w", state, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return true, fmt.Errorf("sd_notify %s: %w", state, err)
	}
	return true, nil
}

// WatchdogInterval is how often to send Watchdog: half the service's
// WatchdogSec, as sd_watchdog_enabled(3) advises. ok is false when the
// watchdog is off or meant for another process.
func WatchdogInterval() (interval time.Duration, ok bool) {
	usec, err := strconv.ParseUint(os.Getenv("WATCHDOG_USEC"), 10, 63)
	if err != nil || usec == 0 {
		return 0, false
	}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0, false
	}
	return time.Duration(usec) * time.Microsecond / 2, true
}
