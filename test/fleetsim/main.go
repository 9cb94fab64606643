// Command fleetsim simulates a fleet of outpost nodes that sync over MQTT,
// to run `outpost bridge` at fleet size against a real broker and API
// server.
//
// Each simulated node is a real MQTT client (sync/mqtt's paho dialer, a
// client certificate of its own minted from the broker's CA) speaking the
// agent's topics and envelopes: a retained Node status on status/node
// (again every -node-status-every), its retained online flag with the
// Last Will false, and, every -status-every, the status of one of its
// pods on status/pods (retained, with the generation rising), as the
// agent's journal sends it. It runs no containers and reads none of its
// desired state. The pods themselves it creates in the API server first,
// bound to the nodes.
//
// It watches the pods in the API server and reports, as JSON on standard
// output: statuses published and seen written, the lag from a status's
// publish to the watch seeing it (p50, p99, max), API writes per second
// (from kube-apiserver's metrics), errors, and for each -bridge-pid its
// CPU (share of one core) and RSS over the run.
//
//	fleetsim -kubeconfig admin.kubeconfig -broker ssl://127.0.0.1:8883 \
//	    -ca-cert ca.crt -ca-key ca.key -nodes 2000 -pods 30 -duration 5m
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/outpost-edge/outpost/sync/kube"
	"github.com/outpost-edge/outpost/sync/mqtt"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// statusMark starts the message of every status fleetsim publishes;
// the sequence number follows it.
const statusMark = "fleetsim seq="

type config struct {
	kubeconfig, broker, caCert, caKey string
	nodes, pods                       int
	prefix, namespace                 string
	statusEvery, nodeStatusEvery      time.Duration
	duration, settle, connectSpread   time.Duration
	bridgePIDs                        []int
	keepPods                          bool
}

// Report is what fleetsim prints.
type Report struct {
	Nodes, Pods int
	// Seconds is how long statuses were published.
	Seconds float64
	// Published are the pod statuses published; Seen those the watch
	// saw written to the API server; Pending those not seen by the end.
	Published, Seen, Pending int
	// MessagesPerSecond are the messages the fleet published a second.
	MessagesPerSecond float64
	// APIWritesPerSecond are kube-apiserver's write requests a second
	// (POST, PUT, PATCH, DELETE, from every client) over the run.
	APIWritesPerSecond float64
	// Lag from a status's publish to the watch seeing it, milliseconds.
	LagP50, LagP99, LagMax float64
	// Errors are failed connects and publishes.
	Errors int
	// Bridges are the CPU and RSS of each -bridge-pid.
	Bridges []Usage `json:",omitempty"`
}

// Usage is a process's CPU over the run, as a share of one core, and
// its RSS at the end and at most (sampled each second), with the
// anonymous and file-backed parts of the largest sample.
type Usage struct {
	PID                 int
	CPU                 float64
	RSSMiB, MaxRSSMiB   float64
	AnonMiB, FileMiB    float64
	maxRSSKiB           int64
	startCPU, startTime float64
}

