package kube

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outpost-edge/outpost/store"
)

// Mirror pod annotations, as kubelet sets them.
const (
	// annotationMirror marks a mirror pod; its value is the static pod's
	// config hash.
	annotationMirror = "kubernetes.io/config.mirror"
	// annotationHash is a static pod's config hash, its UID.
	annotationHash = "kubernetes.io/config.hash"
)

// knownPod is a pod of this node in the API server as the sink knows it.
type knownPod struct {
	uid types.UID
	// mirror reports whether it is a mirror pod; hash is then the
	// static pod it mirrors (its config.mirror annotation).
	mirror bool
	hash   string
}

// mirrorProblem is why a static pod has no mirror pod.
type mirrorProblem struct {
	uid types.UID // of the static pod the problem is about
	why string
	// retryAt is when to ask the server again; zero is never (until
	// the static pod changes).
	retryAt time.Time
}

// syncMirrors makes the mirror pods in the API server match the static
// pods in the store: one per static pod, made again when its manifest
// changed, deleted when the static pod is gone. A mirror pod on this node
// whose static pod the store does not hold is deleted too.
func (d *drainer) syncMirrors(ctx context.Context) error {
	if err := d.listAPIPods(ctx); err != nil {
		return err
	}
	recs, err := d.s.deps.Store.Pods().List()
	if err != nil {
		// Deleting the mirror pods of static pods that could not be read
		// would be wrong: leave them all until the store reads.
		return fmt.Errorf("read static pods: %w", err)
	}
	statics := map[string]*corev1.Pod{}
	for _, r := range recs {
		if r.Source == store.SourceStatic {
			statics[r.Object.Namespace+"/"+r.Object.Name] = r.Object
		}
	}
	for key, p := range d.known {
		if p.mirror && statics[key] == nil {
			if err := d.deleteMirror(ctx, key, p); err != nil {
				return err
			}
		}
	}
	for key := range d.problems {
		if statics[key] == nil {
			delete(d.problems, key)
		}
	}
	for key := range d.sentStatic {
		if statics[key] == nil {
			delete(d.sentStatic, key)
			delete(d.restore, key)
		}
	}
	defer d.publishProblems()
	for key, p := range statics {
		had := d.known[key]
		m, err := d.ensureMirror(ctx, p)
		if err != nil {
			return err
		}
		switch {
		case m == nil || !d.restore[key]:
		case m == had:
			delete(d.restore, key) // still there, with its status
		default:
			if err := d.restoreStatus(ctx, key, p, m); err != nil {
				return err
			}
		}
	}
	return nil
}

// restoreStatus patches onto the mirror pod m, made again after the API
// server forgot the node, the status last sent for static: the status
// journal holds only changes, and an unchanged pod would otherwise show
// Pending until its next one. A status of another static pod of that
// name (the manifest changed) is not restored.
func (d *drainer) restoreStatus(ctx context.Context, key string, static *corev1.Pod, m *knownPod) error {
	last, ok := d.sentStatic[key]
	if !ok || last.uid != static.UID {
		delete(d.restore, key)
		return nil
	}
	patch, err := statusPatch(m.uid, &last.status)
	if err != nil {
		delete(d.restore, key)
		d.dropped(key, "status not encodable", err)
		return nil
	}
	if err := d.s.writes.wait(ctx); err != nil {
		return err
	}
	_, err = d.api.patchStatus(ctx, static.Namespace, static.Name, patch)
	switch outcomeOf(err) {
	case outcomeDone:
		d.s.log.Info("mirror pod status restored", "pod", key)
	case outcomeRetry:
		return fmt.Errorf("restore status of mirror pod %s: %w", key, err)
	case outcomeGone:
		// Deleted again meanwhile: made again on the next pass.
		delete(d.known, key)
		d.again = true
		return nil
	default:
		d.dropped(key, "mirror pod: "+dropReason(err), err)
	}
	delete(d.restore, key)
	return nil
}

