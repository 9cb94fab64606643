package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/config"
	"github.com/outpost-edge/outpost/internal/report"
	"github.com/outpost-edge/outpost/internal/waittest"
	"github.com/outpost-edge/outpost/sync/kube"
)

// server.tlsBootstrap makes a ServingCerts only with a kubeconfig and no
// configured certificate, and says why it is ignored otherwise; the
// certificate is not for localhost or loopback addresses.
func TestKubeletAPITLSBootstrap(t *testing.T) {
	client, err := kube.NewClient(&rest.Config{Host: "https://127.0.0.1:1"}, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name      string
		bootstrap bool
		certFile  string
		ks        *kubeSync
		wantCerts bool
		wantLog   string
	}{
		{name: "off", ks: &kubeSync{client: client}},
		{name: "on", bootstrap: true, ks: &kubeSync{client: client}, wantCerts: true},
		{name: "standalone", bootstrap: true, wantLog: "server.tlsBootstrap ignored: no kubeconfig"},
		{name: "certificate file", bootstrap: true, certFile: "/etc/outpost/serving.crt", ks: &kubeSync{client: client},
			wantLog: "server.tlsBootstrap ignored: server.tlsCertFile is set"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.NodeName, cfg.StateDir = "n1", t.TempDir()
			cfg.Server.Address = "127.0.0.1:0"
			cfg.Server.TLSBootstrap = tt.bootstrap
			cfg.Server.TLSCertFile, cfg.Server.TLSKeyFile = tt.certFile, strings.TrimSuffix(tt.certFile, ".crt")+".key"
			var logs bytes.Buffer
			api, err := newKubeletAPI(cfg, nil, tt.ks, "10.0.0.5", nil, nil, clock.Real{}, slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			if (api.certs != nil) != tt.wantCerts {
				t.Fatalf("serving certificates %v, want %v", api.certs != nil, tt.wantCerts)
			}
			if !strings.Contains(logs.String(), tt.wantLog) {
				t.Errorf("logs %q, want %q", logs.String(), tt.wantLog)
			}
			if api.certs == nil {
				if strings.Contains(logs.String(), "requesting serving certificate") {
					t.Errorf("logs %q", logs.String())
				}
				return
			}
			names := []string{"10.0.0.5", "n1"}
			if h, err := os.Hostname(); err == nil && strings.ToLower(h) != "n1" {
				names = append(names, strings.ToLower(h))
				slices.Sort(names)
			}
			if want := "names=" + strings.Join(names, ","); !strings.Contains(logs.String(), want) {
				t.Errorf("logs %q, want %q", logs.String(), want)
			}
			if st := api.certs.State(); !strings.Contains(st.Reason, "no serving certificate") || api.certs.Current() != nil {
				t.Errorf("state %+v", st)
			}
			// Run requests (the API server is unreachable) while it
			// serves, and stops both when ctx ends.
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- api.Run(ctx) }()
			waittest.For(t, "a request made", 20*time.Second, func() (bool, string) {
				st := api.certs.State()
				return st.Phase == report.CertFailing, fmt.Sprintf("state %+v", st)
			})
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		})
	}
}
