package volume

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
)

func TestMounts(t *testing.T) {
	data := t.TempDir()
	cfg := t.TempDir()
	vols := map[string]Volume{
		"data":   {Path: data, Kind: KindEmptyDir},
		"config": {Path: cfg, Kind: KindConfigMap, ReadOnly: true},
	}
	pod := testPod()
	c := &corev1.Container{Name: "app", VolumeMounts: []corev1.VolumeMount{
		{Name: "data", MountPath: "/var/lib/app"},
		{Name: "data", MountPath: "/ro", ReadOnly: true},
		{Name: "config", MountPath: "/etc/app"},
		{Name: "data", MountPath: "relative/dir", MountPropagation: ptr(corev1.MountPropagationNone), BindMountOptions: []string{"noexec"}},
	}}
	got, err := Mounts(pod, c, vols)
	if err != nil {
		t.Fatal(err)
	}
	want := []specs.Mount{
		{Destination: "/var/lib/app", Type: "bind", Source: data, Options: []string{"rbind", "rprivate", "rw"}},
		{Destination: "/ro", Type: "bind", Source: data, Options: []string{"rbind", "rprivate", "ro"}},
		{Destination: "/etc/app", Type: "bind", Source: cfg, Options: []string{"rbind", "rprivate", "ro"}},
		{Destination: "/relative/dir", Type: "bind", Source: data, Options: []string{"rbind", "rprivate", "rw", "noexec"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Mounts =\n  %+v\nwant\n  %+v", got, want)
	}
}

func TestMountsErrors(t *testing.T) {
	vols := map[string]Volume{"data": {Path: t.TempDir(), Kind: KindEmptyDir}}
	tests := []struct {
		name string
		vm   corev1.VolumeMount
		want string
	}{
		{"unknown volume", corev1.VolumeMount{Name: "cache", MountPath: "/cache"},
			`pod default/web: container "app": volumeMount "cache" at "/cache": no volume "cache" in the pod`},
		{"propagation", corev1.VolumeMount{Name: "data", MountPath: "/d", MountPropagation: ptr(corev1.MountPropagationBidirectional)},
			`mountPropagation Bidirectional is not supported (only None)`},
		{"empty mountPath", corev1.VolumeMount{Name: "data"}, `mountPath must name a directory below /`},
		{"mountPath /", corev1.VolumeMount{Name: "data", MountPath: "/x/.."}, `mountPath must name a directory below /`},
		{"subPath and subPathExpr", corev1.VolumeMount{Name: "data", MountPath: "/d", SubPath: "a", SubPathExpr: "b"}, `mutually exclusive`},
		{"bad bind option", corev1.VolumeMount{Name: "data", MountPath: "/d", BindMountOptions: []string{"suid"}}, `bindMountOptions: "suid"`},
		{"subPathExpr missing var", corev1.VolumeMount{Name: "data", MountPath: "/d", SubPathExpr: "$(POD)/$(NOPE)/$(EMPTY)"},
			`subPathExpr "$(POD)/$(NOPE)/$(EMPTY)": missing value for EMPTY, NOPE`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &corev1.Container{Name: "app", VolumeMounts: []corev1.VolumeMount{tt.vm}}
			_, err := MountsWithEnv(testPod(), c, vols, []string{"POD=web", "EMPTY="})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestSubPath(t *testing.T) {
	vol, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	mustMkdir(t, filepath.Join(vol, "logs"), 0o750)
	if err := os.WriteFile(filepath.Join(vol, "logs", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"in-abs":     filepath.Join(vol, "logs"),
		"in-rel":     "logs",
		"out-abs":    outside,
		"out-rel":    "../../../../../../../../etc",
		"out-bounce": filepath.Join(vol, "..", filepath.Base(vol), "logs", "..", "..", filepath.Base(outside)),
		"dangling":   "nowhere",
		"etc-passwd": "/etc/passwd",
	} {
		if err := os.Symlink(target, filepath.Join(vol, link)); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		sub     string
		want    string // relative to vol
		wantErr string
	}{
		{sub: "logs", want: "logs"},
		{sub: "logs/f", want: "logs/f"},
		{sub: "./logs//f", want: "logs/f"},
		{sub: "new/deeper", want: "new/deeper"},
		{sub: "in-abs/f", want: "logs/f"},
		{sub: "in-rel", want: "logs"},
		{sub: "../x", wantErr: `must not contain ".."`},
		{sub: "logs/../../x", wantErr: `must not contain ".."`},
		{sub: "/etc", wantErr: "must be a relative path"},
		{sub: "out-abs", wantErr: "leads out of the volume"},
		{sub: "out-abs/x", wantErr: "leads out of the volume"},
		{sub: "out-rel", wantErr: "leads out of the volume"},
		{sub: "out-bounce", wantErr: "leads out of the volume"},
		{sub: "etc-passwd", wantErr: "leads out of the volume"},
		{sub: "dangling", wantErr: "does not resolve"},
		{sub: "logs/f/x", wantErr: "is not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.sub, func(t *testing.T) {
			got, err := resolveSubPath(vol, tt.sub)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("resolveSubPath(%q) = %q, %v; want error containing %q", tt.sub, got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(vol, tt.want); got != want {
				t.Errorf("resolveSubPath(%q) = %q, want %q", tt.sub, got, want)
			}
		})
	}
	if m := mode(t, filepath.Join(vol, "new")); m.Perm() != mode(t, vol).Perm() {
		t.Errorf("created subPath dir mode %v, want the volume's %v", m, mode(t, vol))
	}
	if _, err := os.Stat(filepath.Join(outside, "x")); err == nil {
		t.Error("a rejected subPath created a directory outside the volume")
	}
}

func TestMountsSubPathEscapeRejected(t *testing.T) {
	vol := t.TempDir()
	if err := os.Symlink("/etc", filepath.Join(vol, "etc")); err != nil {
		t.Fatal(err)
	}
	c := &corev1.Container{Name: "app", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/d", SubPath: "etc"}}}
	_, err := Mounts(testPod(), c, map[string]Volume{"data": {Path: vol, Kind: KindEmptyDir}})
	want := `pod default/web: container "app": volumeMount "data" at "/d": subPath "etc": symlink`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("err = %v, want prefix %q", err, want)
	}
}

func TestMountsSubPathExpr(t *testing.T) {
	vol, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := &corev1.Container{Name: "app", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/logs", SubPathExpr: "pods/$(POD_NAME)"}}}
	got, err := MountsWithEnv(testPod(), c, map[string]Volume{"data": {Path: vol, Kind: KindEmptyDir}}, []string{"POD_NAME=web-1"})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(vol, "pods", "web-1"); len(got) != 1 || got[0].Source != want {
		t.Fatalf("Mounts = %+v, want source %s", got, want)
	}
}

// TestMountsSubPathOfConfigMapKey mounts one key of a content volume: the
// source is the file inside the current data dir, which is in the volume.
func TestMountsSubPathOfConfigMapKey(t *testing.T) {
	e := newEnv(t)
	e.putConfigMap(t, "app", map[string]string{"app.conf": "v1"})
	pod := testPod(cmVolume("config", "app"))
	vols, err := e.m.Setup(t.Context(), pod, PodInfo{})
	if err != nil {
		t.Fatal(err)
	}
	c := &corev1.Container{Name: "app", VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app.conf", SubPath: "app.conf"}}}
	got, err := Mounts(pod, c, vols)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.Readlink(filepath.Join(vols["config"].Path, "..data"))
	real, _ := filepath.EvalSymlinks(vols["config"].Path)
	if want := filepath.Join(real, data, "app.conf"); got[0].Source != want || !slices.Contains(got[0].Options, "ro") {
		t.Fatalf("mount %+v, want read-only source %s", got[0], want)
	}
}

func mustMkdir(t *testing.T, p string, m os.FileMode) {
	t.Helper()
	if err := os.Mkdir(p, m); err != nil {
		t.Fatal(err)
	}
}

func TestMountPoints(t *testing.T) {
	info := `22 1 0:21 / /proc rw,nosuid - proc proc rw
100 22 0:50 / /var/lib/outpost/pods/u1/volumes/secret/s rw - tmpfs tmpfs rw
101 22 0:51 / /var/lib/outpost/pods/u1/volumes/emptyDir/with\040space rw - tmpfs tmpfs rw,size=1024k
102 22 0:52 / /var/lib/outpost/pods/u10/volumes/emptyDir/x rw - tmpfs tmpfs rw
103 22 0:53 / /var/lib/outpost/pods/u1 rw - tmpfs tmpfs rw
short line
`
	got, err := mountPoints(strings.NewReader(info), "/var/lib/outpost/pods/u1")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"/var/lib/outpost/pods/u1/volumes/secret/s",
		"/var/lib/outpost/pods/u1/volumes/emptyDir/with space",
		"/var/lib/outpost/pods/u1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("mountPoints = %q, want %q", got, want)
	}
}

func TestUnescapeMountPath(t *testing.T) {
	for in, want := range map[string]string{
		`/a\040b`:    "/a b",
		`/a\011b`:    "/a\tb",
		`/a\134b`:    `/a\b`,
		`/a\012`:     "/a\n",
		`/a\04`:      `/a\04`,
		`/a\999`:     `/a\999`,
		`/plain`:     "/plain",
		`\`:          `\`,
		`/x\040\040`: "/x  ",
	} {
		if got := unescapeMountPath(in); got != want {
			t.Errorf("unescapeMountPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzMountPoints(f *testing.F) {
	f.Add("100 22 0:50 / /a/b\\040c rw - tmpfs tmpfs rw\n", "/a")
	f.Add("1 2 3 4 \\", "/")
	f.Fuzz(func(t *testing.T, info, dir string) {
		mps, err := mountPoints(strings.NewReader(info), dir)
		if err != nil {
			return
		}
		for _, mp := range mps {
			if dir != "/" && mp != dir && !strings.HasPrefix(mp, dir+"/") {
				t.Fatalf("mount point %q is not below %q", mp, dir)
			}
		}
	})
}

func FuzzCheckSubPath(f *testing.F) {
	for _, s := range []string{"a", "a/b", "../a", "/a", "a/..", "..a", "a/./b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sub string) {
		if checkSubPath(sub) != nil {
			return
		}
		// What passes stays inside any base once joined and cleaned.
		base := "/base/vol"
		if j := filepath.Join(base, sub); !within(base, j) {
			t.Fatalf("subPath %q passed but joins to %q", sub, j)
		}
	})
}
