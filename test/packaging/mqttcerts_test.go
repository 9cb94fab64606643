package packaging

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMQTTCertsShellcheck(t *testing.T) {
	needTools(t, "shellcheck")
	run(t, "../..", "shellcheck", "scripts/mqtt-certs.sh")
}

// mqttCerts runs scripts/mqtt-certs.sh and returns its exit status and
// output.
func mqttCerts(t *testing.T, args ...string) (int, string) {
	t.Helper()
	script, err := filepath.Abs("../../scripts/mqtt-certs.sh")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", append([]string{script}, args...)...).CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	}
	t.Fatalf("mqtt-certs.sh %v: %v", args, err)
	return 0, ""
}

// readCert parses the PEM certificate at path.
func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("%s: no PEM certificate", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

// checkMode fails t unless path has the permission bits mode.
func checkMode(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != mode {
		t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), mode)
	}
}

// TestMQTTCerts: scripts/mqtt-certs.sh makes a CA once, client
// certificates whose CN is the node's name or outpost:bridge, and a
// server certificate for the names and addresses given, all ECDSA P-256
// and verifiable by Go's crypto/x509 (the agent's TLS); it refuses names
// the broker's ACL patterns cannot take, and replaces a certificate only
// with -f. TestMosquittoScriptCertificates (test/e2e) uses them with the
// real broker.
func TestMQTTCerts(t *testing.T) {
	needTools(t, "bash", "openssl")
	dir := t.TempDir()

	if code, out := mqttCerts(t, "-h"); code != 0 || !strings.Contains(out, "usage: mqtt-certs.sh") {
		t.Errorf("-h: exit %d, want 0 with the usage:\n%s", code, out)
	}
	for _, args := range [][]string{{}, {"-d", dir}, {"-d", dir, "sign", "x"}, {"-d", dir, "client"}, {"-d", dir, "client", "a", "b"}, {"-d", dir, "server"}, {"-x"}, {"-days", "0", "client", "a"}} {
		if code, out := mqttCerts(t, args...); code != 2 || !strings.Contains(out, "usage:") {
			t.Errorf("%q: exit %d, want 2 with the usage:\n%s", args, code, out)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("usage errors wrote files: %v", entries)
	}

	if code, out := mqttCerts(t, "-d", dir, "client", "pi-007"); code != 0 {
		t.Fatalf("client pi-007: exit %d\n%s", code, out)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	ca := readCert(t, filepath.Join(dir, "ca.crt"))
	if !ca.IsCA || ca.KeyUsage&x509.KeyUsageCertSign == 0 || ca.NotAfter.Before(time.Now().Add(9*365*24*time.Hour)) {
		t.Errorf("CA: IsCA %v, key usage %b, not after %v; want a CA that signs certificates for 10 years", ca.IsCA, ca.KeyUsage, ca.NotAfter)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, tc := range []struct{ cn, file string }{{"pi-007", "pi-007"}, {"outpost:bridge", "outpost_bridge"}, {"outpost:bridge:1", "outpost_bridge_1"}, {"a.b-c.d", "a.b-c.d"}} {
		if tc.cn != "pi-007" {
			if code, out := mqttCerts(t, "-d", dir, "-days", "30", "client", tc.cn); code != 0 {
				t.Fatalf("client %s: exit %d\n%s", tc.cn, code, out)
			}
		}
		crt, key := filepath.Join(dir, tc.file+".crt"), filepath.Join(dir, tc.file+".key")
		checkMode(t, crt, 0o644)
		checkMode(t, key, 0o600)
		c := readCert(t, crt)
		if c.Subject.CommonName != tc.cn || c.IsCA || !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
			t.Errorf("%s: CN %q, CA %v, extended key usage %v; want CN %q, a client certificate", crt, c.Subject.CommonName, c.IsCA, c.ExtKeyUsage, tc.cn)
		}
		if pub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
			t.Errorf("%s: key %T, want ECDSA P-256", crt, c.PublicKey)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s: %v", crt, err)
		}
		if _, err := tls.LoadX509KeyPair(crt, key); err != nil {
			t.Errorf("%s with its key: %v", crt, err)
		}
		days := 730
		if tc.cn != "pi-007" {
			days = 30
		}
		if d := time.Until(c.NotAfter); d < time.Duration(days-1)*24*time.Hour || d > time.Duration(days+1)*24*time.Hour {
			t.Errorf("%s: valid until %v, want %d days from now", crt, c.NotAfter, days)
		}
	}

	if code, out := mqttCerts(t, "-d", dir, "server", "10.0.0.1", "broker.example", "::1"); code != 0 {
		t.Fatalf("server: exit %d\n%s", code, out)
	}
	srv := readCert(t, filepath.Join(dir, "server.crt"))
	checkMode(t, filepath.Join(dir, "server.key"), 0o600)
	for _, name := range []string{"10.0.0.1", "broker.example", "::1"} {
		if _, err := srv.Verify(x509.VerifyOptions{Roots: roots, DNSName: name}); err != nil {
			t.Errorf("server certificate for %s: %v", name, err)
		}
	}
	if err := srv.VerifyHostname("10.0.0.2"); err == nil {
		t.Errorf("server certificate valid for 10.0.0.2, which was not asked for")
	}
	if !slices.Equal(srv.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
		t.Errorf("server certificate's extended key usage %v, want server auth", srv.ExtKeyUsage)
	}
	if now, _ := os.ReadFile(filepath.Join(dir, "ca.crt")); !bytes.Equal(now, caPEM) {
		t.Errorf("the CA changed: an existing CA must be used as it is")
	}

	// Refusals change nothing.
	before, _ := os.ReadFile(filepath.Join(dir, "pi-007.crt"))
	if code, out := mqttCerts(t, "-d", dir, "client", "pi-007"); code != 1 || !strings.Contains(out, "-f replaces it") {
		t.Errorf("client pi-007 again: exit %d, want 1 saying -f replaces it:\n%s", code, out)
	}
	if now, _ := os.ReadFile(filepath.Join(dir, "pi-007.crt")); !bytes.Equal(now, before) {
		t.Errorf("a refused client pi-007 changed its certificate")
	}
	for _, cn := range []string{"Pi-007", "pi/007", "pi+", "#", "-pi", "pi-", "pi..7", "outpost:other", "outpost:bridge:x", "outpost:bridge:1/a", strings.Repeat("a", 254)} {
		if code, out := mqttCerts(t, "-d", dir, "client", cn); code != 1 || !strings.Contains(out, "not a node name") {
			t.Errorf("client %q: exit %d, want 1 saying it is not a node name:\n%s", cn, code, out)
		}
	}
	if code, out := mqttCerts(t, "-d", dir, "server", "a b"); code != 1 {
		t.Errorf("server %q: exit %d, want 1\n%s", "a b", code, out)
	}
	if code, out := mqttCerts(t, "-d", dir, "-f", "client", "pi-007"); code != 0 {
		t.Errorf("-f client pi-007: exit %d\n%s", code, out)
	}
	if now, _ := os.ReadFile(filepath.Join(dir, "pi-007.crt")); bytes.Equal(now, before) {
		t.Errorf("-f client pi-007 kept the old certificate")
	}

	// A CA key without its certificate is someone's CA: not replaced.
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "ca.key"), []byte("x"), 0o600)
	if code, out := mqttCerts(t, "-d", other, "client", "pi-007"); code != 1 || !strings.Contains(out, "ca.key exists without ca.crt") {
		t.Errorf("a CA key alone: exit %d, want 1 saying so:\n%s", code, out)
	}
}
