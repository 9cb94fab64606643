package bridge

import (
	"errors"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/outpost-edge/outpost/store"
)

type (
	podT    = corev1.Pod
	cmT     = corev1.ConfigMap
	secretT = corev1.Secret
	svcT    = corev1.Service
	sliceT  = discoveryv1.EndpointSlice
)

var errBadKey = errors.New("index key is not KIND/NAMESPACE/NAME")

func splitKey(key string) []string { return strings.Split(key, "/") }

// collect calls fn for every object of c that came from the API server,
// or that the bridge made (a pod's tokens).
func collect[T any, P interface {
	*T
	store.Object
}](c store.Collection[T, P], fn func(store.Record[P]) error) error {
	recs, err := c.List()
	if err != nil {
		return err
	}
	for _, r := range recs {
		if r.Source != store.SourceAPI && r.Source != store.SourceMQTT {
			continue
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

// marshalAdd encodes a stored object and adds it as kind (the topic's)
// and ekind (the envelope's).
func marshalAdd[P store.Object](add func(kind, ekind, ns, name string, body []byte), kind, ekind string, r store.Record[P]) error {
	body, err := r.Object.Marshal()
	if err != nil {
		return err
	}
	add(kind, ekind, r.Object.GetNamespace(), r.Object.GetName(), body)
	return nil
}
