package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Bridge is the configuration of `outpost bridge`, the cloud side of the
// MQTT sync. Every field but mqtt.brokers has a default.
type Bridge struct {
	// Kubeconfig points at the API server; empty uses the in-cluster
	// service account (the bridge runs as a Deployment).
	Kubeconfig string `json:"kubeconfig"`
	// MQTT is the broker, with the bridge's identity (its certificate's
	// CN is outpost:bridge in packaging/mosquitto's ACL).
	MQTT MQTT `json:"mqtt"`
	// StateDir is a scratch directory, emptied at every start: the
	// bridge keeps no state of its own.
	StateDir string `json:"stateDir"`
	// Labels are added to every MQTT node's Node.
	Labels map[string]string `json:"labels"`
	// API paces each node's writes.
	API API `json:"api"`
	// Log sets the log level and format.
	Log Log `json:"log"`
	// Replicas splits the nodes among several bridges.
	Replicas Replicas `json:"replicas"`
	// KubeletAPI serves the MQTT nodes' kubelet API, so kubectl logs,
	// exec, attach, port-forward and top reach them (docs/mqtt.md).
	KubeletAPI BridgeKubeletAPI `json:"kubeletAPI"`
}

// BridgeKubeletAPI is the kubelet API the bridge serves for its nodes:
// one port each, which the node's Node names with the bridge's address.
type BridgeKubeletAPI struct {
	// Address is the IP address the API server reaches this bridge at
	// (a replica's pod IP, "${POD_IP}": $VAR and ${VAR} are read from
	// the environment); empty serves no kubelet API.
	Address string `json:"address"`
	// Listen is the address the ports are bound on; empty is Address.
	Listen string `json:"listen"`
	// Ports are the ports for nodes, "FIRST-LAST", one per node.
	Ports string `json:"ports"`
	// TLSCertFile and TLSKeyFile are the serving certificate; empty
	// makes a self-signed one at every start.
	TLSCertFile string `json:"tlsCertFile"`
	TLSKeyFile  string `json:"tlsKeyFile"`
	// ClientCAFile holds the CAs of the client certificates that
	// authenticate (the API server's --kubelet-client-certificate);
	// tokens are checked with TokenReviews, and every request is
	// authorized with a SubjectAccessReview, as kubelet does.
	ClientCAFile string `json:"clientCAFile"`
	// StreamIdleTimeout ends a stream idle that long (4h, kubelet's).
	StreamIdleTimeout string `json:"streamIdleTimeout"`
}

// PortRange returns Ports as numbers (valid after LoadBridge).
func (k BridgeKubeletAPI) PortRange() (first, last int) {
	first, last, _ = parsePorts(k.Ports)
	return first, last
}

// parsePorts reads "FIRST-LAST", each a port, FIRST ≤ LAST, spelled
// without leading zeros or signs.
func parsePorts(s string) (first, last int, ok bool) {
	n, err := fmt.Sscanf(s, "%d-%d", &first, &last)
	ok = n == 2 && err == nil && first >= 1 && last <= 65535 && first <= last && fmt.Sprintf("%d-%d", first, last) == s
	return first, last, ok
}

// IdleTimeout returns StreamIdleTimeout (valid after LoadBridge).
func (k BridgeKubeletAPI) IdleTimeout() time.Duration {
	d, _ := time.ParseDuration(k.StreamIdleTimeout)
	return d
}

// Replicas says how bridge replicas share the fleet: the nodes are
// split into Shards shards, each served by the replica that holds its
// coordination/v1 Lease in Namespace (docs/mqtt.md, "Bridge replicas").
type Replicas struct {
	// Shards is the number of shards, the same in every replica; 0
	// (the default) is one bridge serving every node, with no Leases.
	Shards int `json:"shards"`
	// Namespace holds the shards' Leases; empty is the namespace the
	// bridge runs in (its service account's), else "default".
	Namespace string `json:"namespace"`
	// Identity names this replica (its Leases' holder); empty is the
	// host name (the pod's name).
	Identity string `json:"identity"`
}

// DefaultBridge returns the bridge's configuration with every default.
func DefaultBridge() Bridge {
	return Bridge{
		MQTT:       MQTT{Brokers: []string{}, Keepalive: "60s", MaxMessageBytes: 1 << 20, ClientID: "outpost-bridge", TrustedKeys: []string{}, MaxStreams: 16},
		StateDir:   "/var/cache/outpost-bridge",
		Labels:     map[string]string{},
		API:        API{WriteQPS: 20, WriteBurst: 40},
		Log:        Log{Level: "info", Format: "text"},
		KubeletAPI: BridgeKubeletAPI{Ports: "20000-29999", StreamIdleTimeout: "4h"},
	}
}

