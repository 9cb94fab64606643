package env

import (
	"bufio"
	"bytes"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	waitReady(t, p, 15*time.Second, func() error {
		c, err := net.DialTimeout("tcp", m.Addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	return m
}

// The broker configuration outpost ships, relative to the repository's
// root; StartMosquittoTLS runs them.
const (
	ShippedMosquittoConf = "packaging/mosquitto/mosquitto.conf"
	ShippedMosquittoACL  = "packaging/mosquitto/acl"
)

// MosquittoOptions says where StartMosquittoTLS listens and whose
// certificates it uses. The zero value is a broker on a free port of
// 127.0.0.1 with a new test CA.
type MosquittoOptions struct {
	// Host is the IP address the listener binds and the broker's
	// certificate is issued for, such as the address of a veth whose
	// peer is in a network namespace the test made. Default 127.0.0.1.
	Host string
	// Port is the listener's port. Default: a free one.
	Port int
	// PKIDir, when set, is a directory scripts/mqtt-certs.sh made
	// (`server HOST`): the broker trusts its ca.crt and serves its
	// server.crt and server.key, and Issue signs with its ca.key.
	PKIDir string
}

// MosquittoTLS is a mosquitto broker running the configuration and ACL
// outpost ships (ShippedMosquittoConf, ShippedMosquittoACL), rewritten
// only where a test must differ: the listener's port and address, the
// certificate and key paths, the ACL's path (the shipped file, read in
// place), the persistence directory, the pid file, the log (stderr, into
// the test's temp dir) and the user (root, who owns the temp dir). Every
// other line is the shipped one, so tests see what production sees:
// client certificates required, the CN as username and client id,
// persistence and the size limits.
type MosquittoTLS struct {
	// URL is ssl://HOST:PORT.
	URL string
	// Addr is HOST:PORT.
	Addr string
	// Host is the listener's IP address, the one the broker's
	// certificate is valid for.
	Host string
	// CAFile is the CA certificate (PEM) that signs the broker's and the
	// clients' certificates.
	CAFile string
	// DBFile is the broker's persistence database (persistence_location
	// and persistence_file). It is written while the broker runs (every
	// autosave_interval) and when it stops.
	DBFile string
	// ConfigFile is the rewritten configuration the broker runs.
	ConfigFile string

	dir      string
	bin      string
	ca       *CA
	settings map[string]string
	proc     *process
	starts   int
}

// StartMosquittoTLS starts mosquitto with the shipped configuration (see
// MosquittoTLS) on opts' address, waits until it accepts an MQTT
// connection with a client certificate, and stops it in t's cleanup.
// It skips t when not root.
func StartMosquittoTLS(t testing.TB, opts MosquittoOptions) *MosquittoTLS {
	t.Helper()
	RequireRoot(t)
	bin := lookTool(t, "mosquitto")
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := os.ReadFile(filepath.Join(root, ShippedMosquittoConf))
	if err != nil {
		t.Fatalf("read the shipped broker config: %v", err)
	}
	host := opts.Host
	if host == "" {
		host = "127.0.0.1"
	}
	ip := net.ParseIP(host)
	if ip == nil {
		t.Fatalf("mosquitto options: host %q is not an IP address", host)
	}
	port := opts.Port
	switch {
	case port != 0:
	case host == "127.0.0.1":
		port = FreePort(t)
	default:
		port = freePortOn(t, host)
	}
	dir := t.TempDir()
	m := &MosquittoTLS{
		Addr: net.JoinHostPort(host, strconv.Itoa(port)), Host: host,
		CAFile: filepath.Join(dir, "ca.crt"), ConfigFile: filepath.Join(dir, "mosquitto.conf"),
		dir: dir, bin: bin,
	}
	m.URL = "ssl://" + m.Addr

	certFile, keyFile := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	if opts.PKIDir != "" {
		if m.ca, err = LoadCA(filepath.Join(opts.PKIDir, "ca.crt"), filepath.Join(opts.PKIDir, "ca.key")); err != nil {
			t.Fatal(err)
		}
		certFile, keyFile = filepath.Join(opts.PKIDir, "server.crt"), filepath.Join(opts.PKIDir, "server.key")
	} else {
		if m.ca, err = NewCA("outpost-e2e-mqtt-ca"); err != nil {
			t.Fatal(err)
		}
		certPEM, keyPEM, err := m.ca.Issue(pkix.Name{CommonName: host}, nil, []net.IP{ip}, x509.ExtKeyUsageServerAuth)
		if err != nil {
			t.Fatalf("issue the broker's certificate: %v", err)
		}
		if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.ca.WriteCert(m.CAFile); err != nil {
		t.Fatal(err)
	}

	cfg, err := rewriteMosquittoConf(shipped, mosquittoPaths{
		Host: host, Port: port, CAFile: m.CAFile, CertFile: certFile, KeyFile: keyFile,
		ACLFile: filepath.Join(root, ShippedMosquittoACL), Dir: dir,
	})
	if err != nil {
		t.Fatalf("%s: %v", ShippedMosquittoConf, err)
	}
	m.settings = cfg.settings
	m.DBFile = cfg.dbFile
	if err := os.WriteFile(m.ConfigFile, cfg.text, 0o644); err != nil {
		t.Fatal(err)
	}
	m.Start(t)
	return m
}

// Setting returns the value of an option in the shipped configuration
// (the last line that sets it), or "" when it does not set it; tests use
// it to check the limits the broker was given, such as
// message_size_limit.
func (m *MosquittoTLS) Setting(name string) string { return m.settings[name] }

// Start starts the broker on its port with its configuration and
// persistence directory, and waits until it accepts an MQTT connection.
// StartMosquittoTLS calls it once; call it again after Stop. The broker
// is stopped in t's cleanup.
func (m *MosquittoTLS) Start(t testing.TB) {
	t.Helper()
	if m.proc != nil && !m.proc.exited() {
		t.Fatalf("start mosquitto on %s: it is running", m.Addr)
	}
	name := "mosquitto"
	if m.starts > 0 {
		name = fmt.Sprintf("mosquitto-%d", m.starts+1)
	}
	m.starts++
	probe := m.TLSConfig(t, "outpost:env-probe")
	m.proc = start(t, m.dir, name, m.bin, "-c", m.ConfigFile)
	waitReady(t, m.proc, 15*time.Second, func() error { return mqttConnect(m.Addr, probe) })
}

// Stop stops the broker cleanly (SIGTERM, then it saves its persistence
// database and exits) and fails t if it had to be killed or exited with
// an error. Retained messages and persistent sessions survive a Stop and
// Start, unless RemovePersistence is called in between.
func (m *MosquittoTLS) Stop(t testing.TB) {
	t.Helper()
	if m.proc == nil {
		return
	}
	m.proc.stop()
	if st := m.proc.cmd.ProcessState; st == nil || !st.Success() {
		t.Fatalf("mosquitto did not stop cleanly (%v), so its database may not be saved; log:\n%s", st, tail(m.proc.log, 30))
	}
}

// RemovePersistence deletes the persistence database of the stopped
// broker, so that the next Start begins with no retained messages and no
// sessions, as after losing the broker's disk.
func (m *MosquittoTLS) RemovePersistence(t testing.TB) {
	t.Helper()
	if m.proc != nil && !m.proc.exited() {
		t.Fatalf("remove %s: mosquitto is running (Stop it first)", m.DBFile)
	}
	if err := os.Remove(m.DBFile); err != nil {
		t.Fatalf("remove the persistence database: %v", err)
	}
}

// Issue writes a client certificate for cn (a node name, or
// outpost:bridge), signed by the broker's CA, and its key, and returns
// their paths.
func (m *MosquittoTLS) Issue(t testing.TB, cn string) (certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM := m.issue(t, cn)
	dir := filepath.Join(m.dir, "clients")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, strings.ReplaceAll(cn, ":", "_"))
	certFile, keyFile = base+".crt", base+".key"
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TLSConfig returns a client TLS configuration that trusts the broker's
// CA, checks its certificate against Host, and presents a new client
// certificate for cn; with cn "", it presents none.
func (m *MosquittoTLS) TLSConfig(t testing.TB, cn string) *tls.Config {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(m.ca.Cert)
	cfg := tlsConfig(roots)
	cfg.ServerName = m.Host
	if cn == "" {
		return cfg
	}
	certPEM, keyPEM := m.issue(t, cn)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("client certificate for %s: %v", cn, err)
	}
	cfg.Certificates = []tls.Certificate{cert}
	return cfg
}

func (m *MosquittoTLS) issue(t testing.TB, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	certPEM, keyPEM, err := m.ca.Issue(pkix.Name{CommonName: cn}, nil, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		t.Fatalf("issue a client certificate for %s: %v", cn, err)
	}
	return certPEM, keyPEM
}

// PID is the running broker's process ID.
func (m *MosquittoTLS) PID() int { return m.proc.cmd.Process.Pid }

// CA is the CA that issues the broker's and the clients' certificates.
func (m *MosquittoTLS) CA() *CA { return m.ca }

// LoadCA reads a CA certificate and its private key (PEM: PKCS #8, as
// scripts/mqtt-certs.sh writes it, or SEC 1 EC).
func LoadCA(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("load CA %s: no PEM certificate", certFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("load CA %s: %w", certFile, err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	block, _ = pem.Decode(keyPEM)
	if block == nil {
		return nil, fmt.Errorf("load CA key %s: no PEM block", keyFile)
	}
	var key any
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		err = fmt.Errorf("PEM block %q, want PRIVATE KEY or EC PRIVATE KEY", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("load CA key %s: %w", keyFile, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("load CA key %s: %T cannot sign", keyFile, key)
	}
	return &CA{Cert: cert, Key: signer}, nil
}

// RepoRoot returns the root of the outpost repository: the nearest
// directory, from the working directory up (a test runs in its package's
// directory), whose go.mod declares module github.com/outpost-edge/outpost.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find the repository root: %w", err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			if first, _, _ := strings.Cut(string(b), "\n"); strings.TrimSpace(first) == "module github.com/outpost-edge/outpost" {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find the repository root: no go.mod of github.com/outpost-edge/outpost above the working directory")
		}
		dir = parent
	}
}

// mqttConnect opens a TLS connection to addr, sends an MQTT 3.1.1
// CONNECT with a clean session and waits for a CONNACK that accepts it,
// then disconnects: the broker is up and takes client certificates.
func mqttConnect(addr string, cfg *tls.Config) error {
	d := &net.Dialer{Timeout: 2 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	// CONNECT: protocol "MQTT" level 4, flags clean session, keep alive
	// 60 s, an empty client id (the broker uses the certificate's CN).
	connect := []byte{0x10, 12, 0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 60, 0, 0}
	if _, err := conn.Write(connect); err != nil {
		return fmt.Errorf("send CONNECT: %w", err)
	}
	connack := make([]byte, 4)
	if _, err := io.ReadFull(conn, connack); err != nil {
		return fmt.Errorf("read CONNACK: %w", err)
	}
	if connack[0] != 0x20 || connack[1] != 2 || connack[3] != 0 {
		return fmt.Errorf("CONNACK % x, want 20 02 00 00", connack)
	}
	_, err = conn.Write([]byte{0xe0, 0}) // DISCONNECT
	return err
}

// mosquittoPaths are what a test broker's configuration must have of its
// own.
type mosquittoPaths struct {
	Host                      string
	Port                      int
	CAFile, CertFile, KeyFile string
	ACLFile                   string
	// Dir holds the persistence database and the pid file.
	Dir string
}

// mosquittoConf is a rewritten configuration.
type mosquittoConf struct {
	text []byte
	// settings maps each option of the shipped file to its (last) value.
	settings map[string]string
	// dbFile is where the broker keeps its persistence database.
	dbFile string
}

// rewriteMosquittoConf returns the shipped configuration with the lines
// that name the listener, files and the user replaced by p's (each
// replaced line is kept above its replacement as a comment). It fails on
// a line naming a file it does not know how to replace (include_dir,
// password_file, crlfile, ...), and on a configuration with other than
// one listener, as the test broker could not honour it.
func rewriteMosquittoConf(shipped []byte, p mosquittoPaths) (mosquittoConf, error) {
	c := mosquittoConf{settings: map[string]string{}}
	var out bytes.Buffer
	replace := map[string]string{
		"listener":             fmt.Sprintf("%d %s", p.Port, p.Host),
		"cafile":               p.CAFile,
		"certfile":             p.CertFile,
		"keyfile":              p.KeyFile,
		"acl_file":             p.ACLFile,
		"persistence_location": p.Dir + "/",
		"pid_file":             filepath.Join(p.Dir, "mosquitto.pid"),
		"log_dest":             "stderr",
		"user":                 "root",
	}
	// Options that name a file or directory the test broker cannot use.
	refuse := map[string]bool{
		"include_dir": true, "password_file": true, "psk_file": true, "crlfile": true, "capath": true,
		"dhparamfile": true, "http_dir": true, "plugin": true, "auth_plugin": true,
		"port": true, "bind_address": true, "bind_interface": true,
	}
	seen := map[string]bool{}
	listeners := 0
	sc := bufio.NewScanner(bytes.NewReader(shipped))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			fmt.Fprintln(&out, line)
			continue
		}
		name, value := trimmed, ""
		if i := strings.IndexAny(trimmed, " \t"); i >= 0 {
			name, value = trimmed[:i], strings.TrimSpace(trimmed[i:])
		}
		c.settings[name] = value
		if refuse[name] {
			return c, fmt.Errorf("line %d: %s is not something a test broker can honour: teach test/e2e/env/mosquitto.go to rewrite it", n, name)
		}
		if name == "listener" {
			listeners++
		}
		repl, ok := replace[name]
		if !ok {
			fmt.Fprintln(&out, line)
			continue
		}
		fmt.Fprintf(&out, "# shipped: %s\n", trimmed)
		if name == "log_dest" && seen[name] {
			continue // one destination: stderr
		}
		seen[name] = true
		fmt.Fprintf(&out, "%s %s\n", name, repl)
	}
	if err := sc.Err(); err != nil {
		return c, err
	}
	if listeners != 1 {
		return c, fmt.Errorf("%d listeners, want exactly one (the TLS listener)", listeners)
	}
	// Global options the test needs whether or not the shipped file sets
	// them: mosquitto would otherwise write its database in the working
	// directory, or run as the mosquitto user, who cannot read the
	// test's temp dir.
	fmt.Fprintln(&out, "\n# added by test/e2e/env")
	for _, name := range []string{"persistence_location", "log_dest", "user"} {
		if !seen[name] {
			fmt.Fprintf(&out, "%s %s\n", name, replace[name])
		}
	}
	file := c.settings["persistence_file"]
	if file == "" {
		file = "mosquitto.db"
	}
	c.dbFile = filepath.Join(p.Dir, file)
	c.text = out.Bytes()
	return c, nil
}
