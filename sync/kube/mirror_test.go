package kube

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outpost-edge/outpost/store"
)

// staticSinkPod is a static pod as agent/staticpods makes it: UID = config
// hash, annotated so.
func staticSinkPod(name string, hash types.UID) *corev1.Pod {
	p := sinkPod(name, hash)
	p.Labels = map[string]string{"app": name}
	p.Annotations = map[string]string{"kubernetes.io/config.source": "file", annotationHash: string(hash)}
	return p
}

func TestMirrorCreatedWithAnnotationOwnerAndStatus(t *testing.T) {
	u := newSinkUnit(t)
	p := staticSinkPod("etcd-n1", "hash1")
	u.desire(store.SourceStatic, p)
	u.mustPass()
	u.wantCalls("list", "node", "create default/etcd-n1")
	m := u.api.pod("default/etcd-n1")
	if m.Annotations[annotationMirror] != "hash1" || m.Annotations[annotationHash] != "hash1" || m.Labels["app"] != "etcd-n1" || m.Spec.NodeName != "n1" {
		t.Errorf("mirror pod meta = %+v, spec.nodeName %q", m.ObjectMeta, m.Spec.NodeName)
	}
	want := metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: "n1", UID: "node-uid-1"}
	if len(m.OwnerReferences) != 1 {
		t.Fatalf("owner references %+v", m.OwnerReferences)
	}
	got := m.OwnerReferences[0]
	if got.APIVersion != want.APIVersion || got.Kind != want.Kind || got.Name != want.Name || got.UID != want.UID ||
		got.Controller == nil || !*got.Controller || (got.BlockOwnerDeletion != nil && *got.BlockOwnerDeletion) {
		t.Errorf("owner reference %+v, want the Node as controller without blockOwnerDeletion", got)
	}

	// The static pod's status goes to the mirror pod, by the mirror's UID.
	u.journal(p, phase(corev1.PodRunning))
	u.mustPass()
	u.wantCalls("patch default/etcd-n1 uid=" + string(m.UID) + " phase=Running")
	if u.api.pod("default/etcd-n1").Status.Phase != corev1.PodRunning || u.backlog() != 0 {
		t.Error("mirror pod status not set")
	}
}

func TestMirrorDeletedWithItsStaticPod(t *testing.T) {
	u := newSinkUnit(t)
	p := staticSinkPod("web-n1", "hash1")
	u.desire(store.SourceStatic, p)
	u.mustPass()
	uid := u.api.pod("default/web-n1").UID
	u.api.takeCalls()
	if _, err := u.st.Pods().Delete(p.Namespace, p.Name); err != nil {
		t.Fatal(err)
	}
	u.d.mirrorsDirty = true // what the pods subscription does
	u.mustPass()
	u.wantCalls("delete default/web-n1 uid=" + string(uid))
	if u.api.pod("default/web-n1") != nil {
		t.Error("mirror pod still there")
	}
}

func TestMirrorReplacedWhenManifestChanges(t *testing.T) {
	u := newSinkUnit(t)
	u.desire(store.SourceStatic, staticSinkPod("web-n1", "hash1"))
	u.mustPass()
	old := u.api.pod("default/web-n1").UID
	u.api.takeCalls()
	// The manifest was edited: same name, new hash.
	u.desire(store.SourceStatic, staticSinkPod("web-n1", "hash2"))
	u.d.mirrorsDirty = true
	u.mustPass()
	u.wantCalls("delete default/web-n1 uid="+string(old), "create default/web-n1")
	if m := u.api.pod("default/web-n1"); m.Annotations[annotationMirror] != "hash2" || m.UID == old {
		t.Errorf("mirror pod not replaced: %+v", m.ObjectMeta)
	}
}

func TestMirrorOrphansDeletedAtStart(t *testing.T) {
	u := newSinkUnit(t)
	orphan := staticSinkPod("old-n1", "hash-old")
	orphan.Annotations[annotationMirror] = "hash-old"
	orphan.UID = "srv-orphan"
	u.api.put(orphan)
	other := staticSinkPod("other-n2", "hash-other") // another node's mirror pod
	other.Annotations[annotationMirror] = "hash-other"
	other.Spec.NodeName = "n2"
	u.api.put(other)
	u.desire(store.SourceAPI, sinkPod("api", "u-api")) // a plain pod of this node
	keep := staticSinkPod("keep-n1", "hash-keep")      // a mirror pod still wanted
	u.desire(store.SourceStatic, keep)
	kept := keep.DeepCopy()
	kept.UID, kept.Annotations[annotationMirror] = "srv-keep", "hash-keep"
	u.api.put(kept)
	u.mustPass()
	u.wantCalls("list", "delete default/old-n1 uid=srv-orphan")
	if u.api.pod("default/api") == nil || u.api.pod("default/other-n2") == nil || u.api.pod("default/keep-n1").UID != "srv-keep" {
		t.Error("deleted a pod that is not an orphaned mirror pod of this node")
	}
}

