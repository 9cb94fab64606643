// Package config is outpost's one configuration file: its fields, their
// defaults, and the checks that name the file, field and reason of every
// bad value.
package config

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/outpost-edge/outpost/internal/yamlcheck"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Config is the agent's configuration. Every field has a default.
type Config struct {
	// NodeName is the Node this agent runs; default the host name.
	NodeName string `json:"nodeName"`
	// StateDir holds the store, the agent socket and certificates.
	StateDir string `json:"stateDir"`
	// ManifestDir holds static pod and service manifests (*.yaml, *.yml).
	ManifestDir string `json:"manifestDir"`
	// ImageDir holds OCI image tarballs imported at start and, while the
	// agent runs, as they appear or change, for offline use (default
	// stateDir/images).
	ImageDir string `json:"imageDir"`
	// LogDir holds container logs, as kubelet's /var/log/pods.
	LogDir string `json:"logDir"`
	// RunDir holds runtime files that must not outlive a reboot: the
	// FIFOs between containers and the agent.
	RunDir string `json:"runDir"`
	// ContainerLogMaxSize rotates a container's log file at this size
	// (a quantity, as kubelet's containerLogMaxSize).
	ContainerLogMaxSize string `json:"containerLogMaxSize"`
	// ContainerLogMaxFiles is how many files of a container's log are
	// kept, the live one included.
	ContainerLogMaxFiles int `json:"containerLogMaxFiles"`
	// Kubeconfig points at the API server; empty runs standalone. With
	// BootstrapKubeconfig set it is where the node's own kubeconfig is
	// kept (default stateDir/kubeconfig).
	Kubeconfig string `json:"kubeconfig"`
	// BootstrapKubeconfig, as kubelet's --bootstrap-kubeconfig, holds a
	// bootstrap credential used to request the node's client certificate
	// when Kubeconfig has no valid one; empty disables it.
	BootstrapKubeconfig string `json:"bootstrapKubeconfig"`
	// MQTT syncs the node through an MQTT broker and `outpost bridge`
	// instead of an API server; empty brokers leave it off.
	MQTT MQTT `json:"mqtt"`
	// Node describes the Node registered with the API server.
	Node Node `json:"node"`
	// API paces the connection to the API server.
	API API `json:"api"`
	// Containerd says which containerd to drive.
	Containerd Containerd `json:"containerd"`
	// Network holds the pod and service address ranges.
	Network Network `json:"network"`
	// Server is the kubelet-style HTTPS API.
	Server Server `json:"server"`
	// Log sets the log level and format.
	Log Log `json:"log"`
}

// Containerd says which containerd to drive.
type Containerd struct {
	// Address is containerd's gRPC socket.
	Address string `json:"address"`
	// Namespace is the containerd namespace outpost keeps its pods in.
	Namespace string `json:"namespace"`
	// ShimGroups is how many containerd shims the pods share; 0 gives
	// every pod a shim of its own.
	ShimGroups int `json:"shimGroups"`
	// CgroupParent is the cgroup, in every hierarchy, that holds the
	// pods' cgroups (pod<UID>, and a cgroup per container below it).
	CgroupParent string `json:"cgroupParent"`
	// OCIRuntime is the OCI runtime the runc shim runs for the pods'
	// containers, a name looked up in PATH or an absolute path (crun);
	// empty is the shim's own default, runc.
	OCIRuntime string `json:"ociRuntime"`
}

