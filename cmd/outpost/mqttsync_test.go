package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/config"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/sync/kube"
	"github.com/outpost-edge/outpost/sync/mqtt"
)

// writeCert writes a self-signed certificate for cn and its key.
func writeCert(t *testing.T, dir, cn string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<35, 0)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, cn+".crt"), filepath.Join(dir, cn+".key")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600)
	return certFile, keyFile
}

func TestNewMQTTSync(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, store.FileName), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	facts := func() kube.NodeFacts { return kube.NodeFacts{} }
	cert, key := writeCert(t, dir, "pi-1")
	base := func() config.Config {
		cfg := config.Default()
		cfg.NodeName = "pi-1"
		cfg.MQTT.Brokers = []string{"ssl://broker.example:8883"}
		cfg.MQTT.CAFile, cfg.MQTT.CertFile, cfg.MQTT.KeyFile = cert, cert, key
		return cfg
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	if ms, err := newMQTTSync(config.Default(), st, clock.Real{}, log, facts); ms != nil || err != nil {
		t.Errorf("without mqtt.brokers: %v, %v; want nil, nil", ms, err)
	}
	ms, err := newMQTTSync(base(), st, clock.Real{}, log, facts)
	if err != nil || ms == nil {
		t.Fatalf("newMQTTSync: %v", err)
	}
	if strings.Contains(logs.String(), "CN") {
		t.Errorf("warned with a certificate for the node: %s", logs.String())
	}

	other := base()
	other.NodeName = "pi-2"
	if _, err := newMQTTSync(other, st, clock.Real{}, log, facts); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "mqtt.certFile's CN is not nodeName") || !strings.Contains(logs.String(), "cn=pi-1") {
		t.Errorf("no warning for a certificate of another node: %s", logs.String())
	}

	for _, tc := range []struct {
		name string
		mod  func(*config.Config)
		want string
	}{
		{"missing CA", func(c *config.Config) { c.MQTT.CAFile = filepath.Join(dir, "none.crt") }, "mqtt.caFile: open"},
		{"CA not PEM", func(c *config.Config) { c.MQTT.CAFile = key }, "no PEM certificate"},
		{"key of no cert", func(c *config.Config) { c.MQTT.KeyFile = cert }, "mqtt.certFile " + cert},
		{"missing password", func(c *config.Config) {
			c.MQTT.Username, c.MQTT.PasswordFile = "pi", filepath.Join(dir, "none")
		}, "mqtt.passwordFile: open"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.mod(&cfg)
			_, err := newMQTTSync(cfg, st, clock.Real{}, log, facts)
			var ue usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want a usage error containing %q", err, tc.want)
			}
		})
	}
}

func TestMQTTDecode(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	body, err := pod.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	payload := mqtt.Envelope{Kind: "Pod", Generation: 41, Encoding: mqtt.EncodingProtobuf, Body: body}.Marshal()
	var out bytes.Buffer
	if err := runMQTT([]string{"decode"}, bytes.NewReader(payload), &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: Pod", "generation: 41", "encoding: protobuf", "name: web", "phase: Running"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("decode output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := runMQTT([]string{"decode"}, strings.NewReader("false"), &out); err != nil || out.String() != "online: \"false\"\n" {
		t.Errorf("online flag: %q, %v", out.String(), err)
	}
	if err := runMQTT([]string{"decode"}, strings.NewReader("{}"), &out); err == nil || !strings.Contains(err.Error(), "not an outpost envelope") {
		t.Errorf("garbage: %v", err)
	}
	var ue usageError
	if err := runMQTT([]string{"encode"}, nil, &out); !errors.As(err, &ue) {
		t.Errorf("unknown subcommand: %v", err)
	}
}
