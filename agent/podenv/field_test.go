package podenv

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestResourceFieldRefValue(t *testing.T) {
	q := resource.MustParse
	alloc := corev1.ResourceList{corev1.ResourceCPU: q("4"), corev1.ResourceMemory: q("2Gi")}
	tests := []struct {
		name     string
		limits   corev1.ResourceList
		requests corev1.ResourceList
		podLimit corev1.ResourceList
		resource string
		divisor  string
		want     string
		wantErr  string
	}{
		{name: "cpu rounds up to whole cores", limits: corev1.ResourceList{corev1.ResourceCPU: q("1001m")}, resource: "limits.cpu", want: "2"},
		{name: "cpu in millicores", limits: corev1.ResourceList{corev1.ResourceCPU: q("1001m")}, resource: "limits.cpu", divisor: "1m", want: "1001"},
		{name: "memory rounds up", limits: corev1.ResourceList{corev1.ResourceMemory: q("1025Ki")}, resource: "limits.memory", divisor: "1Mi", want: "2"},
		{name: "request unset takes the limit", limits: corev1.ResourceList{corev1.ResourceCPU: q("500m")}, resource: "requests.cpu", divisor: "1m", want: "500"},
		{name: "request unset without limit is zero", resource: "requests.memory", want: "0"},
		{name: "zero limit falls back to allocatable", limits: corev1.ResourceList{corev1.ResourceCPU: q("0")}, resource: "limits.cpu", want: "4"},
		{name: "pod-level limit before allocatable", podLimit: corev1.ResourceList{corev1.ResourceMemory: q("512Mi")}, resource: "limits.memory", divisor: "1Mi", want: "512"},
		{name: "no allocatable for ephemeral storage", resource: "limits.ephemeral-storage", want: "0"},
		{name: "hugepages", limits: corev1.ResourceList{"hugepages-2Mi": q("4Mi")}, resource: "limits.hugepages-2Mi", divisor: "2Mi", want: "2"},
		{name: "negative divisor", resource: "limits.cpu", divisor: "-1", wantErr: "must be positive"},
		{name: "unknown prefix", resource: "status.cpu", wantErr: "unsupported resource"},
		{name: "no dot", resource: "cpu", wantErr: "unsupported resource"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := testPod()
			c := &corev1.Container{Name: "x", Resources: corev1.ResourceRequirements{Limits: tt.limits, Requests: tt.requests}}
			if tt.podLimit != nil {
				pod.Spec.Resources = &corev1.ResourceRequirements{Limits: tt.podLimit}
			}
			fs := &corev1.ResourceFieldSelector{Resource: tt.resource}
			if tt.divisor != "" {
				fs.Divisor = q(tt.divisor)
			}
			got, err := ResourceFieldRefValue(pod, c, fs, alloc)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %q, %v; want error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestResourceFieldRefValueNeedsContainer(t *testing.T) {
	_, err := ResourceFieldRefValue(testPod(), nil, &corev1.ResourceFieldSelector{Resource: "limits.cpu"}, nil)
	if err == nil || !strings.Contains(err.Error(), "containerName is required") {
		t.Fatalf("err = %v", err)
	}
}

func TestCeilDiv(t *testing.T) {
	for _, c := range [][3]int64{{0, 3, 0}, {1, 3, 1}, {3, 3, 1}, {4, 3, 2}, {-4, 3, -1}, {1<<63 - 1, 1, 1<<63 - 1}, {1<<63 - 1, 2, 1 << 62}} {
		if got := ceilDiv(c[0], c[1]); got != c[2] {
			t.Errorf("ceilDiv(%d, %d) = %d, want %d", c[0], c[1], got, c[2])
		}
	}
}