func TestMirrorNotMadeForPodReferencingSecrets(t *testing.T) {
	u := newSinkUnit(t)
	p := staticSinkPod("creds-n1", "hash1")
	p.Spec.Volumes = []corev1.Volume{{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s"}}}}
	u.desire(store.SourceStatic, p)
	u.journal(p, phase(corev1.PodRunning))
	u.mustPass()
	u.wantCalls("list")
	if got := u.s.MirrorErrors(); len(got) != 1 || !strings.HasPrefix(got[0], "default/creds-n1: a mirror pod may not reference secrets") {
		t.Errorf("MirrorErrors = %q", got)
	}
	if u.backlog() != 0 {
		t.Error("status of a pod that can have no mirror pod kept in the journal")
	}
	// Never asked again for the same manifest, even much later.
	u.clk.Advance(24 * time.Hour)
	u.d.mirrorsDirty = true
	u.journal(p, phase(corev1.PodFailed))
	u.mustPass()
	u.wantCalls()
	// Gone from the store: no longer reported.
	if _, err := u.st.Pods().Delete(p.Namespace, p.Name); err != nil {
		t.Fatal(err)
	}
	u.d.mirrorsDirty = true
	u.mustPass()
	if got := u.s.MirrorErrors(); len(got) != 0 {
		t.Errorf("MirrorErrors = %q after the static pod left", got)
	}
}

func TestMirrorAPIReference(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*corev1.Pod)
		want string
	}{
		{"none", func(*corev1.Pod) {}, ""},
		{"hostPath and emptyDir", func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{
				{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/x"}}},
				{Name: "e", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "d", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{DownwardAPI: &corev1.DownwardAPIProjection{}}}}}},
			}
		}, ""},
		{"service account", func(p *corev1.Pod) { p.Spec.ServiceAccountName = "sa" }, "serviceaccounts"},
		{"image pull secret", func(p *corev1.Pod) { p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "s"}} }, "secrets"},
		{"env secret", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "k"}}}}
		}, "secrets"},
		{"init envFrom config map", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "i", EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{}}}}}
		}, "configmaps"},
		{"config map volume", func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "c", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}}}
		}, "configmaps"},
		{"projected token", func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "t", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "t"}}}}}}}
		}, "serviceaccounts"},
		{"pvc", func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}}}
		}, "persistentvolumeclaims"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := staticSinkPod("x", "h")
			tc.mod(p)
			got := apiReference(p)
			if (tc.want == "") != (got == "") || !strings.HasPrefix(got, tc.want) {
				t.Errorf("apiReference = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestMirrorRecreatedAfterItWasDeleted(t *testing.T) {
	u := newSinkUnit(t)
	p := staticSinkPod("web-n1", "hash1")
	u.desire(store.SourceStatic, p)
	u.mustPass()
	first := u.api.pod("default/web-n1").UID
	u.api.takeCalls()
	// Someone deletes the mirror pod; the sink learns of it from the
	// next status patch, makes the mirror pod again and sends the status
	// there.
	if err := u.api.deletePod(t.Context(), "default", "web-n1", first); err != nil {
		t.Fatal(err)
	}
	u.api.takeCalls()
	u.journal(p, phase(corev1.PodRunning))
	again, err := u.d.pass(t.Context())
	if err != nil || !again {
		t.Fatalf("pass = %v, %v; want another pass asked for", again, err)
	}
	u.mustPass()
	second := u.api.pod("default/web-n1").UID
	u.wantCalls(
		"patch default/web-n1 uid="+string(first)+" phase=Running",
		"create default/web-n1",
		"patch default/web-n1 uid="+string(second)+" phase=Running",
	)
	if u.backlog() != 0 || u.api.pod("default/web-n1").Status.Phase != corev1.PodRunning {
		t.Error("status not on the new mirror pod")
	}

	// Deleted gracefully instead (a deletionTimestamp): the patch answer
	// shows it, and the mirror pod is deleted for good and made again.
	m := u.api.pod("default/web-n1")
	now := metav1.NewTime(sinkEpoch)
	m.DeletionTimestamp = &now
	u.api.put(m)
	u.journal(p, phase(corev1.PodFailed))
	if again, err := u.d.pass(t.Context()); err != nil || !again {
		t.Fatalf("pass = %v, %v", again, err)
	}
	u.mustPass()
	third := u.api.pod("default/web-n1").UID
	u.wantCalls(
		"patch default/web-n1 uid="+string(second)+" phase=Failed",
		"delete default/web-n1 uid="+string(second),
		"create default/web-n1",
		"patch default/web-n1 uid="+string(third)+" phase=Failed",
	)
}

// The sink keeps, of the node's pods in the API that are not mirror
// pods, only those whose names static pods take (a bridge has a sink for
// each of thousands of nodes). A static pod that comes after the list,
// its name taken, is told by the create's conflict, which lists again.
func TestMirrorNameTakenAfterTheList(t *testing.T) {
	u := newSinkUnit(t)
	for i := range 5 {
		u.api.put(sinkPod(fmt.Sprintf("api-%d", i), types.UID(fmt.Sprintf("u-api-%d", i))))
	}
	u.desire(store.SourceStatic, staticSinkPod("web-n1", "hash1"))
	u.mustPass()
	u.wantCalls("list", "node", "create default/web-n1")
	if len(u.d.known) != 1 {
		t.Errorf("the sink keeps %d pods of the node, want only the mirror pod: %v", len(u.d.known), slices.Collect(maps.Keys(u.d.known)))
	}

	u.desire(store.SourceStatic, staticSinkPod("api-3", "hash2"))
	u.d.mirrorsDirty = true
	if err := u.pass(); err == nil || !apierrors.IsAlreadyExists(errors.Unwrap(err)) && !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("pass with a static pod whose name was taken after the list = %v, want the create's conflict", err)
	}
	u.wantCalls("create default/api-3")
	u.mustPass()
	// Listed for api-3, which finds its name taken and marks the list to
	// be read again at its retry; web-n1, when the pass comes to it after
	// api-3, reads it again (the static pods' order is not fixed).
	if got := u.api.takeCalls(); len(got) < 1 || len(got) > 2 || slices.ContainsFunc(got, func(c string) bool { return c != "list" }) {
		t.Fatalf("calls %q, want one or two lists", got)
	}
	if got := u.s.MirrorErrors(); len(got) != 1 || !strings.Contains(got[0], "not its mirror pod") {
		t.Errorf("MirrorErrors = %q", got)
	}
	if u.api.pod("default/api-3").UID != "u-api-3" {
		t.Error("the other pod was touched")
	}
}

