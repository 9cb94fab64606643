package prober

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
)

func resolveGRPC(path string, a *corev1.GRPCAction, t Target) (attempt, error) {
	if a.Port < 1 || a.Port > 65535 {
		return nil, bad(path+".port", "%d is not a valid port number (1-65535)", a.Port)
	}
	if t.Host == "" {
		return nil, bad(path, "the target has no pod IP")
	}
	addr := net.JoinHostPort(t.Host, strconv.Itoa(int(a.Port)))
	var service string
	if a.Service != nil {
		service = *a.Service
	}
	return func(ctx context.Context) (Result, string) {
		return doGRPC(ctx, addr, service)
	}, nil
}

// doGRPC calls grpc.health.v1.Health/Check once, with kubelet's messages.
func doGRPC(ctx context.Context, addr, service string) (Result, string) {
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUserAgent(userAgent),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dial(ctx, "tcp", addr)
		}),
	)
	if err != nil {
		return Failure, fmt.Sprintf("error: failed to connect service at %q: %v", addr, err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		if s, ok := status.FromError(err); ok {
			switch s.Code() {
			case codes.Unimplemented:
				return Failure, "this server does not implement the grpc health protocol (grpc.health.v1.Health): " + s.Message()
			case codes.DeadlineExceeded:
				return Failure, "timeout: health rpc did not complete within the probe timeout"
			}
		}
		return Failure, fmt.Sprintf("error: health rpc probe failed: %v", err)
	}
	if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
		return Failure, "service unhealthy (responded with " + strconv.Quote(st.String()) + ")"
	}
	return Success, "service healthy"
}
