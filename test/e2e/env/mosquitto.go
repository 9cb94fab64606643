package env

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Mosquitto is a private MQTT broker.
type Mosquitto struct {
	// URL is tcp://127.0.0.1:PORT.
	URL string
	// Addr is 127.0.0.1:PORT.
	Addr string
}

// StartMosquitto starts a mosquitto broker on a free loopback port,
// anonymous and without persistence, stopped in t's cleanup.
func StartMosquitto(t testing.TB) *Mosquitto {
	t.Helper()
	RequireRoot(t)
	bin := lookTool(t, "mosquitto")
	dir := t.TempDir()
	port := FreePort(t)
	cfg := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stderr\n", port)
	cfgPath := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	m := &Mosquitto{Addr: fmt.Sprintf("127.0.0.1:%d", port)}
	m.URL = "tcp://" + m.Addr
	p := start(t, dir, "mosquitto", bin, "-c", cfgPath)
	waitFor(t, p, 15*time.Second, func() error {
		c, err := net.DialTimeout("tcp", m.Addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	return m
}