func main() {
	var c config
	var pids string
	flag.StringVar(&c.kubeconfig, "kubeconfig", "", "an admin kubeconfig of the API server")
	flag.StringVar(&c.broker, "broker", "", "the broker, ssl://HOST:PORT")
	flag.StringVar(&c.caCert, "ca-cert", "", "the broker's CA certificate (PEM): the broker's and the nodes' certificates")
	flag.StringVar(&c.caKey, "ca-key", "", "its private key, to issue each node's certificate")
	flag.IntVar(&c.nodes, "nodes", 100, "simulated nodes")
	flag.IntVar(&c.pods, "pods", 30, "pods per node")
	flag.StringVar(&c.prefix, "prefix", "sim-", "node names: PREFIX0000, PREFIX0001, …")
	flag.StringVar(&c.namespace, "namespace", "fleetsim", "namespace of the pods (made if missing)")
	flag.DurationVar(&c.statusEvery, "status-every", time.Minute, "each node changes one pod's status this often")
	flag.DurationVar(&c.nodeStatusEvery, "node-status-every", 5*time.Minute, "each node publishes its Node status this often")
	flag.DurationVar(&c.duration, "duration", 5*time.Minute, "how long statuses are published")
	flag.DurationVar(&c.settle, "settle", 30*time.Second, "how long to wait after -duration for the statuses not seen yet")
	flag.DurationVar(&c.connectSpread, "connect-spread", 10*time.Second, "the nodes connect spread over this")
	flag.StringVar(&pids, "bridge-pid", "", "comma-separated PIDs of bridges whose CPU and RSS to report")
	flag.BoolVar(&c.keepPods, "keep-pods", false, "keep the pods that exist (made by an earlier run) rather than failing")
	flag.Parse()
	for _, f := range strings.Split(pids, ",") {
		if f == "" {
			continue
		}
		pid, err := strconv.Atoi(f)
		if err != nil {
			fail(fmt.Errorf("-bridge-pid %q: %w", f, err))
		}
		c.bridgePIDs = append(c.bridgePIDs, pid)
	}
	if c.kubeconfig == "" || c.broker == "" || c.caCert == "" || c.caKey == "" {
		fail(errors.New("-kubeconfig, -broker, -ca-cert and -ca-key are required"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := run(ctx, c)
	if err != nil {
		fail(err)
	}
	out, _ := json.MarshalIndent(r, "", "  ")
	fmt.Println(string(out))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "fleetsim:", err)
	os.Exit(1)
}

// pending is a status published and not seen yet.
type pending struct {
	seq uint64
	at  time.Time
}

// fleet is the run's shared state.
type fleet struct {
	c      config
	client *kube.Client
	log    *slog.Logger
	uids   []types.UID // by node*pods+pod

	mu      sync.Mutex
	pending map[string]pending // by namespace/name
	lags    []time.Duration
	seen    int

	published, messages, errors atomic.Int64
	// measuring says pod statuses are published now.
	measuring atomic.Bool
}

func run(ctx context.Context, c config) (*Report, error) {
	rc, err := kube.LoadKubeconfig(c.kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = 500, 1000
	client, err := kube.NewClient(rc, "fleetsim")
	if err != nil {
		return nil, err
	}
	ca, err := env.LoadCA(c.caCert, c.caKey)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	f := &fleet{c: c, client: client, log: slog.New(slog.NewTextHandler(os.Stderr, nil)), pending: map[string]pending{}}
	f.log.Info("creating pods", "nodes", c.nodes, "pods", c.pods)
	if err := f.createPods(ctx); err != nil {
		return nil, err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watching := make(chan error, 1)
	go f.watch(watchCtx, watching)
	if err := <-watching; err != nil {
		return nil, err
	}

	f.log.Info("connecting nodes", "nodes", c.nodes)
	runCtx, stopNodes := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range c.nodes {
		name := fmt.Sprintf("%s%04d", c.prefix, i)
		certPEM, keyPEM, err := ca.Issue(pkix.Name{CommonName: name}, nil, nil, x509.ExtKeyUsageClientAuth)
		if err != nil {
			stopNodes()
			return nil, err
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			stopNodes()
			return nil, err
		}
		dial := mqtt.PahoDialer(mqtt.PahoConfig{
			Brokers: []string{c.broker}, ClientID: name, KeepAlive: 60 * time.Second,
			TLS: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		})
		delay := time.Duration(int64(c.connectSpread) * int64(i) / int64(max(1, c.nodes)))
		wg.Go(func() { f.node(runCtx, i, name, dial, delay) })
	}
	if err := f.waitNodes(ctx); err != nil {
		stopNodes()
		wg.Wait()
		return nil, err
	}

	// The measured run.
	f.log.Info("publishing statuses", "every", c.statusEvery, "for", c.duration)
	usage := make([]*Usage, len(c.bridgePIDs))
	for i, pid := range c.bridgePIDs {
		usage[i] = &Usage{PID: pid}
		usage[i].sample(true)
	}
	writes0, _ := f.apiWrites(ctx)
	f.mu.Lock()
	f.lags, f.seen = nil, 0
	f.mu.Unlock()
	f.published.Store(0)
	f.messages.Store(0)
	f.errors.Store(0)
	start := time.Now()
	f.measuring.Store(true)
	tick := time.NewTicker(time.Second)
	deadline := time.After(c.duration)
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-deadline:
			break loop
		case <-tick.C:
			for _, u := range usage {
				u.sample(false)
			}
		}
	}
	f.measuring.Store(false)
	elapsed := time.Since(start)
	writes1, _ := f.apiWrites(ctx)
	for _, u := range usage {
		u.sample(false)
		u.finish()
	}
	// What was published is seen, or not, within settle.
	settled := time.Now().Add(c.settle)
	for time.Now().Before(settled) && f.pendingCount() > 0 {
		time.Sleep(200 * time.Millisecond)
	}
	stopNodes()
	wg.Wait()
	stopWatch()

	f.mu.Lock()
	defer f.mu.Unlock()
	// When the statuses never seen were published, by 10 s of the run,
	// and a few of them: where to look in the bridges' logs.
	if len(f.pending) > 0 {
		buckets := map[int]int{}
		var some []string
		for key, pd := range f.pending {
			buckets[int(pd.at.Sub(start)/(10*time.Second))*10]++
			if len(some) < 10 {
				some = append(some, fmt.Sprintf("%s (seq %d at %s)", key, pd.seq, pd.at.UTC().Format("15:04:05.000")))
			}
		}
		for _, b := range slices.Sorted(maps.Keys(buckets)) {
			f.log.Info("statuses not seen, by when they were published", "second", b, "count", buckets[b])
		}
		f.log.Info("statuses not seen, some", "pods", strings.Join(some, ", "))
	}
	slices.Sort(f.lags)
	r := &Report{
		Nodes: c.nodes, Pods: c.nodes * c.pods, Seconds: elapsed.Seconds(),
		Published: int(f.published.Load()), Seen: f.seen, Pending: len(f.pending),
		MessagesPerSecond:  float64(f.messages.Load()) / elapsed.Seconds(),
		APIWritesPerSecond: (writes1 - writes0) / elapsed.Seconds(),
		LagP50:             ms(quantile(f.lags, 0.5)), LagP99: ms(quantile(f.lags, 0.99)), LagMax: ms(quantile(f.lags, 1)),
		Errors: int(f.errors.Load()),
	}
	for _, u := range usage {
		r.Bridges = append(r.Bridges, *u)
	}
	return r, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted)-1) + 0.5)
	return sorted[i]
}

