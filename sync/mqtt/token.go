package mqtt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/store"
)

// Service account tokens over MQTT.
//
// A node that syncs over MQTT cannot ask the API server for its pods'
// tokens. The bridge asks for them (sync/kube's PodToken, as the agent
// would) and publishes them, per pod, as one Secret among the node's
// desired objects: TokensSecretName(pod), of type TokensSecretType, with
// the pod's UID in TokensUIDAnnotation and, for each projected
// serviceAccountToken source, the token under TokenDataKey(src) and its
// expiry (RFC 3339) under TokenDataKey(src)+".expires". No pod can name
// it (the name is not one a pod's volumes or env refer to).

// TokensSecretType is the type of the Secret that carries a pod's tokens.
const TokensSecretType corev1.SecretType = "outpost.io/pod-tokens"

// TokensUIDAnnotation holds the UID of the pod the tokens are bound to.
const TokensUIDAnnotation = "outpost.io/pod-uid"

// TokensSecretName is the name of the Secret with pod's tokens.
func TokensSecretName(pod string) string { return pod + ".outpost-tokens" }

// TokenDataKey names one projected serviceAccountToken source of a pod
// in its tokens Secret: a hash of the service account, the audience and
// the expiration asked for, so two sources that ask the same share it.
func TokenDataKey(pod *corev1.Pod, src *corev1.ServiceAccountTokenProjection) string {
	var exp int64
	if src.ExpirationSeconds != nil {
		exp = *src.ExpirationSeconds
	}
	sum := sha256.Sum256([]byte(pod.Spec.ServiceAccountName + "\x00" + src.Audience + "\x00" + strconv.FormatInt(exp, 10)))
	return "t-" + hex.EncodeToString(sum[:8])
}

// errNoToken says the bridge has not published the token (yet).
var errNoToken = errors.New("the bridge has not sent this token yet")

// PodToken returns the token the bridge published for one projected
// serviceAccountToken source of pod, and when it expires. Its signature
// is agent/volume's Deps.Tokens.
func (s *Syncer) PodToken(ctx context.Context, pod *corev1.Pod, src *corev1.ServiceAccountTokenProjection) (string, time.Time, error) {
	what := fmt.Sprintf("token of pod %s/%s", pod.Namespace, pod.Name)
	rec, ok, err := s.deps.Store.Secrets().Get(pod.Namespace, TokensSecretName(pod.Name))
	switch {
	case err != nil:
		return "", time.Time{}, fmt.Errorf("%s: %w", what, err)
	case !ok || rec.Source != store.SourceMQTT || rec.Object.Type != TokensSecretType:
		return "", time.Time{}, fmt.Errorf("%s: %w", what, errNoToken)
	case rec.Object.Annotations[TokensUIDAnnotation] != string(pod.UID):
		return "", time.Time{}, fmt.Errorf("%s: the bridge's tokens are for another pod of that name (uid %s)", what, rec.Object.Annotations[TokensUIDAnnotation])
	}
	key := TokenDataKey(pod, src)
	tok := rec.Object.Data[key]
	if len(tok) == 0 {
		return "", time.Time{}, fmt.Errorf("%s: %w", what, errNoToken)
	}
	exp, err := time.Parse(time.RFC3339, string(rec.Object.Data[key+".expires"]))
	if err != nil {
		return "", time.Time{}, fmt.Errorf("%s: %s.expires: %w", what, key, err)
	}
	return string(tok), exp, nil
}
