package kube

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/outpost-edge/outpost/store"
)

// podRefs finds every config map and secret a pod spec names, in the
// pod's namespace, and nothing else.
func TestRefsFromPodSpec(t *testing.T) {
	cm := func(name string) string { return "configmap ns/" + name }
	sec := func(name string) string { return "secret ns/" + name }
	envFrom := func(c, s string) []corev1.EnvFromSource {
		return []corev1.EnvFromSource{
			{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: c}}},
			{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: s}}},
		}
	}
	valueFrom := func(c, s string) []corev1.EnvVar {
		return []corev1.EnvVar{
			{Name: "PLAIN", Value: "x"},
			{Name: "FIELD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "C", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: c}, Key: "k"}}},
			{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: s}, Key: "k"}}},
		}
	}
	tests := []struct {
		name string
		spec corev1.PodSpec
		want []string
	}{
		{name: "nothing", spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Env: []corev1.EnvVar{{Name: "A", Value: "b"}}}},
			Volumes:    []corev1.Volume{{Name: "e", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		}},
		{name: "volumes", spec: corev1.PodSpec{Volumes: []corev1.Volume{
			{Name: "a", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "vol-cm"}}}},
			{Name: "b", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "vol-sec"}}},
			{Name: "c", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "proj-cm"}}},
				{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "proj-sec"}}},
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
				{DownwardAPI: &corev1.DownwardAPIProjection{}},
			}}}},
			{Name: "d", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{}}},
		}}, want: []string{cm("proj-cm"), cm("vol-cm"), sec("proj-sec"), sec("vol-sec")}},
		{name: "env of every kind of container", spec: corev1.PodSpec{
			InitContainers:      []corev1.Container{{Name: "i", Env: valueFrom("init-cm", "init-sec")}},
			Containers:          []corev1.Container{{Name: "c", EnvFrom: envFrom("from-cm", "from-sec")}},
			EphemeralContainers: []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "e", Env: valueFrom("eph-cm", "eph-sec")}}},
		}, want: []string{cm("eph-cm"), cm("from-cm"), cm("init-cm"), sec("eph-sec"), sec("from-sec"), sec("init-sec")}},
		{name: "image pull secrets, duplicates and empty names", spec: corev1.PodSpec{
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}, {Name: ""}},
			Containers: []corev1.Container{
				{Name: "a", Env: valueFrom("same", "regcred"), EnvFrom: envFrom("same", "")},
				{Name: "b", EnvFrom: envFrom("", "regcred")},
			},
			// A config map and a secret of the same name are two objects.
			Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "same"}}}},
		}, want: []string{cm("same"), sec("regcred"), sec("same")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := map[podRef]struct{}{}
			podRefs(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: tt.spec}, got)
			var names []string
			for r := range got {
				names = append(names, r.String())
			}
			slices.Sort(names)
			if !reflect.DeepEqual(names, tt.want) {
				t.Fatalf("refs = %q\nwant   %q", names, tt.want)
			}
		})
	}
}

// At start, stored API config maps and secrets no API pod references are
// removed (a pod deleted while the agent was down leaves them); what a
// pod references, and what another source owns, stays.
func TestRefsSweepAtStart(t *testing.T) {
	s, st, _ := pwUnitSyncer(t)
	pod := pwPod("user", "u1", "n1")
	pod.ResourceVersion = ""
	pod.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "used"}}}}}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(st.Pods().Put(store.SourceAPI, pod))
	cmOf := func(name string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	}
	must(st.ConfigMaps().Put(store.SourceAPI, cmOf("used")))
	must(st.ConfigMaps().Put(store.SourceAPI, cmOf("stale")))
	must(st.ConfigMaps().Put(store.SourceStatic, cmOf("static")))
	must(st.Secrets().Put(store.SourceAPI, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "stale"}}))

	sub, unsub := st.Subscribe(store.KindConfigMap, store.KindSecret)
	defer unsub()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.runRefs(ctx) }()
	defer func() { cancel(); <-done }()
	giveUp := time.NewTimer(10 * time.Second) // a safety net, not a wait
	defer giveUp.Stop()
	for {
		_, staleCM, _ := st.ConfigMaps().Get("default", "stale")
		_, staleSec, _ := st.Secrets().Get("default", "stale")
		if !staleCM && !staleSec {
			break
		}
		select {
		case <-sub: // a removal
		case <-giveUp.C:
			t.Fatalf("stale objects not removed: config map %v, secret %v", staleCM, staleSec)
		}
	}
	for _, name := range []string{"used", "static"} {
		if _, ok, _ := st.ConfigMaps().Get("default", name); !ok {
			t.Fatalf("config map %s removed", name)
		}
	}
}

// ---- against a real API server, with the node identity ----

func (e *pwEnv) create(resource string, obj runtime.Object) {
	e.t.Helper()
	e.do("create "+resource, e.admin.Post().Namespace("default").Resource(resource).Body(obj), nil)
}

