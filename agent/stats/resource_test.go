package stats

import (
	"bytes"
	"errors"
	"flag"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func writeResourceText(t *testing.T, r *Reader, pods []*corev1.Pod) string {
	t.Helper()
	var b bytes.Buffer
	if err := r.WriteResource(&b, pods); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestWriteResourceGolden checks the exact text for both layouts, which
// hold the same figures and so give the same text.
func TestWriteResourceGolden(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			e := newEnv(t, l.files(fixture))
			golden(t, "resource.txt", writeResourceText(t, e.r, pods()))
		})
	}
}

// TestWriteResourceParses parses the output as Prometheus does and checks
// each family's type, label names and timestamps against kubelet's.
func TestWriteResourceParses(t *testing.T) {
	want := map[string]struct {
		typ    dto.MetricType
		labels []string
		stamp  bool
		n      int
	}{
		containerCPU:       {dto.MetricType_COUNTER, []string{"container", "namespace", "pod"}, true, 4},
		containerMemory:    {dto.MetricType_GAUGE, []string{"container", "namespace", "pod"}, true, 4},
		containerStartTime: {dto.MetricType_GAUGE, []string{"container", "namespace", "pod"}, false, 4},
		nodeCPU:            {dto.MetricType_COUNTER, nil, true, 1},
		nodeMemory:         {dto.MetricType_GAUGE, nil, true, 1},
		podCPU:             {dto.MetricType_COUNTER, []string{"namespace", "pod"}, true, 4},
		podMemory:          {dto.MetricType_GAUGE, []string{"namespace", "pod"}, true, 4},
		resourceScrapeErr:  {dto.MetricType_GAUGE, nil, false, 1},
		scrapeErr:          {dto.MetricType_GAUGE, nil, false, 1},
	}
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			e := newEnv(t, l.files(fixture))
			text := writeResourceText(t, e.r, pods())
			p := expfmt.NewTextParser(model.UTF8Validation)
			fams, err := p.TextToMetricFamilies(strings.NewReader(text))
			if err != nil {
				t.Fatalf("parse: %v\n%s", err, text)
			}
			if got, w := slices.Sorted(maps.Keys(fams)), slices.Sorted(maps.Keys(want)); !slices.Equal(got, w) {
				t.Fatalf("families %v, want %v", got, w)
			}
			for name, f := range fams {
				w := want[name]
				if f.GetType() != w.typ || f.GetHelp() == "" {
					t.Errorf("%s: type %v help %q, want type %v and a help", name, f.GetType(), f.GetHelp(), w.typ)
				}
				if len(f.Metric) != w.n {
					t.Errorf("%s: %d samples, want %d", name, len(f.Metric), w.n)
				}
				for _, m := range f.Metric {
					var labels []string
					for _, lp := range m.Label {
						labels = append(labels, lp.GetName())
						if lp.GetValue() == "" {
							t.Errorf("%s: empty label %s", name, lp.GetName())
						}
					}
					if !slices.Equal(labels, w.labels) {
						t.Errorf("%s: labels %v, want %v", name, labels, w.labels)
					}
					if w.stamp != (m.TimestampMs != nil) {
						t.Errorf("%s: timestamp %v, want one: %v", name, m.TimestampMs, w.stamp)
					}
					if m.TimestampMs != nil && *m.TimestampMs != now.UnixMilli() {
						t.Errorf("%s: timestamp %d, want %d", name, *m.TimestampMs, now.UnixMilli())
					}
				}
			}
			if v := fams[scrapeErr].Metric[0].GetGauge().GetValue(); v != 0 {
				t.Errorf("scrape_error %v, want 0", v)
			}
		})
	}
}

// msPoint is metrics-server's storage.MetricsPoint.
type msPoint struct {
	startTime, timestamp time.Time
	cpu, memory          uint64
}

// msBatch is what metrics-server keeps of a scrape.
type msBatch struct {
	node *msPoint
	// pods by "namespace/name", containers by name.
	pods map[string]map[string]msPoint
}

// decodeLikeMetricsServer replays sigs.k8s.io/metrics-server v0.8.0's
// pkg/scraper/client/resource/decode.go (decodeBatch), which we do not
// import as it pulls in Prometheus' own parser and metrics-server's
// storage: series are matched by name (exact, or followed by "{"), labels
// are found by searching the raw series for `container="`, `pod="` and
// `namespace="`, a sample without a timestamp gets the scrape's time, the
// node is dropped when its CPU or memory is 0, and a pod is dropped when
// any of its containers has 0 CPU or memory. Unlike metrics-server, which
// would slice at a bad index, it fails when a label is missing.
func decodeLikeMetricsServer(t *testing.T, text string, scrapeTime time.Time) msBatch {
	t.Helper()
	matches := func(series, name string) bool {
		return strings.HasPrefix(series, name) && (len(series) == len(name) || series[len(name)] == '{')
	}
	label := func(series, tag string) string {
		i := strings.Index(series, tag)
		if i < 0 {
			t.Fatalf("series %s has no %s", series, tag)
		}
		rest := series[i+len(tag):]
		return rest[:strings.IndexByte(rest, '"')]
	}
	node := msPoint{}
	pods := map[string]map[string]msPoint{}
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line) // our label values hold no spaces
		series := f[0]
		value, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		ts := scrapeTime
		if len(f) == 3 {
			ms, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			ts = time.Unix(0, ms*1e6)
		}
		container := func() (map[string]msPoint, string) {
			c := label(series, `container="`)
			key := label(series, `namespace="`) + "/" + label(series, `pod="`)
			if pods[key] == nil {
				pods[key] = map[string]msPoint{}
			}
			return pods[key], c
		}
		switch {
		case matches(series, nodeCPU):
			node.cpu, node.timestamp = uint64(value*1e9), ts
		case matches(series, nodeMemory):
			node.memory, node.timestamp = uint64(value), ts
		case matches(series, containerCPU):
			cs, c := container()
			p := cs[c]
			p.cpu, p.timestamp = uint64(value*1e9), ts
			cs[c] = p
		case matches(series, containerMemory):
			cs, c := container()
			p := cs[c]
			p.memory, p.timestamp = uint64(value), ts
			cs[c] = p
		case matches(series, containerStartTime):
			cs, c := container()
			p := cs[c]
			p.startTime = time.Unix(0, int64(value*1e9))
			cs[c] = p
		}
	}
	b := msBatch{pods: map[string]map[string]msPoint{}}
	if !node.timestamp.IsZero() && node.cpu != 0 && node.memory != 0 {
		b.node = &node
	}