func TestMirrorNameTakenByAnotherPod(t *testing.T) {
	u := newSinkUnit(t)
	taken := sinkPod("web-n1", "u-api")
	u.api.put(taken)
	u.desire(store.SourceStatic, staticSinkPod("web-n1", "hash1"))
	u.mustPass()
	u.wantCalls("list")
	if got := u.s.MirrorErrors(); len(got) != 1 || !strings.Contains(got[0], "not its mirror pod") {
		t.Errorf("MirrorErrors = %q", got)
	}
	if u.api.pod("default/web-n1").UID != "u-api" {
		t.Error("the other pod was touched")
	}
	// After mirrorRetry the sink looks again: the other pod is gone now.
	if err := u.api.deletePod(t.Context(), "default", "web-n1", "u-api"); err != nil {
		t.Fatal(err)
	}
	u.api.takeCalls()
	u.clk.Advance(mirrorRetry)
	u.d.mirrorsDirty = true
	u.mustPass()
	u.wantCalls("list", "node", "create default/web-n1")
	if len(u.s.MirrorErrors()) != 0 {
		t.Errorf("MirrorErrors = %q after the mirror pod was made", u.s.MirrorErrors())
	}
}

func TestMirrorPodCopiesStatic(t *testing.T) {
	p := staticSinkPod("web-n1", "hash1")
	p.Spec.NodeName = ""
	m := mirrorPod(p, "n1", "node-uid")
	if m.Spec.NodeName != "n1" || m.Name != p.Name || m.Namespace != p.Namespace {
		t.Errorf("mirror pod %s/%s on %q", m.Namespace, m.Name, m.Spec.NodeName)
	}
	want := maps.Clone(p.Annotations)
	want[annotationMirror] = "hash1"
	if !maps.Equal(m.Annotations, want) || !maps.Equal(m.Labels, p.Labels) {
		t.Errorf("annotations %v labels %v", m.Annotations, m.Labels)
	}
	// The static pod is not changed.
	if _, ok := p.Annotations[annotationMirror]; ok || p.Spec.NodeName != "" {
		t.Error("mirrorPod changed the static pod")
	}
	if len(m.Spec.Containers) != 1 || m.Spec.Containers[0].Image != p.Spec.Containers[0].Image {
		t.Error("containers differ")
	}
}

