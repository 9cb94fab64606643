package kube

import (
	"context"
	"fmt"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// tokenTimeout bounds one token request, so a pod's volume refresh does
// not hang on an API server that stopped answering.
const tokenTimeout = 10 * time.Second

// Token requests a service account token bound to a pod, as kubelet's
// token manager does for a projected serviceAccountToken volume: an
// authentication/v1 TokenRequest posted to
// namespaces/<namespace>/serviceaccounts/<serviceAccount>/token with a
// boundObjectRef naming the pod (Kind Pod, APIVersion v1, name and UID),
// so the token stops being valid when the pod is deleted. Audiences nil
// means the API server's own; expirationSeconds 0 leaves the server's
// default (1 h). It returns the token and when the API server says it
// expires.
//
// With the node identity the Node authorizer allows the request only for
// a service account that a pod bound to this node uses, and NodeRestriction
// admission only with a boundObjectRef to such a pod (the UID must match):
// anything else is a Forbidden error. The request waits for the write
// limiter, as the other writes do.
func (s *Syncer) Token(ctx context.Context, namespace, serviceAccount string, audiences []string, expirationSeconds int64, podName string, podUID types.UID) (token string, expires time.Time, err error) {
	what := fmt.Sprintf("service account %s/%s for pod %s/%s", namespace, serviceAccount, namespace, podName)
	switch {
	case namespace == "" || podName == "" || podUID == "":
		return "", time.Time{}, fmt.Errorf("request token for %s: the pod's namespace, name and uid are required", what)
	case serviceAccount == "":
		return "", time.Time{}, fmt.Errorf("request token for pod %s/%s: spec.serviceAccountName is empty", namespace, podName)
	case expirationSeconds < 0:
		return "", time.Time{}, fmt.Errorf("request token for %s: expirationSeconds %d is negative", what, expirationSeconds)
	}
	req := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		Audiences: audiences,
		BoundObjectRef: &authnv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: podName, UID: podUID,
		},
	}}
	if expirationSeconds > 0 {
		req.Spec.ExpirationSeconds = &expirationSeconds
	}
	if err := s.writes.wait(ctx); err != nil {
		return "", time.Time{}, fmt.Errorf("request token for %s: %w", what, err)
	}
	var out authnv1.TokenRequest
	err = s.deps.Client.Core.Post().Namespace(namespace).Resource("serviceaccounts").Name(serviceAccount).
		SubResource("token").Timeout(tokenTimeout).Body(req).Do(ctx).Into(&out)
	if err != nil {
		s.noteErr(err)
		return "", time.Time{}, fmt.Errorf("request token for %s: %w", what, err)
	}
	if out.Status.Token == "" {
		return "", time.Time{}, fmt.Errorf("request token for %s: the API server answered without a token", what)
	}
	return out.Status.Token, out.Status.ExpirationTimestamp.Time, nil
}

// PodToken is Token for one projected serviceAccountToken source of pod,
// as kubelet's projected volume asks for it: the pod's service account,
// the source's audience (none: the API server's) and expirationSeconds.
// Its signature is agent/volume's Deps.Tokens.
func (s *Syncer) PodToken(ctx context.Context, pod *corev1.Pod, src *corev1.ServiceAccountTokenProjection) (string, time.Time, error) {
	var audiences []string
	if src.Audience != "" {
		audiences = []string{src.Audience}
	}
	var exp int64
	if src.ExpirationSeconds != nil {
		exp = *src.ExpirationSeconds
	}
	return s.Token(ctx, pod.Namespace, pod.Spec.ServiceAccountName, audiences, exp, pod.Name, pod.UID)
}
