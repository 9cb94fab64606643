package config

import (
	"strings"
	"testing"
)

func TestParseBridge(t *testing.T) {
	cfg, err := ParseBridge("bridge.yaml", []byte("mqtt: {brokers: ['ssl://b:8883']}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.StateDir != "/var/cache/outpost-bridge" || cfg.MQTT.ClientID != "outpost-bridge" || cfg.MQTT.KeepaliveDuration() != 60e9 || cfg.Kubeconfig != "" {
		t.Errorf("defaults = %+v", cfg)
	}
	for _, tt := range []struct{ src, want string }{
		{"{}\n", "bridge.yaml: mqtt.brokers: is empty: the bridge needs a broker"},
		{"mqtt: {brokers: ['tcp://broker.example:1883']}\n", "bridge.yaml: mqtt.brokers[0]: \"tcp://broker.example:1883\" is plain TCP"},
		{"mqtt: {brokers: ['ssl://b:8883']}\nstateDir: cache\n", `bridge.yaml: stateDir: "cache" is not an absolute path`},
		{"mqtt: {brokers: ['ssl://b:8883']}\nkubeconfig: kc\n", `bridge.yaml: kubeconfig: "kc" is not an absolute path`},
		{"mqtt: {brokers: ['ssl://b:8883']}\nlabels: {'a b': x}\n", `bridge.yaml: labels: key "a b" is not a valid label key`},
		{"mqtt: {brokers: ['ssl://b:8883']}\nmanifestDir: /x\n", "bridge.yaml: manifestDir: unknown field (line 2)"},
		{"a: 1\n---\nb: 2\n", "bridge.yaml: holds more than one YAML document"},
		{"mqtt: {brokers: ['ssl://b:8883'], trustedKeys: ['" + testKey + "']}\n", "bridge.yaml: mqtt.trustedKeys: is a node's setting"},
		{"mqtt: {brokers: ['ssl://b:8883'], signingKeyFile: signing.key}\n", `bridge.yaml: mqtt.signingKeyFile: "signing.key" is not an absolute path`},
		{"mqtt: {brokers: ['ssl://b:8883']}\nreplicas: {shards: -1}\n", "bridge.yaml: replicas.shards: -1 is not between 0 and 1024"},
		{"mqtt: {brokers: ['ssl://b:8883']}\nreplicas: {shards: 8, namespace: Outpost}\n", `bridge.yaml: replicas.namespace: "Outpost" is not a namespace name`},
		{"mqtt: {brokers: ['ssl://b:8883']}\nreplicas: {shards: 8, identity: 'a_b'}\n", `bridge.yaml: replicas.identity: "a_b" is not a DNS-1123 subdomain`},
	} {
		_, err := ParseBridge("bridge.yaml", []byte(tt.src))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseBridge(%q) = %v, want %q", tt.src, err, tt.want)
		}
	}
	cfg, err = ParseBridge("bridge.yaml", []byte("mqtt: {brokers: ['ssl://b:8883']}\nreplicas: {shards: 16, namespace: outpost-system, identity: bridge-0}\n"))
	if err != nil || cfg.Replicas != (Replicas{Shards: 16, Namespace: "outpost-system", Identity: "bridge-0"}) {
		t.Errorf("replicas = %+v, %v", cfg.Replicas, err)
	}
	if _, err := LoadBridge(""); err == nil || !strings.Contains(err.Error(), "--config FILE is required") {
		t.Errorf("LoadBridge without a file: %v", err)
	}
}

// TestParseBridgeKubeletAPI: the kubelet API's address may come from the
// environment, and a bad range or a missing client CA names the field.
func TestParseBridgeKubeletAPI(t *testing.T) {
	t.Setenv("POD_IP", "10.0.3.17")
	cfg, err := ParseBridge("b.yaml", []byte("mqtt: {brokers: [\"ssl://m:8883\"]}\nkubeletAPI: {address: \"${POD_IP}\", clientCAFile: /ca.crt}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if first, last := cfg.KubeletAPI.PortRange(); cfg.KubeletAPI.Address != "10.0.3.17" || first != 20000 || last != 29999 || cfg.KubeletAPI.IdleTimeout().Hours() != 4 {
		t.Errorf("kubeletAPI: %+v", cfg.KubeletAPI)
	}
	for in, field := range map[string]string{
		"kubeletAPI: {address: 10.0.0.1, ports: 30000-20000, clientCAFile: /ca.crt}": "kubeletAPI.ports",
		"kubeletAPI: {address: 10.0.0.1, ports: 1-70000, clientCAFile: /ca.crt}":     "kubeletAPI.ports",
		"kubeletAPI: {address: 10.0.0.1}":                                            "kubeletAPI.clientCAFile",
		"kubeletAPI: {address: bridge.local, clientCAFile: /ca.crt}":                 "kubeletAPI.address",
	} {
		_, err := ParseBridge("b.yaml", []byte("mqtt: {brokers: [\"ssl://m:8883\"]}\n"+in+"\n"))
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v, want an error naming %s", in, err, field)
		}
	}
}
