package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/outpost-edge/outpost/test/e2e/env"
)

// BenchmarkKubeletAPI measures the kubelet API through a real API server
// (run with -benchtime 1x; make bench does):
//   - exec-ms: the median round trip of `kubectl exec … -- true` as the
//     API server streams it (SPDY to the node), over 20 runs;
//   - log-MB/s: a followed log (the API server's pods/log with
//     follow=true) of a container that writes as fast as it can, over 10 s;
//   - the agent's VmRSS idle with the API served, with 10 follows of a log
//     open (the peak while they are), and idle with `server.address: ""`
//     (no API), after a restart; the differences are the API's cost.
func BenchmarkKubeletAPI(b *testing.B) {
	env.RequireRoot(b)
	api, adm, n, _ := startDebugNode(b)
	flood := apiPod("flood", n.name, "exec yes 0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz")
	flood.Spec.Containers[0].Name = "yes"
	adm.create("pods", flood)
	within(60*time.Second).For(b, "flood pod running", func() (bool, string) {
		p, err := adm.pod("flood")
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning, string(p.Status.Phase)
	})
	cfg := rest.CopyConfig(api.Config)
	rc := coreClient(b, cfg)
	pid := n.agentPID()
	rss := func() float64 { return float64(benchProcStatus(b, pid, "VmRSS")["VmRSS"]) / 1024 }
	time.Sleep(10 * time.Second)
	idle := rss()

	// exec round trips.
	var lat []time.Duration
	for range 20 {
		u := rc.Post().Namespace("default").Resource("pods").Name("debug").SubResource("exec").
			Param("container", "log").Param("command", "true").Param("stdout", "true").URL()
		ex, err := remotecommand.NewSPDYExecutor(cfg, "POST", u)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := ex.StreamWithContext(context.Background(), remotecommand.StreamOptions{Stdout: io.Discard}); err != nil {
			b.Fatalf("exec: %v", err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	execMs := float64(lat[len(lat)/2].Microseconds()) / 1000

	follow := func(ctx context.Context, pod, container string, count *atomic.Int64) error {
		u := rc.Get().Namespace("default").Resource("pods").Name(pod).SubResource("log").
			Param("container", container).Param("follow", "true").Param("tailLines", "0").URL()
		return streamURL(ctx, cfg, u, count)
	}
	// Log throughput of one follow.
	var bytes atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	start := time.Now()
	follow(ctx, "flood", "yes", &bytes)
	elapsed := time.Since(start)
	cancel()
	mbps := float64(bytes.Load()) / elapsed.Seconds() / 1e6

	// Ten follows at once, of the flood and of a quiet log.
	var wg sync.WaitGroup
	var many atomic.Int64
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	for i := range 10 {
		pod, c := "debug", "log"
		if i%2 == 0 {
			pod, c = "flood", "yes"
		}
		wg.Go(func() { follow(ctx, pod, c, &many) })
	}
	peak := 0.0
	for ctx.Err() == nil {
		peak = max(peak, rss())
		time.Sleep(250 * time.Millisecond)
	}
	wg.Wait()
	cancel()

	// The same agent without the API.
	dctx, dcancel := adm.ctx()
	adm.core.Delete().Namespace("default").Resource("pods").Name("flood").Do(dctx)
	dcancel()
	n.stop()
	data, err := os.ReadFile(n.cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(n.cfg, []byte(strings.Replace(string(data), "server:\n", "server:\n  address: \"\"\n", 1)), 0o644); err != nil {
		b.Fatal(err)
	}
	n.start()
	within(60*time.Second).For(b, "agent running again", func() (bool, string) {
		s, err := n.status()
		return err == nil && len(s.Pods) >= 1, fmt.Sprint(err)
	})
	pid = n.agentPID()
	time.Sleep(10 * time.Second)
	noAPI := rss()

	b.Logf("exec round trip: median %.1f ms (min %.1f, max %.1f) over %d; one followed log: %.1f MB/s over %v; "+
		"agent VmRSS: %.1f MiB without the API, %.1f MiB with it idle, peak %.1f MiB with 10 follows (%.1f MB read)",
		execMs, float64(lat[0].Microseconds())/1000, float64(lat[len(lat)-1].Microseconds())/1000, len(lat),
		mbps, elapsed.Round(time.Millisecond), noAPI, idle, peak, float64(many.Load())/1e6)
	b.ReportMetric(execMs, "exec-ms")
	b.ReportMetric(mbps, "log-MB/s")
	b.ReportMetric(idle-noAPI, "api-idle-MiB")
	b.ReportMetric(peak-noAPI, "api-10follows-MiB")
}

// streamURL reads a streaming GET of u with cfg's credentials until ctx
// ends, counting the bytes.
func streamURL(ctx context.Context, cfg *rest.Config, u *url.URL, count *atomic.Int64) error {
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, "GET", u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := resp.Body.Read(buf)
		count.Add(int64(n))
		if err != nil {
			return nil
		}
	}
}