func (f *fleet) pendingCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pending)
}

// createPods creates the fleet's pods, bound to its nodes, 32 at once,
// and keeps their UIDs.
func (f *fleet) createPods(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.c.namespace}}
	if err := f.client.Core.Post().Resource("namespaces").Body(ns).Do(ctx).Error(); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", f.c.namespace, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: f.c.namespace}}
	if err := f.client.Core.Post().Namespace(f.c.namespace).Resource("serviceaccounts").Body(sa).Do(ctx).Error(); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("service account: %w", err)
	}
	total := f.c.nodes * f.c.pods
	f.uids = make([]types.UID, total)
	jobs := make(chan int)
	errs := make(chan error, 32)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for k := range jobs {
				if err := f.createPod(ctx, k); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	for k := range total {
		jobs <- k
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func (f *fleet) podName(k int) (node, pod string) {
	return fmt.Sprintf("%s%04d", f.c.prefix, k/f.c.pods), fmt.Sprintf("%s%04d-%02d", f.c.prefix, k/f.c.pods, k%f.c.pods)
}

func (f *fleet) createPod(ctx context.Context, k int) error {
	node, name := f.podName(k)
	no := false
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.c.namespace, Labels: map[string]string{"app": "fleetsim"}},
		Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "main", Image: "busybox", Command: []string{"sleep", "infinity"}}}},
	}
	var got corev1.Pod
	err := f.client.Core.Post().Namespace(f.c.namespace).Resource("pods").Body(p).Do(ctx).Into(&got)
	if apierrors.IsAlreadyExists(err) && f.c.keepPods {
		err = f.client.Core.Get().Namespace(f.c.namespace).Resource("pods").Name(name).Do(ctx).Into(&got)
	}
	if err != nil {
		return fmt.Errorf("pod %s: %w", name, err)
	}
	f.uids[k] = got.UID
	return nil
}

