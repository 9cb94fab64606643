package prober

import (
	"context"

	corev1 "k8s.io/api/core/v1"
)

func resolveTCP(path string, a *corev1.TCPSocketAction, t Target) (attempt, error) {
	port, err := resolvePort(path+".port", a.Port, t.Ports)
	if err != nil {
		return nil, err
	}
	addr, err := hostPort(path+".host", a.Host, t, port)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (Result, string) {
		c, err := dial(ctx, "tcp", addr)
		if err != nil {
			return Failure, err.Error()
		}
		_ = c.Close() // connecting was the probe
		return Success, ""
	}, nil
}