// MQTT is the link to an MQTT broker (docs/mqtt.md).
type MQTT struct {
	// Brokers are the broker URLs, tried in order: ssl://host:8883 (or
	// tls://, mqtts://) with TLS, tcp://host:1883 (or mqtt://) without.
	Brokers []string `json:"brokers"`
	// CAFile holds the CAs that sign the broker's certificate; empty
	// uses the system's.
	CAFile string `json:"caFile"`
	// CertFile and KeyFile are the node's client certificate and key.
	CertFile string `json:"certFile"`
	KeyFile  string `json:"keyFile"`
	// Username and PasswordFile, for a broker that asks for a password.
	Username     string `json:"username"`
	PasswordFile string `json:"passwordFile"`
	// Keepalive is MQTT's keepalive, a duration (60s). A connection
	// the broker sends nothing on for three of them is made anew.
	Keepalive string `json:"keepalive"`
	// ClientID is the MQTT client ID; default the node name.
	ClientID string `json:"clientID"`
	// Insecure allows a plain TCP broker that is not on the loopback.
	Insecure bool `json:"insecure"`
	// MaxMessageBytes refuses larger messages from the broker.
	MaxMessageBytes int `json:"maxMessageBytes"`
	// PostQuantumTLS offers the hybrid post-quantum key exchange
	// (X25519MLKEM768) in TLS handshakes; its key share adds about
	// 1.2 KiB to each one, so it is off unless asked for.
	PostQuantumTLS bool `json:"postQuantumTLS"`
	// TrustedKeys are the bridge's public signing keys, spelled as
	// `outpost bridge keygen` prints them (ed25519:BASE64). With any,
	// the node takes only desired state signed by one of them; more
	// than one lets keys be rotated (docs/mqtt.md). A node's setting.
	TrustedKeys []string `json:"trustedKeys"`
	// SigningKeyFile is the bridge's private signing key (PEM, from
	// `outpost bridge keygen`): it signs every desired envelope. A
	// bridge's setting.
	SigningKeyFile string `json:"signingKeyFile"`
	// MaxStreams is how many kubelet API streams (kubectl logs, exec,
	// port-forward) the bridge may have open to the node over MQTT at
	// once; more are refused. A node's setting.
	MaxStreams int `json:"maxStreams"`
}

// Enabled reports whether the node syncs through MQTT.
func (m MQTT) Enabled() bool { return len(m.Brokers) > 0 }

// KeepaliveDuration returns Keepalive (valid after Load or Parse).
func (m MQTT) KeepaliveDuration() time.Duration {
	d, _ := time.ParseDuration(m.Keepalive)
	return d
}

// Node describes the Node outpost registers with the API server.
type Node struct {
	// Labels are added to the Node's labels.
	Labels map[string]string `json:"labels"`
	// Taints are the Node's taints when it registers.
	Taints []Taint `json:"taints"`
	// MaxPods is the Node's pod capacity.
	MaxPods int `json:"maxPods"`
}

// Taint is a Node taint: pods that do not tolerate it are not scheduled
// (NoSchedule, PreferNoSchedule) or are evicted (NoExecute).
type Taint struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Effect string `json:"effect"`
}

// API paces the connection to the API server.
type API struct {
	// WriteQPS and WriteBurst limit the writes replayed after a
	// reconnect: statuses, mirror pods, deletions.
	WriteQPS   float64 `json:"writeQPS"`
	WriteBurst int     `json:"writeBurst"`
	// EventQPS and EventBurst limit the events (Pulled, Started,
	// BackOff…), in a bucket apart from the writes'.
	EventQPS   float64 `json:"eventQPS"`
	EventBurst int     `json:"eventBurst"`
}

// Network holds the node's address ranges.
type Network struct {
	// PodCIDR is the range pod addresses come from; the first address is
	// the bridge's gateway.
	PodCIDR string `json:"podCIDR"`
	// ServiceCIDR is the cluster's ClusterIP range.
	ServiceCIDR string `json:"serviceCIDR"`
	// ClusterDNS is the nameserver written into pods' resolv.conf
	// (default the 10th address of ServiceCIDR).
	ClusterDNS string `json:"clusterDNS"`
	// ClusterDomain is the DNS search suffix.
	ClusterDomain string `json:"clusterDomain"`
	// NetnsPrefix starts the name of every pod's network namespace
	// under /run/netns.
	NetnsPrefix string `json:"netnsPrefix"`
}

// Server is the kubelet-style HTTPS API.
type Server struct {
	// Address is host:port to listen on; "" serves no API.
	Address string `json:"address"`
	// TLSCertFile and TLSKeyFile are the serving certificate and key;
	// empty makes a self-signed one in stateDir/pki.
	TLSCertFile string `json:"tlsCertFile"`
	TLSKeyFile  string `json:"tlsKeyFile"`
	// TLSBootstrap requests the serving certificate from the cluster (a
	// CSR for the kubernetes.io/kubelet-serving signer) and renews it, as
	// kubelet's serverTLSBootstrap; the self-signed one is served until
	// the request is approved. Ignored without a kubeconfig or with
	// TLSCertFile.
	TLSBootstrap bool `json:"tlsBootstrap"`
	// ClientCAFile holds the CAs whose client certificates authenticate
	// (the API server's kubelet client CA); empty accepts none.
	ClientCAFile string `json:"clientCAFile"`
	// Anonymous lets requests without credentials in as system:anonymous,
	// still subject to authorization.
	Anonymous bool `json:"anonymous"`
	// LocalGroups are the groups whose client certificate users are
	// authorized when the API server cannot be asked.
	LocalGroups []string `json:"localGroups"`
}