// watch watches the fleet's pods and takes each status fleetsim
// published as seen when a newer or equal one shows. It reports on
// started once the watch is open.
func (f *fleet) watch(ctx context.Context, started chan<- error) {
	rv := ""
	first := true
	for ctx.Err() == nil {
		if rv == "" {
			var list corev1.PodList
			if err := f.client.Core.Get().Namespace(f.c.namespace).Resource("pods").
				VersionedParams(&metav1.ListOptions{ResourceVersion: "0"}, metav1.ParameterCodec).Do(ctx).Into(&list); err != nil {
				if first {
					started <- fmt.Errorf("list pods: %w", err)
					return
				}
				time.Sleep(time.Second)
				continue
			}
			rv = list.ResourceVersion
			if !first {
				// What was written while the watch was away is seen in the
				// list.
				f.log.Info("pods watch listed again", "resourceVersion", rv)
				now := time.Now()
				for i := range list.Items {
					f.sawStatus(&list.Items[i], now)
				}
			}
		}
		w, err := f.client.Core.Get().Namespace(f.c.namespace).Resource("pods").
			VersionedParams(&metav1.ListOptions{Watch: true, ResourceVersion: rv, AllowWatchBookmarks: true}, metav1.ParameterCodec).Watch(ctx)
		if err != nil {
			if first {
				started <- fmt.Errorf("watch pods: %w", err)
				return
			}
			time.Sleep(time.Second)
			continue
		}
		if first {
			started <- nil
			first = false
		}
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if ev.Type == watch.Error || !ok {
				f.log.Info("pods watch ended", "event", ev.Type, "object", fmt.Sprintf("%T", ev.Object))
				rv = ""
				break
			}
			rv = p.ResourceVersion
			if ev.Type == watch.Modified {
				f.sawStatus(p, time.Now())
			}
		}
		w.Stop()
	}
}

func (f *fleet) sawStatus(p *corev1.Pod, now time.Time) {
	rest, ok := strings.CutPrefix(p.Status.Message, statusMark)
	if !ok {
		return
	}
	seq, err := strconv.ParseUint(rest, 10, 64)
	if err != nil {
		return
	}
	key := p.Namespace + "/" + p.Name
	f.mu.Lock()
	defer f.mu.Unlock()
	pd, ok := f.pending[key]
	if !ok || seq < pd.seq {
		return
	}
	delete(f.pending, key)
	f.seen++
	f.lags = append(f.lags, now.Sub(pd.at))
}

