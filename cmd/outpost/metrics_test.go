package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/agent/runtimetest"
	"github.com/outpost-edge/outpost/arm"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/promtext"
	"github.com/outpost-edge/outpost/internal/waittest"
	"github.com/outpost-edge/outpost/netproxy/nfttest"
	"github.com/outpost-edge/outpost/netproxy/proxy"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/sync/kube"
)

// TestMetricsWriter runs the composer over an agent running one static pod
// on the fake runtime, a store, an API sync that is not running, a proxy
// that synced once to the fake ruleset and made-up board readings, and
// parses the whole output as Prometheus does.
func TestMetricsWriter(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	clk := clock.Real{}
	st, err := store.Open(filepath.Join(dir, store.FileName), store.Options{NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	manifests := filepath.Join(dir, "manifests")
	os.Mkdir(manifests, 0o755)
	os.WriteFile(filepath.Join(manifests, "web.yaml"), []byte(`apiVersion: v1
kind: Pod
metadata: {name: web, namespace: edge}
spec:
  containers: [{name: app, image: "busybox:1", imagePullPolicy: IfNotPresent, command: [sleep, inf]}]
`), 0o644)
	rt := runtimetest.New(clk)
	rt.AddImage("busybox:1")
	a, err := agent.New(agent.Config{NodeName: "n1", ManifestDir: manifests, Pods: agent.PodConfig{
		PodsDir: filepath.Join(dir, "pods"), LogDir: filepath.Join(dir, "logs"),
	}}, agent.Deps{Store: st, Clock: clk, Log: log, Pods: agent.PodDeps{Runtime: rt}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// Wait until the pod runs and its worker's sync that started it has
	// returned (the status shows before).
	waittest.Poll{Timeout: 10 * time.Second, Every: 5 * time.Millisecond}.For(t, "the pod to run", func() (bool, string) {
		var b strings.Builder
		p := promtext.New(&b)
		a.WriteMetrics(p)
		p.Flush()
		running := strings.Contains(b.String(), "\noutpost_pods_by_phase{phase=\"Running\"} 1\n") &&
			strings.Contains(b.String(), "\noutpost_containers{state=\"running\"} 1\n") &&
			!strings.Contains(b.String(), "\noutpost_pod_worker_duration_seconds_count 0\n")
		return running, fmt.Sprintf("%v", a.PodViews())
	})

	client, err := kube.NewClient(&rest.Config{Host: "https://127.0.0.1:1"}, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	syncer, err := kube.New(kube.Config{NodeName: "n1"}, kube.Deps{Client: client, Store: st, Clock: clk, Log: log})
	if err != nil {
		t.Fatal(err)
	}

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "web"},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.96.0.10", Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	if err := st.Services().Put(store.SourceStatic, svc); err != nil {
		t.Fatal(err)
	}
	px, err := proxy.New(proxy.Config{Node: "n1", PodCIDR: netip.MustParsePrefix("10.42.0.0/24")}, proxy.Deps{Store: st, Ruleset: nfttest.NewFake(), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := px.Sync(); err != nil {
		t.Fatal(err)
	}

	throttle, alarm := arm.Throttle(0x50005), true
	health := func() arm.Readings {
		return arm.Readings{
			Zones:             []arm.Zone{{Name: "thermal_zone0", Type: `cpu"thermal\`, MilliC: 48500}, {Name: "thermal_zone1", MilliC: 51000}},
			Throttle:          &throttle,
			UnderVoltageAlarm: &alarm,
		}
	}

	var b strings.Builder
	p := promtext.New(&b)
	metricsWriter(a, st, &kubeSync{Syncer: syncer}, nil, px, health)(p)
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	text := b.String()
	checkFamilies(t, text)

	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, text)
	}
	for _, name := range []string{
		"outpost_build_info", "outpost_manifest_errors",
		"outpost_pods", "outpost_pods_by_phase", "outpost_containers", "outpost_container_restarts_total",
		"outpost_container_ready", "outpost_probe_total", "outpost_pod_worker_duration_seconds",
		"outpost_store_file_size_bytes", "outpost_store_written_bytes_total", "outpost_store_commits_total", "outpost_store_objects",
		"outpost_api_link_up", "outpost_api_last_contact_age_seconds", "outpost_status_journal_backlog",
		"outpost_proxy_syncs_total", "outpost_proxy_sync_duration_seconds", "outpost_proxy_last_sync_duration_seconds",
		"outpost_proxy_service_ports", "outpost_proxy_nftables_chains", "outpost_proxy_nftables_rules",
		arm.MetricTemperature, arm.MetricThrottleFlag, arm.MetricUnderVoltageAlarm,
		"process_cpu_seconds_total", "process_resident_memory_bytes", "process_start_time_seconds", "process_open_fds",
		"go_goroutines", "go_memstats_heap_alloc_bytes", "go_gc_duration_seconds",
	} {
		f, ok := fams[name]
		if !ok {
			t.Errorf("no family %s", name)
			continue
		}
		if len(f.Metric) == 0 {
			t.Errorf("family %s has no samples", name)
		}
		if f.GetType() == dto.MetricType_COUNTER && !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s does not end in _total", name)
		}
	}
	for name, f := range fams {
		if strings.HasSuffix(name, "_total") && f.GetType() != dto.MetricType_COUNTER {
			t.Errorf("%s is a %v, not a counter", name, f.GetType())
		}
	}

	value := func(family string, labels ...string) float64 {
		t.Helper()
	next:
		for _, m := range fams[family].GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Summary != nil:
				return float64(m.Summary.GetSampleCount())
			}
		}
		t.Errorf("no sample %s%v", family, labels)
		return -1
	}
	for _, c := range []struct {
		family string
		labels []string
		want   float64
	}{
		{"outpost_build_info", []string{"version", version}, 1},
		{"outpost_pods", []string{"state", "Running"}, 1},
		{"outpost_pods_by_phase", []string{"phase", "Running"}, 1},
		{"outpost_containers", []string{"state", "running"}, 1},
		{"outpost_container_restarts_total", []string{"namespace", "edge", "pod", "web-n1", "container", "app"}, 0},
		{"outpost_container_ready", []string{"namespace", "edge", "pod", "web-n1", "container", "app"}, 1},
		{"outpost_store_objects", []string{"kind", "pods"}, 1},
		{"outpost_store_objects", []string{"kind", "services"}, 1},
		{"outpost_api_link_up", nil, 0},
		{"outpost_proxy_syncs_total", []string{"kind", "full", "result", "success"}, 1},
		{"outpost_proxy_service_ports", nil, 1},
		{arm.MetricTemperature, []string{"zone", "thermal_zone0", "type", `cpu"thermal\`}, 48.5},
		{arm.MetricThrottleFlag, []string{"flag", "under-voltage", "state", "now"}, 1},
		{arm.MetricThrottleFlag, []string{"flag", "throttled", "state", "occurred"}, 1},
		{arm.MetricThrottleFlag, []string{"flag", "arm-frequency-capped", "state", "now"}, 0},
		{arm.MetricUnderVoltageAlarm, nil, 1},
	} {
		if got := value(c.family, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.family, c.labels, got, c.want)
		}
	}
	if v := value("outpost_pod_worker_duration_seconds"); v < 1 {
		t.Errorf("%v pod worker syncs, want some", v)
	}
	if v := value("outpost_store_written_bytes_total"); v <= 0 {
		t.Errorf("the store wrote %v bytes", v)
	}
	if v := value("process_resident_memory_bytes"); v < 1<<20 {
		t.Errorf("RSS %v", v)
	}

	// Standalone and --record-only: no API sync, no proxy, no board.
	b.Reset()
	p = promtext.New(&b)
	metricsWriter(a, st, nil, nil, nil, nil)(p)
	p.Flush()
	checkFamilies(t, b.String())
	fams, err = parser.TextToMetricFamilies(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"outpost_api_link_up", "outpost_status_journal_backlog", "outpost_proxy_syncs_total", arm.MetricTemperature} {
		if _, ok := fams[name]; ok {
			t.Errorf("family %s written without its source", name)
		}
	}
}

// checkFamilies checks what the text format parser lets pass: every
// family is written once, and each sample follows its own family's HELP
// and TYPE (a summary's samples end in _sum or _count).
func checkFamilies(t *testing.T, text string) {
	t.Helper()
	seen := map[string]bool{}
	family, typ := "", ""
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name, _, _ := strings.Cut(rest, " ")
			if seen[name] {
				t.Errorf("line %d: family %s written twice", i+1, name)
			}
			seen[name], family, typ = true, name, ""
			continue
		}
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, t2, _ := strings.Cut(rest, " ")
			if name != family {
				t.Errorf("line %d: TYPE of %s after the HELP of %s", i+1, name, family)
			}
			typ = t2
			continue
		}
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		ok := name == family
		if typ == "summary" {
			ok = name == family+"_sum" || name == family+"_count"
		}
		if !ok || typ == "" {
			t.Errorf("line %d: sample %q is not of family %s (%s)", i+1, line, family, typ)
		}
	}
}