pods:
	for key, cs := range pods {
		for _, p := range cs {
			if p.cpu == 0 || p.memory == 0 {
				continue pods
			}
		}
		b.pods[key] = cs
	}
	return b
}

// TestMetricsServerDecodes checks that metrics-server would keep the node
// and every pod, with the fixture's figures.
func TestMetricsServerDecodes(t *testing.T) {
	scrape := now.Add(time.Second)
	ts := time.UnixMilli(now.UnixMilli())
	start := time.Unix(0, started.UnixNano())
	want := msBatch{
		node: &msPoint{cpu: 357354910000, memory: 1616273408, timestamp: ts},
		pods: map[string]map[string]msPoint{
			"default/web": {
				"nginx":   {cpu: 4710169000, memory: 12533760, timestamp: ts, startTime: start},
				"sidecar": {cpu: 1000000, memory: 300000, timestamp: ts, startTime: start},
			},
			"default/api":                          {"nginx": {cpu: 1500000000, memory: 3500000, timestamp: ts, startTime: start}},
			"kube-system/coredns-558bd4d5db-4dpjz": {"coredns": {cpu: 2500000000, memory: 7000000, timestamp: ts, startTime: start}},
		},
	}
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			e := newEnv(t, l.files(fixture))
			got := decodeLikeMetricsServer(t, writeResourceText(t, e.r, pods()), scrape)
			if got.node == nil || *got.node != *want.node {
				t.Errorf("node %+v, want %+v", got.node, want.node)
			}
			if !maps.EqualFunc(got.pods, want.pods, func(a, b map[string]msPoint) bool { return maps.Equal(a, b) }) {
				t.Errorf("pods\n%+v\nwant\n%+v", got.pods, want.pods)
			}
		})
	}
}

// TestWriteResourceSkipsAndFails checks that missing cgroups are left out
// quietly, and unreadable ones are left out with scrape_error 1 while the
// rest is still written.
func TestWriteResourceSkipsAndFails(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			e := newEnv(t, l.files(fixture))
			onlyGone := writeResourceText(t, e.r, []*corev1.Pod{pods()[2]}) // default/gone
			if strings.Contains(onlyGone, "gone") || !strings.Contains(onlyGone, "\nscrape_error 0\n") || !strings.Contains(onlyGone, "\nresource_scrape_error 0\n") {
				t.Errorf("a pod without cgroups: got\n%s", onlyGone)
			}
			if strings.Contains(onlyGone, "container_") || strings.Contains(onlyGone, "pod_") {
				t.Errorf("empty families written:\n%s", onlyGone)
			}

			// Break the CPU file of default/api's container.
			bad := map[string]string{}
			for p := range l.files(map[string]cg{"/outpost/poduid-api/c5": {}}) {
				if strings.HasSuffix(p, "cpuacct.usage") || strings.HasSuffix(p, "cpu.stat") {
					bad[p] = "garbage\n"
				}
			}
			writeFiles(t, e.cgroupRoot, bad)
			text := writeResourceText(t, e.r, pods())
			if !strings.Contains(text, "\nscrape_error 1\n") || !strings.Contains(text, "\nresource_scrape_error 1\n") {
				t.Errorf("scrape errors not 1:\n%s", text)
			}
			if strings.Contains(text, `container="nginx",namespace="default",pod="api"`) {
				t.Errorf("unreadable container written:\n%s", text)
			}
			for _, s := range []string{`container="nginx",namespace="default",pod="web"`, `namespace="default",pod="api"`, "node_cpu_usage_seconds_total 357.35491 "} {
				if !strings.Contains(text, s) {
					t.Errorf("missing %s:\n%s", s, text)
				}
			}
		})
	}
}

// TestWriteResourceUnreadableNode checks that a node whose usage cannot be
// read gets scrape_error 1 and no node samples, and the pods still come.
func TestWriteResourceUnreadableNode(t *testing.T) {
	e := newEnv(t, v2Files(fixture))
	writeFiles(t, e.cgroupRoot, map[string]string{"cpu.stat": "usage_usec x\n"})
	text := writeResourceText(t, e.r, pods())
	if strings.Contains(text, "node_") || !strings.Contains(text, "\nscrape_error 1\n") || !strings.Contains(text, `pod="web"`) {
		t.Errorf("got\n%s", text)
	}
	if _, err := e.r.Summary(pods()); err == nil || !strings.Contains(err.Error(), "read node stats") {
		t.Errorf("Summary error %v, want one reading node stats", err)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

func TestWriteResourceWriteError(t *testing.T) {
	e := newEnv(t, v2Files(fixture))
	err := e.r.WriteResource(failWriter{}, pods())
	if err == nil || !strings.Contains(err.Error(), "write resource metrics: broken pipe") {
		t.Errorf("error %v", err)
	}
}
