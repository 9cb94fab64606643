package mqtt

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/store"
)

// kubeKinds maps a topic's kind to the envelope's Kubernetes kind.
var kubeKinds = map[string]string{
	KindPods: "Pod", KindConfigMaps: "ConfigMap", KindSecrets: "Secret",
	KindServices: "Service", KindEndpointSlices: "EndpointSlice",
}

// EnvelopeKind is the envelope's kind of a topic's kind (pods: Pod), or
// "" for a kind that is not desired state.
func EnvelopeKind(topicKind string) string { return kubeKinds[topicKind] }

// Reasons a message is rejected, the metric's reason label.
const (
	rejectSize     = "size"
	rejectEnvelope = "envelope"
	rejectDecode   = "decode"
	rejectInvalid  = "invalid"
	rejectNode     = "node"
	rejectConflict = "conflict"
	rejectTopic    = "topic"
	rejectSig      = "signature"
	rejectSeal     = "seal"
)

// rejected is a message refused before anything was stored: the store
// keeps what it had.
type rejected struct {
	reason string
	topic  string
	err    error
}

func (r *rejected) Error() string {
	return fmt.Sprintf("message on %s refused (%s): %v", r.topic, r.reason, r.err)
}

func (r *rejected) Unwrap() error { return r.err }

func reject(topic, reason string, format string, args ...any) error {
	return &rejected{reason: reason, topic: topic, err: fmt.Errorf(format, args...)}
}

// outcome of applying one desired message to the store.
type outcome uint8

const (
	applyUnchanged outcome = iota // the store already held it
	applyStored                   // written
	applyDeleted                  // removed
	applyStale                    // an older generation than the store's: ignored
	applyReplay                   // signed, but older than the last index and not listed in it: ignored
	applyUnsigned                 // an empty payload while keys are trusted: deletes nothing
)

// guard is what a desired message is checked against when the node
// trusts signing keys (Keyring): a valid signature for its topic, and a
// generation above the last index read (floor), unless the index lists
// the object at exactly that generation (expected: a fetch). So a signed
// message published again later, after its object changed or was
// deleted, changes nothing, before or after a reboot, and whatever the
// broker retains. An empty payload deletes nothing: a delete is a signed
// tombstone, or the object's absence from a signed index.
type guard struct {
	keys     *Keyring
	floor    uint64
	expected uint64
	// seal opens sealed Secrets; nil: the node has no seal key.
	seal *SealKey
}

// applyDesired writes one desired message (t, payload) for node into st,
// or says why it refused it. An empty payload or a tombstone deletes.
func applyDesired(st *store.Store, node string, t Topic, payload []byte, maxBytes int, g guard) (outcome, error) {
	topic := t.String()
	if len(payload) > maxBytes {
		return 0, reject(topic, rejectSize, "%d bytes, over the limit of %d (mqtt.maxMessageBytes)", len(payload), maxBytes)
	}
	if t.Scope == ScopeNode && t.Node != node {
		return 0, reject(topic, rejectNode, "for node %s, this is %s", t.Node, node)
	}
	if g.keys != nil && len(payload) == 0 {
		return applyUnsigned, nil
	}
	var e Envelope
	if len(payload) > 0 {
		var err error
		if e, err = UnmarshalEnvelope(payload); err != nil {
			return 0, reject(topic, rejectEnvelope, "%v", err)
		}
		if g.keys != nil {
			if _, err := g.keys.Verify(topic, payload, e); err != nil {
				return 0, reject(topic, rejectSig, "%v", err)
			}
		}
		if want := kubeKinds[t.Kind]; e.Kind != want {
			return 0, reject(topic, rejectEnvelope, "envelope kind %s, the topic holds %s", e.Kind, want)
		}
		switch e.Encoding {
		case EncodingProtobuf, EncodingTombstone:
		case EncodingSealed:
			if t.Kind != KindSecrets {
				return 0, reject(topic, rejectEnvelope, "a sealed %s; only secrets are sealed", e.Kind)
			}
			if g.seal == nil {
				return 0, reject(topic, rejectSeal, "a sealed secret, and this node has no seal key")
			}
			plain, err := g.seal.Open(e.Body)
			if err != nil {
				return 0, reject(topic, rejectSeal, "%v", err)
			}
			e.Body, e.Encoding = plain, EncodingProtobuf
		default:
			return 0, reject(topic, rejectEnvelope, "encoding %s, want protobuf, sealed or tombstone", e.Encoding)
		}
	}
	ops := opsFor(st, t.Kind)
	if ops == nil {
		return 0, reject(topic, rejectTopic, "not a desired object's topic")
	}
	return ops.apply(node, t, e, len(payload) == 0, g)
}

// desiredObject is what the desired kinds have in common.
type desiredObject[T any] interface {
	*T
	store.Object
	metav1.Object
}

