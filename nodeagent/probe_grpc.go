package nodeagent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
)

// grpcProbe asks the pod's grpc.health.v1.Health service (at the pod IP and the probe's port) to Check the
// probe's service, as the kubelet does: a plaintext connection unless mode is TLS (then TLS without
// verification), and success only for SERVING. Every other answer, an unreachable port or a server without
// the health service included, is a failure with the kubelet's message.
func grpcProbe(ctx context.Context, a *corev1.GRPCAction, pod *corev1.Pod, timeout time.Duration) (probeOutcome, string) {
	host := podIP(pod)
	if host == "" {
		return probeSkipped, "pod has no IP address yet"
	}
	if a.Port <= 0 || a.Port > 65535 {
		return probeErrored, fmt.Sprintf("invalid port number: %d", a.Port)
	}
	service := ""
	if a.Service != nil {
		service = *a.Service
	}
	creds := insecure.NewCredentials()
	if a.Mode != nil && *a.Mode == corev1.GRPCProbeModeTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the kubelet does not verify probe targets
	}
	addr := net.JoinHostPort(host, strconv.Itoa(int(a.Port)))
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithUserAgent(probeUserAgent),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		return probeErrored, shorten(err.Error())
	}
	defer conn.Close()
	// WaitForReady: like the kubelet's blocking dial, a connection still being set up is waited for (within
	// the timeout) rather than failing the call at once.
	res, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	if err != nil {
		st, _ := status.FromError(err)
		switch {
		case st.Code() == codes.Unimplemented:
			return probeFailed, fmt.Sprintf("error: this server does not implement the grpc health protocol (grpc.health.v1.Health): %s", st.Message())
		case st.Code() == codes.DeadlineExceeded || errors.Is(ctx.Err(), context.DeadlineExceeded):
			return probeFailed, fmt.Sprintf("timeout: failed to connect service %q within %v", addr, timeout)
		}
		return probeFailed, shorten(fmt.Sprintf("error: health rpc probe failed: %v", err))
	}
	if res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return probeFailed, fmt.Sprintf("service unhealthy (responded with %q)", res.GetStatus().String())
	}
	return probeSucceeded, "service healthy"
}
