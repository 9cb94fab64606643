package volume

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/store"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func ptr[T any](v T) *T { return &v }

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: mounting tmpfs needs root")
	}
}

type env struct {
	m       *Manager
	st      *store.Store
	clock   *clocktest.Fake
	podsDir string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clocktest.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	podsDir := filepath.Join(t.TempDir(), "pods")
	m, err := New(Config{PodsDir: podsDir}, Deps{Store: st, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{m: m, st: st, clock: clk, podsDir: podsDir}
	// Never leave a tmpfs behind, whatever the test did.
	t.Cleanup(func() {
		if real, err := filepath.EvalSymlinks(podsDir); err == nil {
			_ = unmountBelow(real)
		}
	})
	return e
}

func (e *env) putConfigMap(t *testing.T, name string, data map[string]string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Data: data}
	if err := e.st.ConfigMaps().Put(store.SourceAPI, cm); err != nil {
		t.Fatal(err)
	}
}

func (e *env) putSecret(t *testing.T, name string, data map[string][]byte) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Data: data}
	if err := e.st.Secrets().Put(store.SourceAPI, s); err != nil {
		t.Fatal(err)
	}
}

func testPod(vols ...corev1.Volume) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web", Namespace: "default", UID: "0c6e5b2e-uid",
			Labels:      map[string]string{"app": "web", "tier": "front"},
			Annotations: map[string]string{"note": "hi"},
		},
		Spec: corev1.PodSpec{
			Volumes: vols,
			Containers: []corev1.Container{{Name: "app", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
			}}},
		},
	}
}

func cmVolume(name, cm string, items ...corev1.KeyToPath) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: cm}, Items: items}}}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mode(t *testing.T, p string) fs.FileMode {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode()
}

// mountedAt returns the mountinfo entries for exactly p.
func mountedAt(t *testing.T, p string) int {
	t.Helper()
	mps, err := readMountPoints(p)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mp := range mps {
		if mp == p {
			n++
		}
	}
	return n
}

// checkVisible checks that name in a content volume is a symlink into
// ..data/ and holds want.
func checkVisible(t *testing.T, dir, name, want string) {
	t.Helper()
	top, _, _ := strings.Cut(name, "/")
	target, err := os.Readlink(filepath.Join(dir, top))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if target != "..data/"+top {
		t.Errorf("%s -> %q, want ..data/%s", name, target, top)
	}
	if got := readFile(t, filepath.Join(dir, name)); got != want {
		t.Errorf("%s = %q, want %q", name, got, want)
	}
}