// waitNodes waits until the bridge registered every node (its Node
// exists).
func (f *fleet) waitNodes(ctx context.Context) error {
	deadline := time.Now().Add(f.c.connectSpread + 5*time.Minute)
	for {
		var list corev1.NodeList
		err := f.client.Core.Get().Resource("nodes").Do(ctx).Into(&list)
		have := 0
		if err == nil {
			for _, n := range list.Items {
				if strings.HasPrefix(n.Name, f.c.prefix) {
					have++
				}
			}
		}
		if have >= f.c.nodes {
			f.log.Info("every node registered", "nodes", have)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d nodes registered by the bridge (%v)", have, f.c.nodes, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// node runs one simulated node until ctx ends: it connects (again after
// a lost connection), says it is online, publishes its Node status, and
// one pod status every statusEvery while the run is measured.
func (f *fleet) node(ctx context.Context, i int, name string, dial mqtt.Dialer, delay time.Duration) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(delay):
	}
	seq := uint64(time.Now().UnixMilli())
	next := 0
	var conn mqtt.Conn
	defer func() {
		if conn != nil {
			conn.Close(false)
		}
	}()
	publish := func(topic string, payload []byte) bool {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := conn.Publish(pctx, topic, true, payload); err != nil {
			if ctx.Err() == nil {
				f.errors.Add(1)
			}
			return false
		}
		f.messages.Add(1)
		return true
	}
	nodeStatus := func() bool {
		seq++
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "outpost.io/simulated": "true"}},
			Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "simulated by fleetsim"}}},
		}
		body, _ := n.Marshal()
		e := mqtt.Envelope{Kind: "Node", Generation: seq, Encoding: mqtt.EncodingProtobuf, Issued: time.Now(), Body: body}
		return publish(mqtt.NodeStatusTopic(name), e.Marshal())
	}
	// A random phase, so the fleet's statuses spread over the interval.
	statusTick := time.NewTicker(f.c.statusEvery)
	defer statusTick.Stop()
	phase := time.After(time.Duration(rand.Int64N(int64(f.c.statusEvery))))
	nodeTick := time.NewTicker(f.c.nodeStatusEvery)
	defer nodeTick.Stop()
	for ctx.Err() == nil {
		if conn == nil {
			c, err := dial(ctx, mqtt.Will{Topic: mqtt.OnlineTopic(name), Payload: []byte(mqtt.OnlineFalse), Retained: true}, func(m mqtt.Message) {
				if m.Ack != nil {
					m.Ack()
				}
			})
			if err != nil {
				if ctx.Err() == nil {
					f.errors.Add(1)
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
				continue
			}
			conn = c
			if !nodeStatus() || !publish(mqtt.OnlineTopic(name), []byte(mqtt.OnlineTrue)) {
				conn.Close(false)
				conn = nil
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-conn.Done():
			conn = nil
			continue
		case <-nodeTick.C:
			nodeStatus()
		case <-phase:
			phase = nil
			f.podStatus(i, &next, &seq, publish)
		case <-statusTick.C:
			if phase == nil {
				f.podStatus(i, &next, &seq, publish)
			}
		}
	}
}

// podStatus publishes the status of the node's next pod, while the run
// is measured.
func (f *fleet) podStatus(i int, next *int, seq *uint64, publish func(string, []byte) bool) {
	if !f.measuring.Load() || f.c.pods == 0 {
		return
	}
	k := i*f.c.pods + *next
	*next = (*next + 1) % f.c.pods
	node, name := f.podName(k)
	*seq++
	ready := corev1.ConditionTrue
	if *seq%2 == 0 {
		ready = corev1.ConditionFalse
	}
	now := time.Now()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.c.namespace, Name: name, UID: f.uids[k]},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, Message: statusMark + strconv.FormatUint(*seq, 10), HostIP: "10.0.0.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready, LastTransitionTime: metav1.NewTime(now)}},
		},
	}
	body, _ := p.Marshal()
	e := mqtt.Envelope{Kind: "Pod", Generation: *seq, Encoding: mqtt.EncodingProtobuf, Issued: now, Body: body}
	f.mu.Lock()
	f.pending[f.c.namespace+"/"+name] = pending{seq: *seq, at: now}
	f.mu.Unlock()
	if publish(mqtt.PodStatusTopic(node, f.c.namespace, name), e.Marshal()) {
		f.published.Add(1)
	}
}

// apiWrites is kube-apiserver's count of write requests so far.
func (f *fleet) apiWrites(ctx context.Context) (float64, error) {
	raw, err := f.client.Core.Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	var sum float64
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		verbOK := false
		for _, v := range []string{`verb="POST"`, `verb="PUT"`, `verb="PATCH"`, `verb="DELETE"`, `verb="APPLY"`} {
			if strings.Contains(line, v) {
				verbOK = true
			}
		}
		if !verbOK {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			sum += v
		}
	}
	return sum, sc.Err()
}

// sample reads the process's CPU time and RSS; start marks the run's
// beginning.
func (u *Usage) sample(start bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", u.PID))
	if err != nil {
		return
	}
	// Fields after the command (which may hold spaces): utime is the
	// 14th field of the line, stime the 15th.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	cpu := (utime + stime) / 100 // USER_HZ
	now := float64(time.Now().UnixNano()) / 1e9
	if start {
		u.startCPU, u.startTime = cpu, now
	} else if now > u.startTime {
		u.CPU = (cpu - u.startCPU) / (now - u.startTime)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", u.PID))
	if err != nil {
		return
	}
	kib := map[string]int64{}
	for _, l := range strings.Split(string(status), "\n") {
		name, rest, ok := strings.Cut(l, ":")
		if ok && (name == "VmRSS" || name == "RssAnon" || name == "RssFile") {
			kib[name], _ = strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		}
	}
	u.RSSMiB = float64(kib["VmRSS"]) / 1024
	if kib["VmRSS"] > u.maxRSSKiB {
		u.maxRSSKiB = kib["VmRSS"]
		u.AnonMiB, u.FileMiB = float64(kib["RssAnon"])/1024, float64(kib["RssFile"])/1024
	}
}

func (u *Usage) finish() { u.MaxRSSMiB = float64(u.maxRSSKiB) / 1024 }