// Log sets logging.
type Log struct {
	// Level is debug, info, warn or error.
	Level string `json:"level"`
	// Format is text or json.
	Format string `json:"format"`
}

// Default returns the configuration with every default filled in.
func Default() Config {
	host, _ := os.Hostname()
	return Config{
		NodeName:    strings.ToLower(host),
		StateDir:    "/var/lib/outpost",
		ManifestDir: "/etc/outpost/manifests",
		ImageDir:    "/var/lib/outpost/images",
		LogDir:      "/var/log/pods",
		RunDir:      "/run/outpost",

		ContainerLogMaxSize:  "10Mi",
		ContainerLogMaxFiles: 5,
		Node:                 Node{Labels: map[string]string{}, Taints: []Taint{}, MaxPods: 110},
		MQTT:                 MQTT{Brokers: []string{}, Keepalive: "60s", MaxMessageBytes: 1 << 20, TrustedKeys: []string{}, MaxStreams: 16},
		API:                  API{WriteQPS: 20, WriteBurst: 40, EventQPS: 10, EventBurst: 20},
		Containerd:           Containerd{Address: "/run/containerd/containerd.sock", Namespace: "outpost", ShimGroups: 4, CgroupParent: "/outpost"},
		Network: Network{
			PodCIDR:       "10.42.0.0/24",
			ServiceCIDR:   "10.43.0.0/16",
			ClusterDNS:    "10.43.0.10",
			ClusterDomain: "cluster.local",
			NetnsPrefix:   "outpost-",
		},
		Server: Server{Address: ":10250", LocalGroups: []string{"system:masters"}},
		Log:    Log{Level: "info", Format: "text"},
	}
}

// ContainerLogMaxBytes returns ContainerLogMaxSize in bytes (valid after
// Load or Parse).
func (c Config) ContainerLogMaxBytes() int64 {
	q, err := resource.ParseQuantity(c.ContainerLogMaxSize)
	if err != nil {
		return 0
	}
	return q.Value()
}

// StorePath returns the store file's path.
func (c Config) StorePath() string { return filepath.Join(c.StateDir, "outpost.db") }

// CertDir returns the directory of the node's client certificate, which
// bootstrapping writes (see BootstrapKubeconfig).
func (c Config) CertDir() string { return filepath.Join(c.StateDir, "pki") }

// SocketPath returns the local status socket's path.
func (c Config) SocketPath() string { return filepath.Join(c.StateDir, "outpost.sock") }

// Error is a bad configuration file: its name and every problem in it.
type Error struct {
	File     string
	Problems []error
}

func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = e.File + ": " + p.Error()
	}
	return strings.Join(lines, "\n")
}