func TestSetupEveryKind(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	e.putConfigMap(t, "app", map[string]string{"app.conf": "port=80", "other": "x"})
	e.putSecret(t, "db", map[string][]byte{"password": {0, 1, 2, 's'}})
	host := t.TempDir()
	pod := testPod(
		corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: host, Type: ptr(corev1.HostPathDirectory)}}},
		cmVolume("config", "app", corev1.KeyToPath{Key: "app.conf", Path: "etc/app.conf", Mode: ptr(int32(0o600))}),
		corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "db", DefaultMode: ptr(int32(0o400))}}},
		corev1.Volume{Name: "info", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
			{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}},
			{Path: "ns", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}},
			{Path: "uid", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}},
			{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
			{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations"}},
			{Path: "mem", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "app", Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}},
			{Path: "cpu", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "app", Resource: "limits.cpu", Divisor: resource.MustParse("1m")}},
		}}}},
		corev1.Volume{Name: "all", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "app"}, Items: []corev1.KeyToPath{{Key: "other", Path: "cm/other"}}}},
			{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "db"}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "podname", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}},
		}}}},
	)
	info := PodInfo{NodeAllocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}
	vols, err := e.m.Setup(context.Background(), pod, info)
	if err != nil {
		t.Fatal(err)
	}
	podDir := filepath.Join(e.podsDir, string(pod.UID), "volumes")
	want := map[string]Volume{
		"scratch": {Path: filepath.Join(podDir, "emptyDir", "scratch"), Kind: KindEmptyDir},
		"host":    {Path: host, Kind: KindHostPath},
		"config":  {Path: filepath.Join(podDir, "configMap", "config"), Kind: KindConfigMap, ReadOnly: true},
		"creds":   {Path: filepath.Join(podDir, "secret", "creds"), Kind: KindSecret, ReadOnly: true},
		"info":    {Path: filepath.Join(podDir, "downwardAPI", "info"), Kind: KindDownwardAPI, ReadOnly: true},
		"all":     {Path: filepath.Join(podDir, "projected", "all"), Kind: KindProjected, ReadOnly: true},
	}
	for name, w := range want {
		if vols[name] != w {
			t.Errorf("volume %s = %+v, want %+v", name, vols[name], w)
		}
	}
	if len(vols) != len(want) {
		t.Errorf("got %d volumes, want %d", len(vols), len(want))
	}

	if m := mode(t, vols["scratch"].Path); m.Perm() != 0o777 || !m.IsDir() {
		t.Errorf("emptyDir mode %v, want drwxrwxrwx", m)
	}

	cfg := vols["config"].Path
	checkVisible(t, cfg, "etc/app.conf", "port=80")
	if m := mode(t, filepath.Join(cfg, "etc/app.conf")); m.Perm() != 0o600 {
		t.Errorf("item mode %v, want 0600", m)
	}
	if _, err := os.Lstat(filepath.Join(cfg, "other")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("key not in items was written: %v", err)
	}

	creds := vols["creds"].Path
	checkVisible(t, creds, "password", "\x00\x01\x02s")
	if m := mode(t, filepath.Join(creds, "password")); m.Perm() != 0o400 {
		t.Errorf("secret mode %v, want 0400", m)
	}
	if mountedAt(t, creds) != 1 {
		t.Errorf("secret volume is not on its own tmpfs")
	}

	info2 := vols["info"].Path
	checkVisible(t, info2, "name", "web")
	checkVisible(t, info2, "ns", "default")
	checkVisible(t, info2, "uid", "0c6e5b2e-uid")
	checkVisible(t, info2, "labels", "app=\"web\"\ntier=\"front\"")
	checkVisible(t, info2, "annotations", `note="hi"`)
	checkVisible(t, info2, "mem", "64")
	checkVisible(t, info2, "cpu", "2000") // no limit: node allocatable
	if m := mode(t, filepath.Join(info2, "name")); m.Perm() != 0o644 {
		t.Errorf("downwardAPI default mode %v, want 0644", m)
	}

	all := vols["all"].Path
	checkVisible(t, all, "cm/other", "x")
	checkVisible(t, all, "password", "\x00\x01\x02s")
	checkVisible(t, all, "podname", "web")
	if mountedAt(t, all) != 1 {
		t.Errorf("projected volume is not on its own tmpfs")
	}

	// Setup again changes nothing and mounts nothing twice.
	before, _ := os.Readlink(filepath.Join(cfg, "..data"))
	if _, err := e.m.Setup(context.Background(), pod, info); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Readlink(filepath.Join(cfg, "..data")); after != before {
		t.Errorf("unchanged configMap rewritten: ..data %s -> %s", before, after)
	}
	if mountedAt(t, creds) != 1 || mountedAt(t, all) != 1 {
		t.Errorf("second Setup mounted tmpfs again")
	}
}

func TestSetupMissingConfigMap(t *testing.T) {
	e := newEnv(t)
	e.putConfigMap(t, "app", map[string]string{"a": "1"})
	tests := []struct {
		name    string
		vol     corev1.Volume
		want    *MissingError
		wantMsg string
	}{
		{
			name:    "missing configMap",
			vol:     cmVolume("config", "app-config"),
			want:    &MissingError{Pod: "default/web", Volume: "config", Kind: KindConfigMap, Name: "app-config"},
			wantMsg: `pod default/web: volume "config": configMap "app-config" not found`,
		},
		{
			name:    "missing key",
			vol:     cmVolume("config", "app", corev1.KeyToPath{Key: "b", Path: "b"}),
			want:    &MissingError{Pod: "default/web", Volume: "config", Kind: KindConfigMap, Name: "app", Key: "b"},
			wantMsg: `pod default/web: volume "config": configMap "app": key "b" not found`,
		},
		{
			name: "missing secret",
			vol:  corev1.Volume{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "nope"}}},
			want: &MissingError{Pod: "default/web", Volume: "s", Kind: KindSecret, Name: "nope"},
		},
		{
			name: "missing secret in projected",
			vol: corev1.Volume{Name: "p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}}}}}}},
			want: &MissingError{Pod: "default/web", Volume: "p", Kind: KindSecret, Name: "nope"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vols, err := e.m.Setup(context.Background(), testPod(tt.vol), PodInfo{})
			var me *MissingError
			if !errors.As(err, &me) {
				t.Fatalf("err = %v, want *MissingError", err)
			}
			if *me != *tt.want {
				t.Errorf("MissingError = %+v, want %+v", *me, *tt.want)
			}
			if tt.wantMsg != "" && err.Error() != tt.wantMsg {
				t.Errorf("error %q, want %q", err, tt.wantMsg)
			}
			if _, ok := vols[tt.vol.Name]; ok {
				t.Error("failed volume returned")
			}
		})
	}
}