// TestMirrorAgainstAPIServer makes, updates and deletes mirror pods in a
// real API server with the node identity, under NodeRestriction.
func TestMirrorAgainstAPIServer(t *testing.T) {
	e := startSinkServer(t)
	hash := types.UID("0123456789abcdef0123456789abcdef")
	static := staticSinkPod("etcd-n1", hash)
	static.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/etcd"}}}}
	e.desire(store.SourceStatic, static)

	reactWait.Until(t, "mirror pod created", func() bool { return e.get("etcd-n1") != nil })
	m := e.get("etcd-n1")
	if m.Annotations[annotationMirror] != string(hash) || m.Labels["app"] != "etcd-n1" || m.Spec.NodeName != "n1" {
		t.Errorf("mirror pod %+v on %q", m.ObjectMeta, m.Spec.NodeName)
	}
	if len(m.OwnerReferences) != 1 || m.OwnerReferences[0].UID != e.node.UID || m.OwnerReferences[0].Kind != "Node" {
		t.Errorf("owner references %+v, want the Node %s", m.OwnerReferences, e.node.UID)
	}

	// Its status goes onto the mirror pod.
	e.journal(static, runningWithIP("10.88.0.20"))
	reactWait.Until(t, "mirror pod status", func() bool { return e.get("etcd-n1").Status.PodIP == "10.88.0.20" && e.backlog() == 0 })
	if reqs := e.rt.requests("PATCH /api/v1/namespaces/default/pods/etcd-n1/status"); len(reqs) != 1 {
		t.Errorf("status requests %q, want one", reqs)
	}

	// The manifest is edited: the mirror pod is replaced.
	edited := staticSinkPod("etcd-n1", "fedcba9876543210fedcba9876543210")
	e.desire(store.SourceStatic, edited)
	reactWait.Until(t, "mirror pod replaced", func() bool {
		p := e.get("etcd-n1")
		return p != nil && p.UID != m.UID && p.Annotations[annotationMirror] == string(edited.UID)
	})

	// Someone deletes the mirror pod for good: the next status brings it back.
	cur := e.get("etcd-n1")
	grace := int64(0)
	if err := e.admin.Core.Delete().Namespace("default").Resource("pods").Name("etcd-n1").
		Body(&metav1.DeleteOptions{GracePeriodSeconds: &grace}).Do(t.Context()).Error(); err != nil {
		t.Fatal(err)
	}
	e.journal(edited, runningWithIP("10.88.0.21"))
	reactWait.Until(t, "mirror pod made again with the status", func() bool {
		p := e.get("etcd-n1")
		return p != nil && p.UID != cur.UID && p.Status.PodIP == "10.88.0.21" && e.backlog() == 0
	})

	// A static pod that references a secret gets none; the server agrees.
	secretive := staticSinkPod("creds-n1", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
	secretive.Spec.Volumes = []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s"}}}}
	e.desire(store.SourceStatic, secretive)
	reactWait.Until(t, "reported", func() bool { return len(e.s.MirrorErrors()) == 1 })
	if e.get("creds-n1") != nil {
		t.Error("mirror pod of a pod referencing a secret")
	}
	if err := e.s.deps.Client.Core.Post().Namespace("default").Resource("pods").
		Body(mirrorPod(secretive, "n1", e.node.UID)).Do(t.Context()).Error(); !apierrors.IsForbidden(err) {
		t.Errorf("the server accepted (or refused otherwise) a mirror pod referencing a secret: %v", err)
	}

	// The static pod leaves the store: its mirror pod is deleted.
	if _, err := e.st.Pods().Delete("default", "etcd-n1"); err != nil {
		t.Fatal(err)
	}
	reactWait.Until(t, "mirror pod deleted", func() bool { return e.get("etcd-n1") == nil })
}

// TestMirrorOrphanDeletedAgainstAPIServer: a mirror pod on this node whose
// static pod the store does not hold (made by an earlier run) is deleted
// when the sink starts; other pods are left alone.
func TestMirrorOrphanDeletedAgainstAPIServer(t *testing.T) {
	e := startSinkServer(t)
	plain := e.createPod("plain", "n1")
	orphan := mirrorPod(staticSinkPod("old-n1", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"), "n1", e.node.UID)
	if err := e.s.deps.Client.Core.Post().Namespace("default").Resource("pods").Body(orphan).Do(t.Context()).Error(); err != nil {
		t.Fatal(err)
	}
	// The sink listed the node's pods before the orphan existed; a new
	// sink (an agent restart) lists them again.
	u := newSinkUnit(t)
	u.s.deps.Client = e.s.deps.Client
	d := newDrainer(u.s, restPods{u.s})
	if _, err := d.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if e.get("old-n1") != nil {
		t.Error("orphaned mirror pod not deleted")
	}
	if p := e.get("plain"); p == nil || p.UID != plain.UID {
		t.Error("a plain pod of the node was deleted")
	}
}

// An API server rebuilt from an empty etcd knows no Node and no mirror
// pod, and no status of a static pod that did not change since reaches
// the journal again. Once the Node was registered again (forgetKnown),
// the sink lists, makes the mirror pods again and gives each back the
// status last sent: before, it went on believing they existed, and they
// were never made again. A mirror pod still there is left as it is.
func TestMirrorMadeAgainWithStatusAfterAPIServerForgotTheNode(t *testing.T) {
	u := newSinkUnit(t)
	web, db := staticSinkPod("web-n1", "hash1"), staticSinkPod("db-n1", "hash2")
	u.desire(store.SourceStatic, web)
	u.desire(store.SourceStatic, db)
	u.mustPass()
	u.journal(web, phase(corev1.PodRunning))
	u.journal(db, phase(corev1.PodRunning))
	u.mustPass()
	u.api.takeCalls()

	// The API server is rebuilt: web's mirror pod is gone, db's is not
	// (the garbage collector had not got to it yet).
	old := u.api.pod("default/web-n1")
	if err := u.api.deletePod(t.Context(), "default", "web-n1", old.UID); err != nil {
		t.Fatal(err)
	}
	u.api.takeCalls()
	u.mustPass()
	u.wantCalls() // nothing tells the sink without forgetKnown

	u.d.forgetKnown()
	u.mustPass()
	made := u.api.pod("default/web-n1")
	if made == nil || made.UID == old.UID {
		t.Fatalf("mirror pod of web not made again: %+v", made)
	}
	u.wantCalls("list", "node", "create default/web-n1", "patch default/web-n1 uid="+string(made.UID)+" phase=Running")
	if made.Status.Phase != corev1.PodRunning {
		t.Errorf("mirror pod made again with phase %q, want Running", made.Status.Phase)
	}
	// Restored once: the next passes write nothing.
	u.d.mirrorsDirty = true
	u.mustPass()
	u.wantCalls()
}

// The running sink hears of the node being forgotten (noteForgotten, as
// the node loop calls it when it creates the Node again) and makes the
// missing mirror pod again with its last status, without a new status
// of the static pod.
func TestMirrorLoopMakesMirrorAgainWhenNodeForgotten(t *testing.T) {
	u := newSinkUnit(t)
	web := staticSinkPod("web-n1", "hash1")
	u.desire(store.SourceStatic, web)
	u.journal(web, phase(corev1.PodRunning))
	u.runLoop()
	u.s.setConnected(true)
	u.s.setNodeSynced()
	reactWait.Until(t, "the status sent", func() bool {
		m := u.api.pod("default/web-n1")
		return u.backlog() == 0 && m != nil && m.Status.Phase == corev1.PodRunning
	})
	old := u.api.pod("default/web-n1")
	if err := u.api.deletePod(t.Context(), "default", "web-n1", old.UID); err != nil {
		t.Fatal(err)
	}
	u.s.noteForgotten()
	reactWait.Until(t, "the mirror pod made again with its status", func() bool {
		m := u.api.pod("default/web-n1")
		return m != nil && m.UID != old.UID && m.Status.Phase == corev1.PodRunning
	})
}