// listAPIPods reads the pods bound to this node once, to find the mirror
// pods an earlier run made.
func (d *drainer) listAPIPods(ctx context.Context) error {
	if d.listed {
		return nil
	}
	pods, err := d.api.listNodePods(ctx)
	switch outcomeOf(err) {
	case outcomeDone:
	case outcomeRetry:
		return fmt.Errorf("list pods of node %s: %w", d.s.cfg.NodeName, err)
	default:
		// Not allowed to list: the sink still works, a name conflict on
		// create tells it what it would have learnt here.
		d.s.log.Warn("cannot list the pods of this node; orphaned mirror pods are not deleted", "err", err)
		pods = nil
	}
	// Of the other pods, only those whose name a static pod takes matter
	// (its mirror pod cannot be made): a node, and more so a bridge with
	// a store per node, need not keep every pod of the node in the API.
	// A static pod added later whose name is taken is told by the
	// create's conflict, which lists again.
	static, _ := d.s.deps.Store.Pods().KeysFrom(store.SourceStatic)
	statics := make(map[string]bool, len(static))
	for _, k := range static {
		statics[k] = true
	}
	clear(d.known)
	for i := range pods {
		p := &pods[i]
		hash, mirror := p.Annotations[annotationMirror]
		key := p.Namespace + "/" + p.Name
		if !mirror && !statics[key] {
			continue
		}
		d.known[key] = &knownPod{uid: p.UID, mirror: mirror, hash: hash}
		if mirror && p.DeletionTimestamp != nil {
			// Someone deleted it: it is deleted for good and made again.
			d.known[key].hash = ""
		}
	}
	d.listed = true
	return nil
}

// ensureMirror returns the mirror pod of static, creating it when there
// is none, or nil when it can have none (see MirrorErrors). An error
// means the server could not be reached.
func (d *drainer) ensureMirror(ctx context.Context, static *corev1.Pod) (*knownPod, error) {
	key := static.Namespace + "/" + static.Name
	if pr, ok := d.problems[key]; ok {
		if pr.uid == static.UID && (pr.retryAt.IsZero() || d.s.deps.Clock.Now().Before(pr.retryAt)) {
			return nil, nil
		}
		delete(d.problems, key)
		defer d.publishProblems()
	}
	if err := d.listAPIPods(ctx); err != nil {
		return nil, err
	}
	if p := d.known[key]; p != nil {
		switch {
		case !p.mirror:
			d.problem(key, static.UID, "a pod of that name that is not its mirror pod exists in the api server", true)
			d.listed = false // read it again when the problem is retried
			return nil, nil
		case p.hash == string(static.UID):
			return p, nil
		}
		// The manifest changed since the mirror pod was made (or someone
		// deleted it): replace it, as kubelet does.
		if err := d.deleteMirror(ctx, key, p); err != nil {
			return nil, err
		}
	}
	if why := apiReference(static); why != "" {
		d.problem(key, static.UID, "a mirror pod may not reference "+why, false)
		return nil, nil
	}
	nodeUID, err := d.nodeUID(ctx)
	if err != nil {
		return nil, err
	}
	if err := d.s.writes.wait(ctx); err != nil {
		return nil, err
	}
	created, err := d.api.createPod(ctx, mirrorPod(static, d.s.cfg.NodeName, nodeUID))
	switch {
	case err == nil:
		p := &knownPod{uid: created.UID, mirror: true, hash: string(static.UID)}
		d.known[key] = p
		d.s.log.Info("mirror pod created", "pod", key, "uid", string(created.UID))
		return p, nil
	case apierrors.IsAlreadyExists(err):
		// Made by someone else since the list: list again and decide.
		d.listed = false
		return nil, fmt.Errorf("create mirror pod %s: %w", key, err)
	}
	switch outcomeOf(err) {
	case outcomeRetry:
		return nil, fmt.Errorf("create mirror pod %s: %w", key, err)
	case outcomeForbidden:
		// Perhaps the Node was registered again with another UID.
		d.node = ""
	}
	d.problem(key, static.UID, "the api server refused it: "+err.Error(), true)
	return nil, nil
}

// deleteMirror deletes the mirror pod p of key, by its UID.
func (d *drainer) deleteMirror(ctx context.Context, key string, p *knownPod) error {
	ns, name, _ := strings.Cut(key, "/")
	if err := d.s.writes.wait(ctx); err != nil {
		return err
	}
	err := d.api.deletePod(ctx, ns, name, p.uid)
	switch outcomeOf(err) {
	case outcomeRetry:
		return fmt.Errorf("delete mirror pod %s: %w", key, err)
	case outcomeDone:
		d.s.log.Info("mirror pod deleted", "pod", key, "uid", string(p.uid))
	default:
		d.s.log.Debug("mirror pod already gone", "pod", key, "err", err)
	}
	delete(d.known, key)
	return nil
}

// nodeUID returns the Node's UID: the one runNode registered, or else
// (runNode has not learnt it yet) read once from the API server.
func (d *drainer) nodeUID(ctx context.Context) (types.UID, error) {
	if uid := d.s.nodeUID(); uid != "" {
		return uid, nil
	}
	if d.node != "" {
		return d.node, nil
	}
	uid, err := d.api.getNodeUID(ctx)
	if err != nil {
		// Not registered yet, or unreachable: either way, later.
		return "", fmt.Errorf("read node %s for its uid: %w", d.s.cfg.NodeName, err)
	}
	d.node = uid
	return uid, nil
}