// Load reads the file at path over the defaults. An empty path returns the
// defaults. Problems come back as *Error.
func Load(path string) (Config, error) {
	cfg := Default()
	if path == "" {
		return cfg, cfg.validate("")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes data (named name in errors) over the defaults.
func Parse(name string, data []byte) (Config, error) {
	cfg := Default()
	// Defaults derived from other fields, when the file leaves them out.
	cfg.ImageDir, cfg.Network.ClusterDNS = "", ""
	if err := decodeFile(name, data, &cfg); err != nil {
		return cfg, err
	}
	if cfg.ImageDir == "" {
		cfg.ImageDir = filepath.Join(cfg.StateDir, "images")
	}
	if cfg.Network.ClusterDNS == "" {
		cfg.Network.ClusterDNS = clusterDNSOf(cfg.Network.ServiceCIDR)
	}
	if cfg.BootstrapKubeconfig != "" && cfg.Kubeconfig == "" {
		// The kubeconfig written after bootstrapping lives with the
		// certificate it names.
		cfg.Kubeconfig = filepath.Join(cfg.StateDir, "kubeconfig")
	}
	return cfg, cfg.validate(name)
}

// clusterDNSOf is the 10th address of the service CIDR, as k3s and
// kubeadm clusters place their DNS Service; for a CIDR that does not
// parse, the default (validate names the CIDR).
func clusterDNSOf(cidr string) string {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return Default().Network.ClusterDNS
	}
	a := p.Masked().Addr()
	for range 10 {
		a = a.Next()
	}
	if !p.Contains(a) {
		return Default().Network.ClusterDNS
	}
	return a.String()
}

// decodeFile decodes the one YAML document of data (named name in
// errors) strictly into cfg, over what cfg holds.
func decodeFile(name string, data []byte, cfg any) error {
	docs, err := yamlcheck.Documents(data)
	if err != nil {
		return &Error{File: name, Problems: []error{err}}
	}
	if len(docs) > 1 {
		return &Error{File: name, Problems: []error{errors.New("holds more than one YAML document")}}
	}
	if len(docs) == 1 {
		if err := yamlcheck.Decode(docs[0], cfg); err != nil {
			return &Error{File: name, Problems: unjoin(err)}
		}
	}
	return nil
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

type fieldErr struct{ field, msg string }

func (e fieldErr) Error() string { return e.field + ": " + e.msg }

func (c Config) validate(name string) error {
	var p []error
	bad := func(field, format string, args ...any) {
		p = append(p, fieldErr{field, fmt.Sprintf(format, args...)})
	}
	if c.NodeName == "" {
		bad("nodeName", "is empty and the host name could not be read")
	} else if errs := validation.IsDNS1123Subdomain(c.NodeName); len(errs) > 0 {
		bad("nodeName", "%q is not a valid node name: %s", c.NodeName, errs[0])
	}
	for _, f := range []struct{ name, val string }{
		{"stateDir", c.StateDir}, {"manifestDir", c.ManifestDir}, {"imageDir", c.ImageDir},
		{"logDir", c.LogDir}, {"runDir", c.RunDir}, {"containerd.address", c.Containerd.Address},
	} {
		if !filepath.IsAbs(f.val) {
			bad(f.name, "%q is not an absolute path", f.val)
		}
	}
	if q, err := resource.ParseQuantity(c.ContainerLogMaxSize); err != nil || q.Value() < 1024 {
		bad("containerLogMaxSize", "%q is not a size of at least 1Ki (such as 10Mi)", c.ContainerLogMaxSize)
	}
	if c.ContainerLogMaxFiles < 2 {
		bad("containerLogMaxFiles", "%d is less than 2", c.ContainerLogMaxFiles)
	}
	if c.Kubeconfig != "" && !filepath.IsAbs(c.Kubeconfig) {
		bad("kubeconfig", "%q is not an absolute path", c.Kubeconfig)
	}
	if c.BootstrapKubeconfig != "" && !filepath.IsAbs(c.BootstrapKubeconfig) {
		bad("bootstrapKubeconfig", "%q is not an absolute path", c.BootstrapKubeconfig)
	}
	if c.BootstrapKubeconfig != "" && c.BootstrapKubeconfig == c.Kubeconfig {
		bad("bootstrapKubeconfig", "%q is also kubeconfig; the node's kubeconfig would overwrite the bootstrap credential", c.BootstrapKubeconfig)
	}
	c.MQTT.validate(bad, c.Kubeconfig != "" || c.BootstrapKubeconfig != "")
	if c.MQTT.SigningKeyFile != "" {
		bad("mqtt.signingKeyFile", "is the bridge's setting; a node trusts the bridge's public key in mqtt.trustedKeys")
	}
	for k, v := range c.Node.Labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			bad("node.labels", "key %q is not a valid label key: %s", k, errs[0])
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			bad("node.labels", "value %q of %q is not a valid label value: %s", v, k, errs[0])
		}
	}
	for i, t := range c.Node.Taints {
		field := fmt.Sprintf("node.taints[%d]", i)
		if errs := validation.IsQualifiedName(t.Key); len(errs) > 0 {
			bad(field+".key", "%q is not a valid taint key: %s", t.Key, errs[0])
		}
		if errs := validation.IsValidLabelValue(t.Value); len(errs) > 0 {
			bad(field+".value", "%q is not a valid taint value: %s", t.Value, errs[0])
		}
		switch t.Effect {
		case "NoSchedule", "PreferNoSchedule", "NoExecute":
		default:
			bad(field+".effect", "%q is not one of NoSchedule, PreferNoSchedule, NoExecute", t.Effect)
		}
	}
	if c.Node.MaxPods < 1 || c.Node.MaxPods > 1000 {
		bad("node.maxPods", "%d is not between 1 and 1000", c.Node.MaxPods)
	}
	if c.API.WriteQPS <= 0 || c.API.WriteQPS > 1000 {
		bad("api.writeQPS", "%g is not above 0 and at most 1000", c.API.WriteQPS)
	}
	if c.API.WriteBurst < 1 || c.API.WriteBurst > 10000 {
		bad("api.writeBurst", "%d is not between 1 and 10000", c.API.WriteBurst)
	}
	if c.API.EventQPS <= 0 || c.API.EventQPS > 1000 {
		bad("api.eventQPS", "%g is not above 0 and at most 1000", c.API.EventQPS)
	}
	if c.API.EventBurst < 1 || c.API.EventBurst > 10000 {
		bad("api.eventBurst", "%d is not between 1 and 10000", c.API.EventBurst)
	}
	if errs := validation.IsDNS1123Label(c.Containerd.Namespace); len(errs) > 0 {
		bad("containerd.namespace", "%q is not a valid namespace: %s", c.Containerd.Namespace, errs[0])
	}
	if c.Containerd.ShimGroups < 0 || c.Containerd.ShimGroups > 256 {
		bad("containerd.shimGroups", "%d is not between 0 and 256", c.Containerd.ShimGroups)
	}
	if r := c.Containerd.OCIRuntime; r != "" && !validOCIRuntime(r) {
		bad("containerd.ociRuntime", "%q is neither a program name (like crun) nor a clean absolute path", r)
	}
	if p := c.Containerd.CgroupParent; !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		bad("containerd.cgroupParent", "%q is not a clean absolute cgroup path below the root, like /outpost", p)
	}
	if p := c.Network.NetnsPrefix; p == "" || strings.ContainsAny(p, "/\x00") || len(p) > 32 {
		bad("network.netnsPrefix", "%q is not a file name start of 1 to 32 characters without /", p)
	}
	podNet, podOK := checkCIDR(bad, "network.podCIDR", c.Network.PodCIDR)
	svcNet, svcOK := checkCIDR(bad, "network.serviceCIDR", c.Network.ServiceCIDR)
	if podOK && podNet.Bits() > podNet.Addr().BitLen()-2 {
		bad("network.podCIDR", "%q leaves no addresses for pods", c.Network.PodCIDR)
	}
	if podOK && svcOK && podNet.Overlaps(svcNet) {
		bad("network.serviceCIDR", "%q overlaps network.podCIDR %q", c.Network.ServiceCIDR, c.Network.PodCIDR)
	}
	if dns, err := netip.ParseAddr(c.Network.ClusterDNS); err != nil {
		bad("network.clusterDNS", "%q is not an IP address", c.Network.ClusterDNS)
	} else if svcOK && !svcNet.Contains(dns) {
		bad("network.clusterDNS", "%s is outside network.serviceCIDR %s", dns, svcNet)
	}
	if errs := validation.IsDNS1123Subdomain(c.Network.ClusterDomain); len(errs) > 0 {
		bad("network.clusterDomain", "%q is not a DNS domain: %s", c.Network.ClusterDomain, errs[0])
	}
	if c.Server.Address == "" {
		// No API served.
	} else if host, port, err := net.SplitHostPort(c.Server.Address); err != nil {
		bad("server.address", "%q is not host:port", c.Server.Address)
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		bad("server.address", "port %q is not a number from 1 to 65535", port)
	} else if host != "" {
		if _, err := netip.ParseAddr(host); err != nil {
			bad("server.address", "host %q is not an IP address", host)
		}
	}
	if (c.Server.TLSCertFile == "") != (c.Server.TLSKeyFile == "") {
		bad("server.tlsKeyFile", "server.tlsCertFile and server.tlsKeyFile go together")
	}
	for _, f := range []struct{ field, path string }{
		{"server.tlsCertFile", c.Server.TLSCertFile}, {"server.tlsKeyFile", c.Server.TLSKeyFile}, {"server.clientCAFile", c.Server.ClientCAFile},
	} {
		if f.path != "" && !filepath.IsAbs(f.path) {
			bad(f.field, "%q is not an absolute path", f.path)
		}
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		bad("log.format", "%q is not one of text, json", c.Log.Format)
	}
	if len(p) > 0 {
		if name == "" {
			name = "defaults"
		}
		return &Error{File: name, Problems: p}
	}
	return nil
}

