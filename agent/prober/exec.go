package prober

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

func resolveExec(path string, a *corev1.ExecAction, t Target) (attempt, error) {
	if len(a.Command) == 0 {
		return nil, bad(path+".command", "is required")
	}
	if t.Exec == nil {
		return nil, bad(path, "the target cannot run commands")
	}
	cmd := slices.Clone(a.Command)
	return func(ctx context.Context) (Result, string) {
		code, out, err := t.Exec(ctx, cmd)
		timedOut := errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded)
		out = bytes.TrimSpace(out[:min(len(out), maxOutput)])
		switch {
		case err == nil && code == 0:
			return Success, string(out)
		case timedOut:
			return Failure, "command timed out"
		case err != nil:
			return Unknown, fmt.Sprintf("exec probe: %v", err)
		case len(out) == 0:
			return Failure, fmt.Sprintf("command exited with code %d", code)
		}
		return Failure, fmt.Sprintf("command exited with code %d: %s", code, out)
	}, nil
}