// problem records and logs, once, that static pod key has no mirror pod.
func (d *drainer) problem(key string, uid types.UID, why string, retry bool) {
	pr := mirrorProblem{uid: uid, why: why}
	if retry {
		pr.retryAt = d.s.deps.Clock.Now().Add(mirrorRetry)
	}
	if old, ok := d.problems[key]; !ok || old.uid != uid || old.why != why {
		d.s.log.Warn("static pod gets no mirror pod; its status is not reported to the api server", "pod", key, "reason", why)
	}
	d.problems[key] = pr
	d.publishProblems()
}

// publishProblems makes the problems visible to MirrorErrors.
func (d *drainer) publishProblems() {
	m := make(map[string]string, len(d.problems))
	for k, pr := range d.problems {
		m[k] = pr.why
	}
	d.s.sink.mu.Lock()
	d.s.sink.mirrorless = m
	d.s.sink.mu.Unlock()
}

// mirrorPod is the mirror pod of static on node, as kubelet makes it:
// the same name, labels, annotations and spec, the config.mirror
// annotation naming the static pod's hash, and the Node as its
// controller (NodeRestriction requires that owner reference, with the
// Node's UID and without blockOwnerDeletion).
func mirrorPod(static *corev1.Pod, node string, nodeUID types.UID) *corev1.Pod {
	annotations := maps.Clone(static.Annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	hash := string(static.UID)
	if h := static.Annotations[annotationHash]; h != "" {
		hash = h
	}
	annotations[annotationMirror] = hash
	controller := true
	m := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: static.Namespace, Name: static.Name,
			Labels: maps.Clone(static.Labels), Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: node, UID: nodeUID, Controller: &controller,
			}},
		},
		Spec: *static.Spec.DeepCopy(),
	}
	m.Spec.NodeName = node
	return m
}

// apiReference names the kind of API object static refers to, which a
// mirror pod may not (NodeRestriction: a node must not be able to reach
// secrets, config maps or service accounts through a pod it makes), or
// returns "" when there is none.
func apiReference(p *corev1.Pod) string {
	if p.Spec.ServiceAccountName != "" {
		return "serviceaccounts"
	}
	if len(p.Spec.ImagePullSecrets) > 0 {
		return "secrets (via imagePullSecrets)"
	}
	if len(p.Spec.ResourceClaims) > 0 {
		return "resourceclaims"
	}
	var cs []corev1.Container
	cs = append(cs, p.Spec.InitContainers...)
	cs = append(cs, p.Spec.Containers...)
	for i := range p.Spec.EphemeralContainers {
		cs = append(cs, corev1.Container{Env: p.Spec.EphemeralContainers[i].Env, EnvFrom: p.Spec.EphemeralContainers[i].EnvFrom})
	}
	for _, c := range cs {
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil {
				return "secrets (via envFrom)"
			}
			if e.ConfigMapRef != nil {
				return "configmaps (via envFrom)"
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				continue
			}
			if e.ValueFrom.SecretKeyRef != nil {
				return "secrets (via env)"
			}
			if e.ValueFrom.ConfigMapKeyRef != nil {
				return "configmaps (via env)"
			}
		}
	}
	for _, v := range p.Spec.Volumes {
		switch {
		case v.Secret != nil, v.AzureFile != nil,
			v.CephFS != nil && v.CephFS.SecretRef != nil, v.Cinder != nil && v.Cinder.SecretRef != nil,
			v.FlexVolume != nil && v.FlexVolume.SecretRef != nil, v.ISCSI != nil && v.ISCSI.SecretRef != nil,
			v.RBD != nil && v.RBD.SecretRef != nil, v.ScaleIO != nil, v.StorageOS != nil && v.StorageOS.SecretRef != nil:
			return "secrets (via volume " + v.Name + ")"
		case v.ConfigMap != nil:
			return "configmaps (via volume " + v.Name + ")"
		case v.CSI != nil:
			return "csidrivers (via volume " + v.Name + ")"
		case v.PersistentVolumeClaim != nil, v.Ephemeral != nil:
			return "persistentvolumeclaims (via volume " + v.Name + ")"
		case v.Glusterfs != nil:
			return "endpoints (via volume " + v.Name + ")"
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				switch {
				case src.Secret != nil:
					return "secrets (via volume " + v.Name + ")"
				case src.ConfigMap != nil:
					return "configmaps (via volume " + v.Name + ")"
				case src.ServiceAccountToken != nil:
					return "serviceaccounts (via volume " + v.Name + ")"
				case src.ClusterTrustBundle != nil:
					return "clustertrustbundles (via volume " + v.Name + ")"
				case src.PodCertificate != nil:
					return "podcertificates (via volume " + v.Name + ")"
				}
			}
		}
	}
	return ""
}