func TestSetupOptionalConfigMap(t *testing.T) {
	e := newEnv(t)
	vol := cmVolume("config", "later", corev1.KeyToPath{Key: "a", Path: "a"}, corev1.KeyToPath{Key: "b", Path: "b"})
	vol.ConfigMap.Optional = ptr(true)
	pod := testPod(vol)
	vols, err := e.m.Setup(context.Background(), pod, PodInfo{})
	if err != nil {
		t.Fatal(err)
	}
	dir := vols["config"].Path
	if names := visible(t, dir); len(names) != 0 {
		t.Fatalf("optional missing configMap: volume holds %v, want nothing", names)
	}
	// It appears later, with one of the two keys: the next Setup writes it.
	e.putConfigMap(t, "later", map[string]string{"a": "1"})
	if _, err := e.m.Setup(context.Background(), pod, PodInfo{}); err != nil {
		t.Fatal(err)
	}
	checkVisible(t, dir, "a", "1")
	if names := visible(t, dir); !slices.Equal(names, []string{"a"}) {
		t.Errorf("volume holds %v, want [a]", names)
	}
}

// visible lists a volume's user-visible names.
func visible(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "..") {
			names = append(names, e.Name())
		}
	}
	return names
}

func TestSetupErrorsNameTheField(t *testing.T) {
	e := newEnv(t)
	e.putConfigMap(t, "app", map[string]string{"a": "1"})
	tests := []struct {
		name string
		vol  corev1.Volume
		want string
	}{
		{"item path with ..", cmVolume("config", "app", corev1.KeyToPath{Key: "a", Path: "x/../../etc"}),
			`pod default/web: volume "config": configMap.items[0]: path "x/../../etc": must not contain ".."`},
		{"absolute item path", cmVolume("config", "app", corev1.KeyToPath{Key: "a", Path: "/etc/passwd"}),
			`configMap.items[0]: path "/etc/passwd": must be a relative path`},
		{"item path starting with ..", cmVolume("config", "app", corev1.KeyToPath{Key: "a", Path: "..data"}),
			`configMap.items[0]: path "..data": must not start with ".."`},
		{"item mode out of range", cmVolume("config", "app", corev1.KeyToPath{Key: "a", Path: "a", Mode: ptr(int32(0o1000))}),
			`configMap.items[0].mode: 01000 is not between 0 and 0777`},
		{"paths conflict", cmVolume("config", "app", corev1.KeyToPath{Key: "a", Path: "d"}, corev1.KeyToPath{Key: "a", Path: "d/f"}),
			`path "d/f" conflicts with "d"`},
		{"serviceAccountToken", corev1.Volume{Name: "tok", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}}},
			`pod default/web: volume "tok": projected.sources[0].serviceAccountToken: no token: the pod is not in the store`},
		{"unsupported source", corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}},
			`pod default/web: volume "data": persistentVolumeClaim volumes are not supported`},
		{"downwardAPI unsupported field", corev1.Volume{Name: "info", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
			{Path: "x", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.restartPolicy"}}}}}},
			`pod default/web: volume "info": downwardAPI.items[0]: fieldRef "spec.restartPolicy": unsupported field path`},
		{"downwardAPI resource without container", corev1.Volume{Name: "info", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
			{Path: "x", ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}}}}},
			`containerName is required`},
		{"no source", corev1.Volume{Name: "none"}, `pod default/web: volume "none": no volume source is set`},
		{"hugepages emptyDir", corev1.Volume{Name: "hp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumHugePages}}},
			`pod default/web: volume "hp": emptyDir medium "HugePages" is not supported`},
		{"volume name with slash", corev1.Volume{Name: "../x", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			`volumes[0]: name "../x": must not contain / or NUL`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.m.Setup(context.Background(), testPod(tt.vol), PodInfo{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestSetupRejectsUnsafeUID(t *testing.T) {
	e := newEnv(t)
	pod := testPod()
	pod.UID = "../../etc"
	if _, err := e.m.Setup(context.Background(), pod, PodInfo{}); err == nil {
		t.Fatal("Setup accepted a uid with a slash")
	}
	if err := e.m.Teardown(".."); err == nil {
		t.Fatal("Teardown accepted uid ..")
	}
}

func TestSetupOtherVolumesDespiteOneFailing(t *testing.T) {
	e := newEnv(t)
	pod := testPod(cmVolume("config", "nope"), corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	vols, err := e.m.Setup(context.Background(), pod, PodInfo{})
	var me *MissingError
	if !errors.As(err, &me) {
		t.Fatalf("err = %v, want a MissingError", err)
	}
	if _, ok := vols["scratch"]; !ok {
		t.Error("emptyDir not set up because a configMap is missing")
	}
}

func TestEmptyDirMemory(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	pod := testPod(corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
		Medium: corev1.StorageMediumMemory, SizeLimit: ptr(resource.MustParse("8Mi"))}}})
	vols, err := e.m.Setup(context.Background(), pod, PodInfo{NodeAllocatable: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}})
	if err != nil {
		t.Fatal(err)
	}
	dir := vols["cache"].Path
	if mountedAt(t, dir) != 1 {
		t.Fatal("no tmpfs mounted")
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		t.Fatal(err)
	}
	if sfs.Type != unix.TMPFS_MAGIC {
		t.Errorf("filesystem type %#x, want tmpfs", sfs.Type)
	}
	if size := int64(sfs.Blocks) * int64(sfs.Bsize); size != 8<<20 {
		t.Errorf("tmpfs size %d, want %d", size, 8<<20)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode() != fs.ModeDir|fs.ModeSticky|0o777 {
		t.Errorf("tmpfs mode %v (%v), want dtrwxrwxrwx as kubelet's", fi.Mode(), err)
	}
	if _, err := e.m.Setup(context.Background(), pod, PodInfo{}); err != nil {
		t.Fatal(err)
	}
	if n := mountedAt(t, dir); n != 1 {
		t.Errorf("after a second Setup, %d mounts, want 1", n)
	}
}

func TestMemorySize(t *testing.T) {
	q := resource.MustParse
	tests := []struct {
		name      string
		sizeLimit string
		alloc     string
		limits    []string // per container, "" for none
		want      int64
	}{
		{name: "nothing known", limits: []string{""}, want: 0},
		{name: "sizeLimit only", sizeLimit: "8Mi", limits: []string{""}, want: 8 << 20},
		{name: "allocatable bounds sizeLimit", sizeLimit: "2Gi", alloc: "1Gi", limits: []string{""}, want: 1 << 30},
		{name: "pod limit sums containers", alloc: "1Gi", limits: []string{"64Mi", "32Mi"}, want: 96 << 20},
		{name: "a container without limit: no pod limit", alloc: "1Gi", limits: []string{"64Mi", ""}, want: 1 << 30},
		{name: "smallest wins", sizeLimit: "16Mi", alloc: "1Gi", limits: []string{"64Mi"}, want: 16 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := testPod()
			pod.Spec.Containers = nil
			for _, l := range tt.limits {
				c := corev1.Container{Name: "c"}
				if l != "" {
					c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: q(l)}
				}
				pod.Spec.Containers = append(pod.Spec.Containers, c)
			}
			ed := &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}
			if tt.sizeLimit != "" {
				ed.SizeLimit = ptr(q(tt.sizeLimit))
			}
			var info PodInfo
			if tt.alloc != "" {
				info.NodeAllocatable = corev1.ResourceList{corev1.ResourceMemory: q(tt.alloc)}
			}
			if got := memorySize(pod, ed, info); got != tt.want {
				t.Errorf("memorySize = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestTeardownUnmountsAndRemoves(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	e.putSecret(t, "db", map[string][]byte{"pw": []byte("x")})
	pod := testPod(
		corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
		corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "db"}}},
		corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	)
	vols, err := e.m.Setup(context.Background(), pod, PodInfo{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vols["cache"].Path, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	podDir := filepath.Join(e.podsDir, string(pod.UID))
	real, err := filepath.EvalSymlinks(podDir)
	if err != nil {
		t.Fatal(err)
	}
	if mps, _ := readMountPoints(real); len(mps) != 2 {
		t.Fatalf("mounts below the pod dir: %v, want 2 tmpfs", mps)
	}
	if err := e.m.Teardown(string(pod.UID)); err != nil {
		t.Fatal(err)
	}
	if mps, _ := readMountPoints(real); len(mps) != 0 {
		t.Errorf("still mounted after Teardown: %v", mps)
	}
	if _, err := os.Stat(podDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("pod dir still there: %v", err)
	}
	if err := e.m.Teardown(string(pod.UID)); err != nil {
		t.Errorf("second Teardown: %v", err)
	}
}

func TestFSGroup(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	e.putSecret(t, "db", map[string][]byte{"pw": []byte("x")})
	pod := testPod(
		corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "db", DefaultMode: ptr(int32(0o400))}}},
		corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	)
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: ptr(int64(2000))}
	vols, err := e.m.Setup(context.Background(), pod, PodInfo{})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(vols["creds"].Path, "pw"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o440 || fileGID(fi) != 2000 {
		t.Errorf("secret file mode %v gid %d, want 0440 gid 2000", fi.Mode(), fileGID(fi))
	}
	fi, err = os.Stat(vols["scratch"].Path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&fs.ModeSetgid == 0 || fileGID(fi) != 2000 {
		t.Errorf("emptyDir mode %v gid %d, want setgid and gid 2000", fi.Mode(), fileGID(fi))
	}
	// Unchanged content with an fsGroup is not rewritten on every Setup.
	before, _ := os.Readlink(filepath.Join(vols["creds"].Path, "..data"))
	if _, err := e.m.Setup(context.Background(), pod, PodInfo{}); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Readlink(filepath.Join(vols["creds"].Path, "..data")); after != before {
		t.Errorf("unchanged secret rewritten with fsGroup")
	}
}

func TestNewChecksConfig(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	clk := clocktest.New(time.Unix(0, 0))
	for _, tc := range []struct {
		cfg  Config
		deps Deps
	}{
		{Config{PodsDir: "relative"}, Deps{Store: st, Clock: clk}},
		{Config{PodsDir: "/x"}, Deps{Clock: clk}},
		{Config{PodsDir: "/x"}, Deps{Store: st}},
	} {
		if _, err := New(tc.cfg, tc.deps); err == nil {
			t.Errorf("New(%+v) accepted a bad config", tc.cfg)
		}
	}
}

// TestTmpfsNotStackedUnderSymlinkedPodsDir is the regression test for
// mountinfo listing resolved paths: with PodsDir behind a symlink, a second
// Setup must still see the tmpfs it mounted before.
func TestTmpfsNotStackedUnderSymlinkedPodsDir(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "pods-link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{PodsDir: link}, Deps{Store: e.st, Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	e.putSecret(t, "db", map[string][]byte{"pw": []byte("x")})
	pod := testPod(
		corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
		corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "db"}}},
	)
	t.Cleanup(func() { _ = m.Teardown(string(pod.UID)) })
	for range 2 {
		if _, err := m.Setup(context.Background(), pod, PodInfo{}); err != nil {
			t.Fatal(err)
		}
	}
	realPod, err := filepath.EvalSymlinks(filepath.Join(real, string(pod.UID)))
	if err != nil {
		t.Fatal(err)
	}
	if mps, _ := readMountPoints(realPod); len(mps) != 2 {
		t.Fatalf("mounts after two Setups: %q, want one tmpfs per volume", mps)
	}
	if err := m.Teardown(string(pod.UID)); err != nil {
		t.Fatal(err)
	}
	if mps, _ := readMountPoints(realPod); len(mps) != 0 {
		t.Errorf("still mounted: %q", mps)
	}
	if _, err := os.Stat(realPod); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("pod dir not removed: %v", err)
	}
}
