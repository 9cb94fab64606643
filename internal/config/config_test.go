package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestDefaultsAreValid(t *testing.T) {
	cfg, err := Parse("config.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.StateDir != "/var/lib/outpost" || cfg.Containerd.Namespace != "outpost" || cfg.Kubeconfig != "" {
		t.Fatalf("defaults = %+v", cfg)
	}
}

func TestPartialFileKeepsOtherDefaults(t *testing.T) {
	cfg, err := Parse("config.yaml", []byte("nodeName: pi-17\nnetwork:\n  podCIDR: 10.88.0.0/24\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeName != "pi-17" || cfg.Network.PodCIDR != "10.88.0.0/24" || cfg.Network.ServiceCIDR != "10.43.0.0/16" {
		t.Fatalf("cfg = %+v", cfg)
	}
}

func TestBadFieldsNameFileFieldAndReason(t *testing.T) {
	tests := []struct{ src, want string }{
		{"network:\n  podCIDR: 10.0.0.0/33\n", `config.yaml: network.podCIDR: "10.0.0.0/33" is not a CIDR`},
		{"network:\n  podCIDR: 10.0.0.1/24\n", `config.yaml: network.podCIDR: "10.0.0.1/24" has host bits set; did you mean 10.0.0.0/24?`},
		{"netwrok: {}\n", "config.yaml: netwrok: unknown field (line 1)"},
		{"containerd:\n  adress: /x\n", "config.yaml: containerd.adress: unknown field (line 2)"},
		{"log: {level: loud}\n", `config.yaml: log.level: "loud" is not one of debug, info, warn, error`},
		{"stateDir: var/lib\n", `config.yaml: stateDir: "var/lib" is not an absolute path`},
		{"nodeName: Pi_17\n", `config.yaml: nodeName: "Pi_17" is not a valid node name`},
		{"server: {address: ':99999'}\n", `config.yaml: server.address: port "99999" is not a number from 1 to 65535`},
		{"network: {clusterDNS: 10.99.0.10}\n", "config.yaml: network.clusterDNS: 10.99.0.10 is outside network.serviceCIDR 10.43.0.0/16"},
		{"network: {serviceCIDR: 10.42.0.0/16}\n", `config.yaml: network.serviceCIDR: "10.42.0.0/16" overlaps network.podCIDR`},
		{"nodeName: [a]\n", "config.yaml: nodeName: want a string, got a list (line 1)"},
		{"a: [\n", "config.yaml: "},
		{"a: 1\n---\nb: 2\n", "config.yaml: holds more than one YAML document"},
		{"containerLogMaxSize: lots\n", `config.yaml: containerLogMaxSize: "lots" is not a size of at least 1Ki (such as 10Mi)`},
		{"containerLogMaxFiles: 1\n", "config.yaml: containerLogMaxFiles: 1 is less than 2"},
		{"node: {labels: {'a b': x}}\n", `config.yaml: node.labels: key "a b" is not a valid label key`},
		{"node: {labels: {site: 'x y'}}\n", `config.yaml: node.labels: value "x y" of "site" is not a valid label value`},
		{"node: {taints: [{key: dedicated, value: edge, effect: NoRun}]}\n", `config.yaml: node.taints[0].effect: "NoRun" is not one of NoSchedule, PreferNoSchedule, NoExecute`},
		{"containerd: {ociRuntime: 'crun --debug'}\n", `config.yaml: containerd.ociRuntime: "crun --debug" is neither a program name (like crun) nor a clean absolute path`},
		{"containerd: {ociRuntime: /usr/bin/../bin/crun}\n", `config.yaml: containerd.ociRuntime: "/usr/bin/../bin/crun" is neither`},
		{"containerd: {ociRuntime: bin/crun}\n", `config.yaml: containerd.ociRuntime: "bin/crun" is neither`},
		{"node: {maxPods: 0}\n", "config.yaml: node.maxPods: 0 is not between 1 and 1000"},
		{"api: {writeQPS: 0}\n", "config.yaml: api.writeQPS: 0 is not above 0 and at most 1000"},
		{"api: {writeBurst: 0}\n", "config.yaml: api.writeBurst: 0 is not between 1 and 10000"},
		{"api: {eventQPS: 0}\n", "config.yaml: api.eventQPS: 0 is not above 0 and at most 1000"},
		{"api: {eventBurst: 0}\n", "config.yaml: api.eventBurst: 0 is not between 1 and 10000"},
		{"bootstrapKubeconfig: bootstrap.kubeconfig\n", `config.yaml: bootstrapKubeconfig: "bootstrap.kubeconfig" is not an absolute path`},
		{"bootstrapKubeconfig: /etc/outpost/kc\nkubeconfig: /etc/outpost/kc\n", `config.yaml: bootstrapKubeconfig: "/etc/outpost/kc" is also kubeconfig`},
		{"kubeconfig: /etc/outpost/kc\nmqtt: {brokers: ['ssl://b:8883']}\n", "config.yaml: mqtt.brokers: a node syncs through kubeconfig or through mqtt, never both"},
		{"mqtt: {brokers: ['tcp://broker.example:1883']}\n", `config.yaml: mqtt.brokers[0]: "tcp://broker.example:1883" is plain TCP to a broker that is not on the loopback; use ssl:// (TLS), or set mqtt.insecure: true`},
		{"mqtt: {brokers: ['ssl://b:8883', 'ws://b:80']}\n", `config.yaml: mqtt.brokers[1]: "ws://b:80": scheme "ws" is not ssl, tls, mqtts or tcp`},
		{"mqtt: {brokers: ['broker:8883']}\n", `config.yaml: mqtt.brokers[0]: "broker:8883" is not a URL like ssl://broker.example:8883`},
		{"mqtt: {brokers: ['ssl://b:8883'], certFile: /etc/outpost/node.crt}\n", "config.yaml: mqtt.keyFile: mqtt.certFile and mqtt.keyFile go together"},
		{"mqtt: {brokers: ['ssl://b:8883'], caFile: ca.crt}\n", `config.yaml: mqtt.caFile: "ca.crt" is not an absolute path`},
		{"mqtt: {brokers: ['ssl://b:8883'], keepalive: 1h}\n", `config.yaml: mqtt.keepalive: "1h" is not a duration from 5s to 30m (such as 60s)`},
		{"mqtt: {brokers: ['ssl://b:8883'], username: pi}\n", "config.yaml: mqtt.passwordFile: mqtt.username and mqtt.passwordFile go together"},
		{"mqtt: {brokers: ['ssl://b:8883'], maxMessageBytes: 10}\n", "config.yaml: mqtt.maxMessageBytes: 10 is not between 1024 and 268435456"},
		{"mqtt: {brokers: ['ssl://user:pw@b:8883']}\n", "config.yaml: mqtt.brokers[0]: \"ssl://user:xxxxx@b:8883\" has credentials in it"},
		{"mqtt: {brokers: ['ssl://b:8883'], trustedKeys: ['AAAA']}\n", `config.yaml: mqtt.trustedKeys[0]: "AAAA" does not start with "ed25519:"`},
		{"mqtt: {brokers: ['ssl://b:8883'], trustedKeys: ['ed25519:AAAA']}\n", `config.yaml: mqtt.trustedKeys[0]: "ed25519:AAAA" is not an ed25519 public key: 32 bytes in base64`},
		{"mqtt: {brokers: ['ssl://b:8883'], trustedKeys: ['" + testKey + "', '" + testKey + "']}\n", "config.yaml: mqtt.trustedKeys[1]: \"" + testKey + "\" is listed twice"},
		{"mqtt: {brokers: ['ssl://b:8883'], signingKeyFile: /etc/outpost/signing.key}\n", "config.yaml: mqtt.signingKeyFile: is the bridge's setting"},
	}
	for _, tt := range tests {
		_, err := Parse("config.yaml", []byte(tt.src))
		var ce *Error
		if !errors.As(err, &ce) {
			t.Errorf("%q: err = %v, want *Error", tt.src, err)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q:\n got %s\nwant %s", tt.src, err, tt.want)
		}
	}
}

// testKey is an ed25519 public key as mqtt.trustedKeys spells it.
const testKey = "ed25519:11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="

func TestTrustedKeys(t *testing.T) {
	cfg, err := Parse("config.yaml", []byte("mqtt: {brokers: ['ssl://b:8883'], trustedKeys: ['"+testKey+"']}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.MQTT.TrustedKeys) != 1 || cfg.MQTT.TrustedKeys[0] != testKey {
		t.Errorf("trustedKeys = %q", cfg.MQTT.TrustedKeys)
	}
}

// With a bootstrap kubeconfig the node's own kubeconfig is written, by
// default into stateDir beside the certificate it names.
func TestMQTTOnTheLoopbackNeedsNoTLS(t *testing.T) {
	for _, b := range []string{"tcp://127.0.0.1:1883", "mqtt://localhost:1883", "tcp://[::1]:1883"} {
		cfg, err := Parse("config.yaml", []byte("mqtt: {brokers: ['"+b+"']}\n"))
		if err != nil {
			t.Errorf("%s: %v", b, err)
			continue
		}
		if !cfg.MQTT.Enabled() || cfg.MQTT.KeepaliveDuration() != 60e9 || cfg.MQTT.MaxMessageBytes != 1<<20 {
			t.Errorf("%s: mqtt = %+v", b, cfg.MQTT)
		}
	}
	if _, err := Parse("config.yaml", []byte("mqtt: {brokers: ['tcp://10.1.2.3:1883'], insecure: true}\n")); err != nil {
		t.Errorf("insecure: %v", err)
	}
}

func TestBootstrapKubeconfigPlacesKubeconfig(t *testing.T) {
	tests := []struct{ src, kubeconfig, certDir string }{
		{"", "", "/var/lib/outpost/pki"},
		{"bootstrapKubeconfig: /etc/outpost/bootstrap.kubeconfig\n", "/var/lib/outpost/kubeconfig", "/var/lib/outpost/pki"},
		{"stateDir: /data/outpost\nbootstrapKubeconfig: /etc/outpost/bootstrap.kubeconfig\n", "/data/outpost/kubeconfig", "/data/outpost/pki"},
		{"bootstrapKubeconfig: /etc/outpost/bootstrap.kubeconfig\nkubeconfig: /etc/outpost/node.kubeconfig\n", "/etc/outpost/node.kubeconfig", "/var/lib/outpost/pki"},
	}
	for _, tt := range tests {
		cfg, err := Parse("config.yaml", []byte(tt.src))
		if err != nil {
			t.Errorf("%q: %v", tt.src, err)
			continue
		}
		if cfg.Kubeconfig != tt.kubeconfig || cfg.CertDir() != tt.certDir {
			t.Errorf("%q: kubeconfig %q, certDir %q; want %q, %q", tt.src, cfg.Kubeconfig, cfg.CertDir(), tt.kubeconfig, tt.certDir)
		}
	}
}

// A default derived from another field follows it: a user who changes
// only serviceCIDR or stateDir gets a config that starts.
func TestDerivedDefaultsFollowTheirFields(t *testing.T) {
	tests := []struct{ src, dns, images string }{
		{"", "10.43.0.10", "/var/lib/outpost/images"},
		{"network: {serviceCIDR: 10.96.0.0/12}\n", "10.96.0.10", "/var/lib/outpost/images"},
		{"network: {serviceCIDR: 10.96.0.0/12, clusterDNS: 10.96.0.53}\n", "10.96.0.53", "/var/lib/outpost/images"},
		{"network: {serviceCIDR: 'fd00:43::/108'}\n", "fd00:43::a", "/var/lib/outpost/images"},
		{"stateDir: /data/outpost\n", "10.43.0.10", "/data/outpost/images"},
		{"stateDir: /data/outpost\nimageDir: /mnt/images\n", "10.43.0.10", "/mnt/images"},
	}
	for _, tt := range tests {
		cfg, err := Parse("config.yaml", []byte(tt.src))
		if err != nil {
			t.Errorf("%q: %v", tt.src, err)
			continue
		}
		if cfg.Network.ClusterDNS != tt.dns || cfg.ImageDir != tt.images {
			t.Errorf("%q: clusterDNS %s, imageDir %s; want %s, %s", tt.src, cfg.Network.ClusterDNS, cfg.ImageDir, tt.dns, tt.images)
		}
	}
	// A service CIDR too small for a 10th address keeps the default,
	// which validate then refuses, naming both fields.
	if _, err := Parse("config.yaml", []byte("network: {serviceCIDR: 10.96.0.0/29}\n")); err == nil || !strings.Contains(err.Error(), "network.clusterDNS") {
		t.Errorf("a /29 service CIDR: %v, want clusterDNS refused", err)
	}
}

func TestLoadNamesFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "outpost.yaml")
	if err := os.WriteFile(p, []byte("log: {format: xml}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(p)
	if err == nil || !strings.HasPrefix(err.Error(), p+": log.format:") {
		t.Fatalf("err = %v", err)
	}
}

func TestPackagedExampleIsValidAndComplete(t *testing.T) {
	cfg, err := Load("../../packaging/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	cfg.NodeName, want.NodeName = "", ""
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("packaging/config.yaml differs from the defaults:\n got %+v\nwant %+v", cfg, want)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("nodeName: a\nnetwork: {podCIDR: 10.0.0.0/24}\n"))
	f.Add([]byte("server: {address: ':1'}\nlog: {level: debug}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("f.yaml", data)
		if err == nil && cfg.validate("f.yaml") != nil {
			t.Fatal("accepted a config that does not validate")
		}
	})
}
