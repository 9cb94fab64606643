package sdnotify

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

func TestNotifyWithoutServiceManager(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if sent, err := Notify(Ready); sent || err != nil {
		t.Fatalf("Notify = %v, %v; want false, nil with no NOTIFY_SOCKET", sent, err)
	}
}

func TestNotifySendsDatagram(t *testing.T) {
	for _, abstract := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "notify")
		name, env := path, path
		if abstract {
			name = "\x00outpost-sdnotify-test-" + strconv.Itoa(os.Getpid())
			env = "@" + name[1:]
		}
		l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv("NOTIFY_SOCKET", env)
		if sent, err := Notify(Ready); !sent || err != nil {
			t.Fatalf("abstract=%v: Notify = %v, %v", abstract, sent, err)
		}
		buf := make([]byte, 64)
		l.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := l.Read(buf)
		l.Close()
		if err != nil || string(buf[:n]) != Ready {
			t.Fatalf("abstract=%v: got %q, %v; want %q", abstract, buf[:n], err, Ready)
		}
	}
}

func TestNotifyToAMissingSocketFails(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "gone"))
	if sent, err := Notify(Watchdog); !sent || err == nil {
		t.Fatalf("Notify = %v, %v; want true and an error", sent, err)
	}
}

func TestWatchdogInterval(t *testing.T) {
	me := strconv.Itoa(os.Getpid())
	for _, tc := range []struct {
		usec, pid string
		want      time.Duration
		ok        bool
	}{
		{"", "", 0, false},
		{"0", "", 0, false},
		{"junk", "", 0, false},
		{"60000000", "", 30 * time.Second, true},
		{"60000000", me, 30 * time.Second, true},
		{"60000000", "1", 0, false},
	} {
		t.Setenv("WATCHDOG_USEC", tc.usec)
		t.Setenv("WATCHDOG_PID", tc.pid)
		if got, ok := WatchdogInterval(); got != tc.want || ok != tc.ok {
			t.Errorf("WATCHDOG_USEC=%q WATCHDOG_PID=%q: got %v, %v; want %v, %v", tc.usec, tc.pid, got, ok, tc.want, tc.ok)
		}
	}
}