func apply[T any, P desiredObject[T]](c store.Collection[T, P], node string, t Topic, e Envelope, empty bool, g guard) (outcome, error) {
	topic := t.String()
	rec, found, err := c.Get(t.Namespace, t.Name)
	if err != nil {
		return 0, fmt.Errorf("%s: read the stored object: %w", topic, err)
	}
	if found && rec.Source != store.SourceMQTT {
		return 0, reject(topic, rejectConflict, "%s/%s is a %s object on this node", t.Namespace, t.Name, rec.Source)
	}
	var storedGen uint64
	if found {
		storedGen, _ = strconv.ParseUint(rec.Object.GetResourceVersion(), 10, 64)
	}
	replay := g.keys != nil && e.Generation <= g.floor && e.Generation != g.expected
	if empty || e.Encoding == EncodingTombstone {
		if !found {
			return applyUnchanged, nil
		}
		if !empty && e.Generation < storedGen {
			return applyStale, nil
		}
		if replay {
			return applyReplay, nil
		}
		if _, err := c.Delete(t.Namespace, t.Name); err != nil {
			return 0, fmt.Errorf("%s: delete: %w", topic, err)
		}
		return applyDeleted, nil
	}
	if found && e.Generation <= storedGen {
		return applyStale, nil
	}
	if replay {
		return applyReplay, nil
	}
	obj := P(new(T))
	if err := obj.Unmarshal(e.Body); err != nil {
		return 0, reject(topic, rejectDecode, "%s: %v", e.Kind, err)
	}
	if err := checkDesired(obj, node, t); err != nil {
		return 0, reject(topic, rejectInvalid, "%v", err)
	}
	obj.SetResourceVersion(strconv.FormatUint(e.Generation, 10))
	obj.SetManagedFields(nil)
	if err := c.Put(store.SourceMQTT, obj); err != nil {
		if errors.Is(err, store.ErrSourceConflict) {
			return 0, reject(topic, rejectConflict, "%v", err)
		}
		return 0, fmt.Errorf("%s: store: %w", topic, err)
	}
	return applyStored, nil
}

// checkDesired checks what the topic promises of the object: its name,
// and for a pod that it is bound to this node. Its spec is the agent's to
// check (an invalid pod is reported Failed, InvalidPod, and never run).
func checkDesired(obj metav1.Object, node string, t Topic) error {
	if obj.GetNamespace() != t.Namespace || obj.GetName() != t.Name {
		return fmt.Errorf("metadata: holds %s/%s", obj.GetNamespace(), obj.GetName())
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		if o.UID == "" {
			return errors.New("metadata.uid: empty")
		}
		if o.Spec.NodeName != node {
			return fmt.Errorf("spec.nodeName: %q, this node is %s", o.Spec.NodeName, node)
		}
		if len(o.Spec.Containers) == 0 {
			return errors.New("spec.containers: empty")
		}
		// Status is the node's to say, but for the readiness gates'
		// conditions that others set.
		o.Status = store.DesiredPodStatus(o)
	case *corev1.Service:
		o.Status = corev1.ServiceStatus{}
	case *discoveryv1.EndpointSlice:
		if o.Labels[discoveryv1.LabelServiceName] == "" {
			return fmt.Errorf("metadata.labels[%s]: empty", discoveryv1.LabelServiceName)
		}
	}
	return nil
}

// kindOps are the store operations on one desired kind.
type kindOps interface {
	apply(node string, t Topic, e Envelope, empty bool, g guard) (outcome, error)
	// generations adds the generation of every MQTT object to out, by
	// index key.
	generations(kind string, out map[string]uint64) error
	// deleteMQTT removes namespace/name if it is an MQTT object.
	deleteMQTT(namespace, name string) (bool, error)
}

type collOps[T any, P desiredObject[T]] struct{ c store.Collection[T, P] }

func (o collOps[T, P]) apply(node string, t Topic, e Envelope, empty bool, g guard) (outcome, error) {
	return apply(o.c, node, t, e, empty, g)
}

func (o collOps[T, P]) generations(kind string, out map[string]uint64) error {
	recs, err := o.c.List()
	for _, r := range recs {
		if r.Source == store.SourceMQTT {
			g, _ := strconv.ParseUint(r.Object.GetResourceVersion(), 10, 64)
			out[IndexKey(kind, r.Object.GetNamespace(), r.Object.GetName())] = g
		}
	}
	return err
}

func (o collOps[T, P]) deleteMQTT(namespace, name string) (bool, error) {
	rec, found, err := o.c.Get(namespace, name)
	if err != nil || !found || rec.Source != store.SourceMQTT {
		return false, err
	}
	return o.c.Delete(namespace, name)
}

// opsFor returns the store operations of a topic's kind, or nil.
func opsFor(st *store.Store, kind string) kindOps {
	switch kind {
	case KindPods:
		return collOps[corev1.Pod, *corev1.Pod]{st.Pods()}
	case KindConfigMaps:
		return collOps[corev1.ConfigMap, *corev1.ConfigMap]{st.ConfigMaps()}
	case KindSecrets:
		return collOps[corev1.Secret, *corev1.Secret]{st.Secrets()}
	case KindServices:
		return collOps[corev1.Service, *corev1.Service]{st.Services()}
	case KindEndpointSlices:
		return collOps[discoveryv1.EndpointSlice, *discoveryv1.EndpointSlice]{st.EndpointSlices()}
	}
	return nil
}

// storedGenerations returns the generation of every MQTT object of scope
// in the store, by index key.
func storedGenerations(st *store.Store, scope Scope) (map[string]uint64, error) {
	kinds := nodeKinds
	if scope == ScopeCluster {
		kinds = clusterKinds
	}
	out := map[string]uint64{}
	var errs []error
	for _, k := range kinds {
		errs = append(errs, opsFor(st, k).generations(k, out))
	}
	return out, errors.Join(errs...)
}

// keyTopic parses an index key into the desired topic it names (without
// the node).
func keyTopic(key string) (Topic, error) {
	parts := strings.Split(key, "/")
	if len(parts) != 3 {
		return Topic{}, fmt.Errorf("index key %q is not KIND/NAMESPACE/NAME", key)
	}
	t := Topic{Scope: ScopeNode, Kind: parts[0], Namespace: parts[1], Name: parts[2]}
	if oneOf(t.Kind, clusterKinds) {
		t.Scope = ScopeCluster
	}
	return t, nil
}
