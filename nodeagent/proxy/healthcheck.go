package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Health check node ports, as kube-proxy serves them. A LoadBalancer Service with externalTrafficPolicy Local
// gets spec.healthCheckNodePort from the API; an external load balancer asks every node on that port whether
// to send it the Service's traffic, and only nodes with a ready endpoint of the Service say yes (HTTP 200;
// 503 otherwise), since Local traffic is served on the node it reaches. The body is kube-proxy's:
//
//	{"service":{"namespace":"ns","name":"web"},"localEndpoints":1,"serviceProxyHealthy":true}
//
// The proxy listens on each such port on every address of the node, and stops when the Service goes or no
// longer needs the port.

// ReasonHealthCheckFailed is the event reason of a health check port that cannot be served (kube-proxy's).
const ReasonHealthCheckFailed = "FailedToStartServiceHealthcheck"

type healthChecks struct {
	node    string
	logger  hclog.Logger
	mu      sync.Mutex
	servers map[int32]*healthServer // by port
}

type healthServer struct {
	namespace, name string
	local           atomic.Int32
	srv             *http.Server
}

func newHealthChecks(node string, logger hclog.Logger) *healthChecks {
	return &healthChecks{node: node, logger: logger, servers: map[int32]*healthServer{}}
}

// sync starts and stops servers for the Services' health check ports and sets each one's count of ready
// endpoints on this node. A port that cannot be listened on (taken by another program) is a Problem.
func (h *healthChecks) sync(services []*corev1.Service, slices []*discoveryv1.EndpointSlice) []Problem {
	local := map[string]int32{} // namespace/name -> ready endpoints on this node
	for _, s := range slices {
		svc := s.Labels[discoveryv1.LabelServiceName]
		if svc == "" {
			continue
		}
		for _, e := range s.Endpoints {
			if e.NodeName != nil && *e.NodeName == h.node && (e.Conditions.Ready == nil || *e.Conditions.Ready) {
				local[s.Namespace+"/"+svc] += int32(len(e.Addresses))
			}
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	wanted := map[int32]bool{}
	var problems []Problem
	for _, svc := range services {
		port := svc.Spec.HealthCheckNodePort
		if port == 0 || svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
			continue
		}
		wanted[port] = true
		s := h.servers[port]
		if s != nil && (s.namespace != svc.Namespace || s.name != svc.Name) {
			h.stop(port) // the port changed hands
			s = nil
		}
		if s == nil {
			var err error
			if s, err = h.start(port, svc); err != nil {
				problems = append(problems, Problem{Object: svc, Reason: ReasonHealthCheckFailed,
					Message: fmt.Sprintf("node %s cannot serve the health check node port %d: %v", h.node, port, err)})
				continue
			}
			h.servers[port] = s
		}
		s.local.Store(local[svc.Namespace+"/"+svc.Name])
	}
	for port := range h.servers {
		if !wanted[port] {
			h.stop(port)
		}
	}
	return problems
}

func (h *healthChecks) start(port int32, svc *corev1.Service) (*healthServer, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(int(port))))
	if err != nil {
		return nil, err
	}
	s := &healthServer{namespace: svc.Namespace, name: svc.Name}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	h.logger.Debug("serving a health check node port", "service", svc.Namespace+"/"+svc.Name, "port", port)
	return s, nil
}

func (h *healthChecks) stop(port int32) {
	if s := h.servers[port]; s != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.srv.Shutdown(ctx)
		delete(h.servers, port)
	}
}

// close stops every server.
func (h *healthChecks) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for port := range h.servers {
		h.stop(port)
	}
}

// ServeHTTP answers any path, as kube-proxy does.
func (s *healthServer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	n := s.local.Load()
	body, _ := json.Marshal(map[string]any{
		"service":             map[string]string{"namespace": s.namespace, "name": s.name},
		"localEndpoints":      n,
		"serviceProxyHealthy": true,
	})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(int(n)))
	if n == 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
	} else {
		w.WriteHeader(http.StatusOK)
	}
	_, _ = w.Write(body)
}
