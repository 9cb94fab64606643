package mqtt

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// benchEnvelope is a pod's desired envelope of about the size a
// typical pod has (one container, a probe, a volume).
func benchEnvelope(b *testing.B) (string, Envelope) {
	b.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "5b1c2d9e-1f0a-4c5e-9d1e-1234567890ab", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "pi-007", Containers: []corev1.Container{{
			Name: "main", Image: "registry.example/web:1.2.3", Command: []string{"/bin/web", "--listen", ":8080"},
			Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			ReadinessProbe: &corev1.Probe{PeriodSeconds: 10, ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-f", "/tmp/ready"}}}},
			VolumeMounts:   []corev1.VolumeMount{{Name: "cfg", MountPath: "/cfg"}},
		}}, Volumes: []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "web"}}}}}},
	}
	body, err := p.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	return DesiredTopic("pi-007", KindPods, "default", "web"), Envelope{Kind: "Pod", Generation: 1796352916284, Encoding: EncodingProtobuf, Issued: time.Unix(1796352916, 0), Body: body}
}

// BenchmarkVerify is what a node pays per signed desired envelope it
// takes: decoding it and checking its signature (Ed25519ph over the
// topic and the envelope). It reports the bytes a signature adds.
func BenchmarkVerify(b *testing.B) {
	topic, e := benchEnvelope(b)
	key, err := GenerateKey()
	if err != nil {
		b.Fatal(err)
	}
	s := NewSigner(key)
	signed, plain := s.Seal(topic, e), e.Marshal()
	ring := NewKeyring(s.Public())
	b.ResetTimer()
	for range b.N {
		d, err := UnmarshalEnvelope(signed)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ring.Verify(topic, signed, d); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(signed)-len(plain)), "bytes-added")
	b.ReportMetric(float64(len(plain)), "envelope-bytes")
}

// BenchmarkSign is what the bridge pays per desired envelope it signs.
func BenchmarkSign(b *testing.B) {
	topic, e := benchEnvelope(b)
	key, err := GenerateKey()
	if err != nil {
		b.Fatal(err)
	}
	s := NewSigner(key)
	b.ResetTimer()
	for range b.N {
		s.Seal(topic, e)
	}
}
