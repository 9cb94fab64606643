package e2e

import (
	"context"

	"github.com/containerd/containerd/v2/pkg/namespaces"
)

func namespacesCtx(ctx context.Context, ns string) context.Context {
	return namespaces.WithNamespace(ctx, ns)
}