// LoadBridge reads the bridge's configuration file over the defaults.
func LoadBridge(path string) (Bridge, error) {
	cfg := DefaultBridge()
	if path == "" {
		return cfg, &Error{File: "flags", Problems: []error{errors.New("--config FILE is required: the bridge needs mqtt.brokers")}}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("read config: %w", err)
	}
	return ParseBridge(path, data)
}

// ParseBridge decodes data (named name in errors) over the defaults.
func ParseBridge(name string, data []byte) (Bridge, error) {
	cfg := DefaultBridge()
	if err := decodeFile(name, data, &cfg); err != nil {
		return cfg, err
	}
	var p []error
	bad := func(field, format string, args ...any) {
		p = append(p, fieldErr{field, fmt.Sprintf(format, args...)})
	}
	if !cfg.MQTT.Enabled() {
		bad("mqtt.brokers", "is empty: the bridge needs a broker")
	}
	cfg.MQTT.validate(bad, false)
	if len(cfg.MQTT.TrustedKeys) > 0 {
		bad("mqtt.trustedKeys", "is a node's setting; the bridge signs with mqtt.signingKeyFile")
	}
	if cfg.Kubeconfig != "" && !filepath.IsAbs(cfg.Kubeconfig) {
		bad("kubeconfig", "%q is not an absolute path", cfg.Kubeconfig)
	}
	if !filepath.IsAbs(cfg.StateDir) {
		bad("stateDir", "%q is not an absolute path", cfg.StateDir)
	}
	for k, v := range cfg.Labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			bad("labels", "key %q is not a valid label key: %s", k, errs[0])
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			bad("labels", "value %q of %q is not a valid label value: %s", v, k, errs[0])
		}
	}
	if r := cfg.Replicas; r.Shards < 0 || r.Shards > 1024 {
		bad("replicas.shards", "%d is not between 0 and 1024", r.Shards)
	}
	if ns := cfg.Replicas.Namespace; ns != "" {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			bad("replicas.namespace", "%q is not a namespace name: %s", ns, errs[0])
		}
	}
	if id := cfg.Replicas.Identity; id != "" {
		if errs := validation.IsDNS1123Subdomain(id); len(errs) > 0 {
			bad("replicas.identity", "%q is not a DNS-1123 subdomain (it names a Lease): %s", id, errs[0])
		}
	}
	// A replica's pod IP comes from its environment (the downward API).
	cfg.KubeletAPI.Address = os.ExpandEnv(cfg.KubeletAPI.Address)
	if k := cfg.KubeletAPI; k.Address != "" {
		if net.ParseIP(k.Address) == nil {
			bad("kubeletAPI.address", "%q is not an IP address", k.Address)
		}
		if k.Listen != "" && net.ParseIP(k.Listen) == nil {
			bad("kubeletAPI.listen", "%q is not an IP address", k.Listen)
		}
		if _, _, ok := parsePorts(k.Ports); !ok {
			bad("kubeletAPI.ports", "%q is not a range of ports FIRST-LAST (such as 20000-29999)", k.Ports)
		}
		if (k.TLSCertFile == "") != (k.TLSKeyFile == "") {
			bad("kubeletAPI.tlsCertFile", "and tlsKeyFile go together")
		}
		if k.ClientCAFile == "" {
			bad("kubeletAPI.clientCAFile", "is empty: the API server's kubelet client certificate could not be checked")
		}
		if d, err := time.ParseDuration(k.StreamIdleTimeout); err != nil || d < time.Second {
			bad("kubeletAPI.streamIdleTimeout", "%q is not a duration of at least 1s", k.StreamIdleTimeout)
		}
	}
	if cfg.API.WriteQPS <= 0 || cfg.API.WriteQPS > 1000 {
		bad("api.writeQPS", "%g is not above 0 and at most 1000", cfg.API.WriteQPS)
	}
	if cfg.API.WriteBurst < 1 || cfg.API.WriteBurst > 10000 {
		bad("api.writeBurst", "%d is not between 1 and 10000", cfg.API.WriteBurst)
	}
	switch cfg.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "%q is not one of debug, info, warn, error", cfg.Log.Level)
	}
	switch cfg.Log.Format {
	case "text", "json":
	default:
		bad("log.format", "%q is not one of text, json", cfg.Log.Format)
	}
	if len(p) > 0 {
		return cfg, &Error{File: name, Problems: p}
	}
	return cfg, nil
}
