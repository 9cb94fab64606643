package store

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// typicalPod is a pod as the API server hands one to a node: labels,
// owner, two containers with env, probes, resources and volumes.
func typicalPod() *corev1.Pod {
	grace := int64(30)
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "sensor-gateway-7d9f8c6b5-x2kqz", Namespace: "field", UID: "5f0c1e52-3a8b-4f7e-9c1d-2b6a8e4f0d13",
			ResourceVersion: "48213", Labels: map[string]string{"app": "sensor-gateway", "pod-template-hash": "7d9f8c6b5"},
			Annotations:     map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "9100"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "sensor-gateway-7d9f8c6b5", UID: "b7e1"}},
		},
		Spec: corev1.PodSpec{
			NodeName: "pi-field-017", RestartPolicy: corev1.RestartPolicyAlways, DNSPolicy: corev1.DNSClusterFirst,
			TerminationGracePeriodSeconds: &grace, ServiceAccountName: "default",
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "gateway-config"}}}},
				{Name: "data", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/sensors"}}},
			},
			Containers: []corev1.Container{
				{
					Name: "gateway", Image: "registry.local/field/sensor-gateway:1.4.2", Args: []string{"--listen=:8080", "--upstream=mqtt://broker:1883"},
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
					Env:   []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}, {Name: "LOG_LEVEL", Value: "info"}},
					Resources: corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
						Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
					},
					VolumeMounts:    []corev1.VolumeMount{{Name: "config", MountPath: "/etc/gateway"}, {Name: "data", MountPath: "/data"}},
					LivenessProbe:   &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}, PeriodSeconds: 10},
					ReadinessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}}, PeriodSeconds: 5},
					ImagePullPolicy: corev1.PullIfNotPresent, TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				},
				{Name: "exporter", Image: "registry.local/field/node-exporter:1.8.0", Ports: []corev1.ContainerPort{{ContainerPort: 9100}}},
			},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.42.0.17", HostIP: "192.0.2.17", QOSClass: corev1.PodQOSBurstable},
	}
}

// BenchmarkCodec compares the two candidate value encodings of a typical
// pod; the reported bytes metric is the encoded size.
func BenchmarkCodec(b *testing.B) {
	p := typicalPod()
	pb, _ := p.Marshal()
	js, _ := json.Marshal(p)
	b.Run("protobuf/encode", func(b *testing.B) {
		for b.Loop() {
			if _, err := p.Marshal(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(pb)), "bytes")
	})
	b.Run("json/encode", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(p); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(js)), "bytes")
	})
	b.Run("protobuf/decode", func(b *testing.B) {
		for b.Loop() {
			var q corev1.Pod
			if err := q.Unmarshal(pb); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json/decode", func(b *testing.B) {
		for b.Loop() {
			var q corev1.Pod
			if err := json.Unmarshal(js, &q); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func benchStore(b *testing.B) *Store { return benchStoreOpts(b, Options{}) }

func benchStoreOpts(b *testing.B, opts Options) *Store {
	dir := os.Getenv("OUTPOST_BENCH_DIR") // a disk, not tmpfs, for write bytes
	if dir == "" {
		dir = b.TempDir()
	} else {
		var err error
		if dir, err = os.MkdirTemp(dir, "bench"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
	}
	s, err := Open(filepath.Join(dir, FileName), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// BenchmarkPutPod measures batched desired-pod writes from 16 writers.
func BenchmarkPutPod(b *testing.B) {
	s := benchStore(b)
	p := typicalPod()
	b.SetParallelism(8)
	var n atomicCounter
	b.RunParallel(func(pb *testing.PB) {
		q := p.DeepCopy()
		for pb.Next() {
			q.Name = "pod-" + strconv.Itoa(n.next()%500)
			q.ResourceVersion = strconv.Itoa(n.next())
			if err := s.Pods().Put(SourceAPI, q); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
}

// BenchmarkJournalAppend measures batched journal appends over 100 objects
// and the bytes written to disk per 1,000 appends (/proc/self/io).
func BenchmarkJournalAppend(b *testing.B) {
	s := benchStore(b)
	st, _ := typicalPod().Status.Marshal()
	before := writeBytes()
	b.SetParallelism(8)
	var n atomicCounter
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Append(fmt.Sprintf("pod/field/p%d", n.next()%100), st); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
	if w := writeBytes() - before; w > 0 {
		b.ReportMetric(float64(w)/float64(b.N)*1000, "diskbytes/1k-appends")
	}
}

func writeBytes() int64 {
	f, err := os.Open("/proc/self/io")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "write_bytes: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// BenchmarkJournalAppendSerial is one writer appending: every append is its
// own transaction and fsync, the worst case for an SD card. Scratch is the
// same on a scratch store (Options.Scratch, the bridge's per node): no
// fsync, and no wait for other writers to share one.
func BenchmarkJournalAppendSerial(b *testing.B) {
	b.Run("synced", func(b *testing.B) { benchAppendSerial(b, benchStore(b)) })
	b.Run("scratch", func(b *testing.B) { benchAppendSerial(b, benchStoreOpts(b, Options{Scratch: true})) })
}

func benchAppendSerial(b *testing.B, s *Store) {
	st, _ := typicalPod().Status.Marshal()
	before := writeBytes()
	i := 0
	for b.Loop() {
		if _, err := s.Append(fmt.Sprintf("pod/field/p%d", i%100), st); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
	if w := writeBytes() - before; w > 0 {
		b.ReportMetric(float64(w)/float64(b.N)*1000, "diskbytes/1k-appends")
	}
}