// validate checks the mqtt section; withAPI says a kubeconfig is set.
func (m MQTT) validate(bad func(string, string, ...any), withAPI bool) {
	if withAPI && m.Enabled() {
		bad("mqtt.brokers", "a node syncs through kubeconfig or through mqtt, never both: remove kubeconfig (and bootstrapKubeconfig) or mqtt.brokers")
	}
	var tlsUsed bool
	for i, b := range m.Brokers {
		field := fmt.Sprintf("mqtt.brokers[%d]", i)
		u, err := url.Parse(b)
		if err != nil || u.Host == "" || u.Port() == "" {
			bad(field, "%q is not a URL like ssl://broker.example:8883", b)
			continue
		}
		switch u.Scheme {
		case "ssl", "tls", "mqtts", "tcps":
			tlsUsed = true
		case "tcp", "mqtt":
			if !isLoopback(u.Hostname()) && !m.Insecure {
				bad(field, "%q is plain TCP to a broker that is not on the loopback; use ssl:// (TLS), or set mqtt.insecure: true", b)
			}
		default:
			bad(field, "%q: scheme %q is not ssl, tls, mqtts or tcp", b, u.Scheme)
		}
		if u.User != nil {
			bad(field, "%q has credentials in it; use mqtt.username and mqtt.passwordFile", u.Redacted())
		}
	}
	if !m.Enabled() {
		return
	}
	for _, f := range []struct{ field, path string }{
		{"mqtt.caFile", m.CAFile}, {"mqtt.certFile", m.CertFile}, {"mqtt.keyFile", m.KeyFile}, {"mqtt.passwordFile", m.PasswordFile},
	} {
		if f.path != "" && !filepath.IsAbs(f.path) {
			bad(f.field, "%q is not an absolute path", f.path)
		}
	}
	if (m.CertFile == "") != (m.KeyFile == "") {
		bad("mqtt.keyFile", "mqtt.certFile and mqtt.keyFile go together")
	}
	if m.CertFile != "" && !tlsUsed {
		bad("mqtt.certFile", "a client certificate needs a TLS broker (ssl://)")
	}
	if (m.Username == "") != (m.PasswordFile == "") {
		bad("mqtt.passwordFile", "mqtt.username and mqtt.passwordFile go together")
	}
	if d, err := time.ParseDuration(m.Keepalive); err != nil || d < 5*time.Second || d > 30*time.Minute {
		bad("mqtt.keepalive", "%q is not a duration from 5s to 30m (such as 60s)", m.Keepalive)
	}
	if len(m.ClientID) > 65535 {
		bad("mqtt.clientID", "is longer than MQTT allows")
	}
	if m.MaxMessageBytes < 1024 || m.MaxMessageBytes > 256<<20 {
		bad("mqtt.maxMessageBytes", "%d is not between 1024 and 268435456", m.MaxMessageBytes)
	}
	if m.MaxStreams < 1 || m.MaxStreams > 1024 {
		bad("mqtt.maxStreams", "%d is not between 1 and 1024", m.MaxStreams)
	}
	seen := map[string]bool{}
	for i, k := range m.TrustedKeys {
		field := fmt.Sprintf("mqtt.trustedKeys[%d]", i)
		if err := checkPublicKey(k); err != nil {
			bad(field, "%v", err)
		} else if seen[k] {
			bad(field, "%q is listed twice", k)
		}
		seen[k] = true
	}
	if m.SigningKeyFile != "" && !filepath.IsAbs(m.SigningKeyFile) {
		bad("mqtt.signingKeyFile", "%q is not an absolute path", m.SigningKeyFile)
	}
}

