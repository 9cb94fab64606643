package kube

import (
	"context"
	"fmt"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
)

// ReviewToken asks the API server who bearer token belongs to, with a
// TokenReview, as kubelet's webhook authenticator does. ok is false for a
// token the API server does not accept; err is for a review that could
// not be made.
func (c *Client) ReviewToken(ctx context.Context, token string) (user authnv1.UserInfo, ok bool, err error) {
	req := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}
	var out authnv1.TokenReview
	if err := c.Authentication.Post().Resource("tokenreviews").Body(req).Do(ctx).Into(&out); err != nil {
		return user, false, fmt.Errorf("token review: %w", err)
	}
	if !out.Status.Authenticated {
		return user, false, nil
	}
	return out.Status.User, true, nil
}

// Access is what a SubjectAccessReview asks about a user.
type Access struct {
	User   string
	UID    string
	Groups []string
	Extra  map[string][]string
	// Verb, Resource, Subresource and Name are the resource attributes:
	// for the kubelet API, a verb on nodes/<subresource> of the node.
	Verb, Resource, Subresource, Name string
}

// Authorize asks the API server whether a user may do what a asks, with
// a SubjectAccessReview, as kubelet's webhook authorizer does. reason is
// the API server's, for a denial.
func (c *Client) Authorize(ctx context.Context, a Access) (allowed bool, reason string, err error) {
	extra := map[string]authzv1.ExtraValue{}
	for k, v := range a.Extra {
		extra[k] = v
	}
	req := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: a.User, UID: a.UID, Groups: a.Groups, Extra: extra,
		ResourceAttributes: &authzv1.ResourceAttributes{
			Verb: a.Verb, Group: "", Version: "v1", Resource: a.Resource, Subresource: a.Subresource, Name: a.Name,
		},
	}}
	var out authzv1.SubjectAccessReview
	if err := c.Authorization.Post().Resource("subjectaccessreviews").Body(req).Do(ctx).Into(&out); err != nil {
		return false, "", fmt.Errorf("subject access review: %w", err)
	}
	return out.Status.Allowed && !out.Status.Denied, out.Status.Reason, nil
}
