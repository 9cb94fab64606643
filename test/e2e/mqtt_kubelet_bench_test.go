package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/outpost-edge/outpost/test/e2e/env"
)

// BenchmarkMQTTKubeletAPI measures the kubelet API of an MQTT node through
// the bridge beside the same of a node the API server dials, in one run
// with one API server (run with -benchtime 1x; make bench does):
//   - exec-ms, exec-p99-ms: `kubectl exec … -- true` round trips as the
//     API server streams them (SPDY), 40 to each node, alternating; the
//     ratio is the MQTT node's median over the direct node's (target ≤ 2);
//   - log-MB/s: a followed log of a container writing as fast as it can,
//     over 10 s, through the bridge (target ≥ 1 MB/s), and the same of the
//     direct node;
//   - link-bytes/exec: MQTT and TLS bytes on the node's link per exec
//     round trip (the agent's outpost_mqtt_wire_bytes_total), both ways.
func BenchmarkMQTTKubeletAPI(b *testing.B) {
	env.RequireRoot(b)
	s := newMQTTSetupWith(b, "e2e-mqtt-kbench", mqttOptions{kubelet: true, signed: true})
	s.node.start()
	s.nodeReady(60 * time.Second)
	direct := newNode(b, "e2e-direct-kbench")
	direct.hostLink()
	direct.connect(s.api)
	direct.appendConfig(fmt.Sprintf("server:\n  clientCAFile: %s\n", s.api.ClientCAFile))
	direct.start()
	healthyNode(b, s.adm, direct.name)
	for _, n := range []*node{s.node, direct} {
		p := apiPod("sh-"+n.name, n.name, "exec sleep 3600")
		p.Spec.Containers[0].Name = "sh"
		s.adm.create("pods", p)
		f := apiPod("flood-"+n.name, n.name, "exec yes 0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz")
		f.Spec.Containers[0].Name = "yes"
		s.adm.create("pods", f)
	}
	for _, name := range []string{"sh-" + s.node.name, "sh-" + direct.name, "flood-" + s.node.name, "flood-" + direct.name} {
		within(90*time.Second).For(b, name+" running", func() (bool, string) {
			p, err := s.adm.pod(name)
			if err != nil {
				return false, err.Error()
			}
			return p.Status.Phase == corev1.PodRunning, string(p.Status.Phase)
		})
	}
	cfg := rest.CopyConfig(s.api.Config)
	cfg.QPS, cfg.Burst = 1000, 1000 // client-go's 5 a second would be what is measured
	rc := coreClient(b, cfg)
	exec := func(pod string) time.Duration {
		u := rc.Post().Namespace("default").Resource("pods").Name(pod).SubResource("exec").
			Param("container", "sh").Param("command", "true").Param("stdout", "true").URL()
		ex, err := remotecommand.NewSPDYExecutor(cfg, "POST", u)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := ex.StreamWithContext(context.Background(), remotecommand.StreamOptions{Stdout: io.Discard}); err != nil {
			b.Fatalf("exec in %s: %v", pod, err)
		}
		return time.Since(start)
	}
	// A first exec each, not counted: connections and caches warm.
	exec("sh-" + s.node.name)
	exec("sh-" + direct.name)
	wire := func() int64 {
		raw := s.api.Kubectl(b, "get", "--raw", "/api/v1/nodes/"+s.node.name+"/proxy/metrics")
		var sum int64
		sc := bufio.NewScanner(strings.NewReader(raw))
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "outpost_mqtt_wire_bytes_total{") {
				f := strings.Fields(l)
				v, _ := strconv.ParseFloat(f[len(f)-1], 64)
				sum += int64(v)
			}
		}
		return sum
	}
	// What reading the metrics costs on the link, to take out.
	w0 := wire()
	w1 := wire()
	const runs = 40
	var viaMQTT, viaAPI []time.Duration
	for range runs {
		viaMQTT = append(viaMQTT, exec("sh-"+s.node.name))
		viaAPI = append(viaAPI, exec("sh-"+direct.name))
	}
	w2 := wire()
	// A plain request through the node proxy: one round trip on the
	// link (with a stream's opening), beside the same to the direct node.
	get := func(node string) time.Duration {
		start := time.Now()
		if err := rc.Get().AbsPath("/api/v1/nodes/" + node + "/proxy/healthz").Do(context.Background()).Error(); err != nil {
			b.Fatalf("healthz of %s: %v", node, err)
		}
		return time.Since(start)
	}
	var getMQTT, getAPI []time.Duration
	for range runs {
		getMQTT = append(getMQTT, get(s.node.name))
		getAPI = append(getAPI, get(direct.name))
	}
	slices.Sort(getMQTT)
	slices.Sort(getAPI)
	perExec := float64((w2-w1)-(w1-w0)) / runs
	slices.Sort(viaMQTT)
	slices.Sort(viaAPI)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	med := func(l []time.Duration) float64 { return ms(l[len(l)/2]) }
	p99 := func(l []time.Duration) float64 { return ms(l[(len(l)*99+99)/100-1]) }

	follow := func(pod string) float64 {
		u := rc.Get().Namespace("default").Resource("pods").Name(pod).SubResource("log").
			Param("container", "yes").Param("follow", "true").Param("tailLines", "0").URL()
		var n atomic.Int64
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		streamURL(ctx, cfg, u, &n)
		return float64(n.Load()) / time.Since(start).Seconds() / 1e6
	}
	logMQTT := follow("flood-" + s.node.name)
	logAPI := follow("flood-" + direct.name)

	ratio := med(viaMQTT) / med(viaAPI)
	b.Logf("exec round trip (%d each, alternating): through the bridge median %.1f ms, p99 %.1f ms; to the node the API server dials median %.1f ms, p99 %.1f ms; ratio %.2f (target ≤ 2)",
		runs, med(viaMQTT), p99(viaMQTT), med(viaAPI), p99(viaAPI), ratio)
	b.Logf("GET /healthz through the node proxy: through the bridge median %.1f ms, direct %.1f ms", med(getMQTT), med(getAPI))
	b.Logf("followed log over 10 s: through the bridge %.2f MB/s (target ≥ 1), direct %.2f MB/s", logMQTT, logAPI)
	b.Logf("the node's MQTT link (MQTT and TLS bytes, both ways) per exec round trip: %.0f bytes", perExec)
	b.ReportMetric(med(viaMQTT), "exec-ms")
	b.ReportMetric(p99(viaMQTT), "exec-p99-ms")
	b.ReportMetric(med(viaAPI), "direct-exec-ms")
	b.ReportMetric(ratio, "exec-ratio")
	b.ReportMetric(med(getMQTT), "get-ms")
	b.ReportMetric(med(getAPI), "direct-get-ms")
	b.ReportMetric(logMQTT, "log-MB/s")
	b.ReportMetric(logAPI, "direct-log-MB/s")
	b.ReportMetric(perExec, "link-bytes/exec")
}