// checkPublicKey checks a key spelled as mqtt.trustedKeys takes it,
// "ed25519:" and 32 bytes in standard base64.
func checkPublicKey(k string) error {
	rest, ok := strings.CutPrefix(k, "ed25519:")
	if !ok {
		return fmt.Errorf("%q does not start with \"ed25519:\" (as `outpost bridge keygen` prints keys)", k)
	}
	if b, err := base64.StdEncoding.DecodeString(rest); err != nil || len(b) != ed25519.PublicKeySize {
		return fmt.Errorf("%q is not an ed25519 public key: 32 bytes in base64", k)
	}
	return nil
}

// isLoopback reports whether host is localhost or a loopback address.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

func checkCIDR(bad func(string, string, ...any), field, v string) (netip.Prefix, bool) {
	p, err := netip.ParsePrefix(v)
	if err != nil {
		bad(field, "%q is not a CIDR", v)
		return p, false
	}
	if p.Masked() != p {
		bad(field, "%q has host bits set; did you mean %s?", v, p.Masked())
		return p, false
	}
	return p, true
}

// validOCIRuntime reports whether r is a program name of letters,
// digits, '.', '_', '+' and '-', or a clean absolute path.
func validOCIRuntime(r string) bool {
	if strings.HasPrefix(r, "/") {
		return path.Clean(r) == r && r != "/" && !strings.ContainsAny(r, "\x00\n")
	}
	for _, c := range r {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '+', c == '-':
		default:
			return false
		}
	}
	return r != "." && r != ".."
}