func (e *pwEnv) update(resource, name string, obj runtime.Object) {
	e.t.Helper()
	e.do("update "+resource+" "+name, e.admin.Put().Namespace("default").Resource(resource).Name(name).Body(obj), nil)
}

func (e *pwEnv) remove(resource, name string) {
	e.t.Helper()
	e.do("delete "+resource+" "+name, e.admin.Delete().Namespace("default").Resource(resource).Name(name), nil)
}

func pwConfigMap(name, v string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Data: map[string]string{"k": v}}
}

// storedCM returns the data value k of the stored API config map name,
// and whether it is stored (from the API server).
func storedCM(t *testing.T, st *store.Store, name string) (string, bool) {
	t.Helper()
	rec, ok, err := st.ConfigMaps().Get("default", name)
	if err != nil {
		t.Fatal(err)
	}
	if !ok || rec.Source != store.SourceAPI {
		return "", false
	}
	if rec.Object.ResourceVersion != "" || rec.Object.ManagedFields != nil {
		t.Fatalf("config map %s stored with resourceVersion or managedFields: %+v", name, rec.Object.ObjectMeta)
	}
	return rec.Object.Data["k"], true
}

func storedSecret(t *testing.T, st *store.Store, name string) (string, bool) {
	t.Helper()
	rec, ok, err := st.Secrets().Get("default", name)
	if err != nil {
		t.Fatal(err)
	}
	if !ok || rec.Source != store.SourceAPI {
		return "", false
	}
	return string(rec.Object.Data["p"]), true
}

// The config maps and secrets a pod of the node references reach the
// store and follow their updates; one created only after the pod appears
// then, and leaves when deleted; what no pod references never comes; and
// everything a deleted pod referenced leaves the store. A static config
// map of a referenced name is never touched.
func TestRefsFollowPods(t *testing.T) {
	e := pwStartAPI(t)
	st := pwStore(t, "n1")
	static := pwConfigMap("static-cm", "static")
	if err := st.ConfigMaps().Put(store.SourceStatic, static); err != nil {
		t.Fatal(err)
	}
	s, _ := e.nodeSyncer("n1", st, pwLog(t, nil))
	pwRun(t, s)

	e.create("configmaps", pwConfigMap("cm", "v1"))
	e.create("configmaps", pwConfigMap("unref", "x"))
	e.create("configmaps", pwConfigMap("static-cm", "api"))
	e.create("secrets", &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sec"}, Data: map[string][]byte{"p": []byte("s1")}})
	e.create("secrets", &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "other-sec"}, Data: map[string][]byte{"p": []byte("o")}})
	optional := true
	e.createPod("user", "n1", func(p *corev1.Pod) {
		p.Spec.Volumes = []corev1.Volume{
			{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}},
			{Name: "st", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "static-cm"}}}},
		}
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "P", ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "sec"}, Key: "p"}}}}
		p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "late"}, Optional: &optional}}}
	})
	// A pod of another node references other-sec: never ours.
	e.createPod("theirs", "n2", func(p *corev1.Pod) {
		p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "other-sec"}}}}
	})

	apiWait.Until(e.t, "cm and sec stored", func() bool {
		v, ok := storedCM(t, st, "cm")
		p, okSec := storedSecret(t, st, "sec")
		return ok && v == "v1" && okSec && p == "s1"
	})
	e.update("configmaps", "cm", pwConfigMap("cm", "v2"))
	e.update("secrets", "sec", &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sec"}, Data: map[string][]byte{"p": []byte("s2")}})
	apiWait.Until(e.t, "cm and sec updated", func() bool {
		v, _ := storedCM(t, st, "cm")
		p, _ := storedSecret(t, st, "sec")
		return v == "v2" && p == "s2"
	})

	if _, ok := storedCM(t, st, "late"); ok {
		t.Fatal("config map late stored before it exists")
	}
	e.create("configmaps", pwConfigMap("late", "l1"))
	apiWait.Until(e.t, "late stored", func() bool { v, ok := storedCM(t, st, "late"); return ok && v == "l1" })
	e.remove("configmaps", "late")
	apiWait.Until(e.t, "late removed", func() bool { _, ok := storedCM(t, st, "late"); return !ok })

	for _, name := range []string{"unref"} {
		if _, ok := storedCM(t, st, name); ok {
			t.Fatalf("unreferenced config map %s stored", name)
		}
	}
	if _, ok := storedSecret(t, st, "other-sec"); ok {
		t.Fatal("secret of another node's pod stored")
	}

	e.deletePod("user", 0)
	apiWait.Until(e.t, "cm and sec removed with the pod", func() bool {
		_, okCM := storedCM(t, st, "cm")
		_, okSec := storedSecret(t, st, "sec")
		return !okCM && !okSec
	})
	rec, ok, err := st.ConfigMaps().Get("default", "static-cm")
	if err != nil || !ok || rec.Source != store.SourceStatic || rec.Object.Data["k"] != "static" {
		t.Fatalf("static config map touched: %+v %v %v", rec, ok, err)
	}
}
