package staticpods

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// Validate checks a pod of any source with the manifest checks plus what
// this node cannot provide, naming each bad field on one line.
func TestValidate(t *testing.T) {
	vol := func(name string, src corev1.VolumeSource) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: src}
	}
	tests := []struct {
		name    string
		volumes []corev1.Volume
		image   string
		want    string // "" for a good pod
	}{
		{name: "good, every supported volume", volumes: []corev1.Volume{
			vol("a", corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/x"}}),
			vol("b", corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}),
			vol("c", corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}),
			vol("d", corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s"}}),
			vol("e", corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{}}),
			vol("f", corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ConfigMap: &corev1.ConfigMapProjection{}}, {Secret: &corev1.SecretProjection{}}, {DownwardAPI: &corev1.DownwardAPIProjection{}},
			}}}),
		}},
		// Left to agent/volume: every pod of a real cluster has one.
		{name: "service account token", volumes: []corev1.Volume{
			vol("kube-api-access-x", corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
			}}}),
		}},
		{name: "persistent volume claim", volumes: []corev1.Volume{
			vol("ok", corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}),
			vol("data", corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}),
		}, want: "spec.volumes[1].persistentVolumeClaim: persistentVolumeClaim volumes are not supported on this node"},
		{name: "huge pages", volumes: []corev1.Volume{
			vol("hp", corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumHugePages}}),
		}, want: `spec.volumes[0].emptyDir.medium: "HugePages" is not supported on this node (only "" or Memory)`},
		{name: "cluster trust bundle", volumes: []corev1.Volume{
			vol("ctb", corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ConfigMap: &corev1.ConfigMapProjection{}}, {ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{Path: "b"}},
			}}}),
		}, want: "spec.volumes[0].projected.sources[1].clusterTrustBundle: this projection is not supported on this node"},
		{name: "several fields, in order", image: " ", volumes: []corev1.Volume{
			vol("x", corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{}}),
		}, want: "spec.volumes[0].nfs: nfs volumes are not supported on this node; spec.containers[0].image: is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			image := tt.image
			if image == "" {
				image = "busybox:1"
			}
			p := &corev1.Pod{Spec: corev1.PodSpec{Volumes: tt.volumes, Containers: []corev1.Container{{Name: "c", Image: image}}}}
			err := Validate(p)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Fatalf("Validate = %q\nwant       %q", got, tt.want)
			}
		})
	}
}

// A manifest's pod with a volume this node cannot provide is recorded as
// invalid, with the field's line.
func TestParseMarksUnsupportedVolumeInvalid(t *testing.T) {
	m := Parse("pvc.yaml", []byte(`apiVersion: v1
kind: Pod
metadata: {name: db}
spec:
  volumes:
  - name: data
    persistentVolumeClaim: {claimName: c}
  containers: [{name: c, image: busybox:1}]
`), "n")
	if len(m.Pods) != 1 {
		t.Fatalf("pods %d, errors %v", len(m.Pods), m.Errors)
	}
	msg, bad := Invalid(m.Pods[0])
	if want := "spec.volumes[0].persistentVolumeClaim: persistentVolumeClaim volumes are not supported on this node (line 7)"; !bad || msg != want {
		t.Fatalf("Invalid = %v %q, want %q", bad, msg, want)
	}
}
