package apiserver

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/proxy"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
)

// The proxy subresources (pods/proxy, services/proxy, nodes/proxy) hand an HTTP request, with its method,
// body and the rest of its path, to a pod, a service's endpoint or a node agent, as kube-apiserver does:
//   - pods/<name>/proxy/<path>: the pod's IP, at the port the name gives ("name:port", "https:name:port"),
//     or the pod's first declared container port;
//   - services/<name>/proxy/<path>: a random ready endpoint of the service port the name gives (by port name
//     or number; the unnamed port when none is given), one that belongs to a pod;
//   - nodes/<name>/proxy/<path>: the node's agent, with the servers' agent client certificate; another port
//     ("name:port") reaches that port on the node instead.
//
// Pods and endpoints are reached directly: the servers route to every node's pod CIDR (server
// { route_pod_cidrs = true }, which `skiff local` sets; docs/networking.md). HTML and redirects coming back are
// rewritten to stay under the proxy path, by the library's proxy transport.

// proxyMethods are the methods the proxy subresources carry, as kube-apiserver's.
var proxyMethods = []string{"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"}

// podProxyTransport reaches pods and endpoints: an https backend's certificate is not checked, as
// kube-apiserver's proxy transport does not check it (pods serve self-signed certificates).
var podProxyTransport = utilnet.SetTransportDefaults(&http.Transport{
	TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // kube-apiserver's proxy does the same
})

// proxyREST serves one kind's proxy subresource; locate finds where a request for a name goes.
type proxyREST struct {
	options func() runtime.Object
	locate  func(ctx context.Context, name string) (*url.URL, http.RoundTripper, error)
}

func (r *proxyREST) New() runtime.Object { return r.options() }
func (r *proxyREST) Destroy()            {}

// NewConnectOptions says that the rest of the request path is the options' "path".
func (r *proxyREST) NewConnectOptions() (runtime.Object, bool, string) {
	return r.options(), true, "path"
}
func (r *proxyREST) ConnectMethods() []string { return proxyMethods }

func (r *proxyREST) Connect(ctx context.Context, name string, options runtime.Object, responder rest.Responder) (http.Handler, error) {
	loc, transport, err := r.locate(ctx, name)
	if err != nil {
		return nil, err
	}
	var path string
	switch o := options.(type) {
	case *corev1.PodProxyOptions:
		path = o.Path
	case *corev1.ServiceProxyOptions:
		path = o.Path
	case *corev1.NodeProxyOptions:
		path = o.Path
	}
	loc.Path = utilnet.JoinPreservingTrailingSlash(loc.Path, path)
	return proxy.NewUpgradeAwareHandler(loc, transport, true, false, proxy.NewErrorResponder(responder)), nil
}

// splitProxyName splits "name", "name:port" or "scheme:name:port"; the scheme defaults to http.
func splitProxyName(kind, id string) (scheme, name, port string, err error) {
	scheme, name, port, ok := utilnet.SplitSchemeNamePort(id)
	if !ok {
		return "", "", "", apierrors.NewBadRequest(fmt.Sprintf("invalid %s request %q", kind, id))
	}
	if scheme == "" {
		scheme = "http"
	}
	return scheme, name, port, nil
}

// podLocation is kube's pod ResourceLocation.
func podLocation(pods *genericregistry.Store) func(ctx context.Context, id string) (*url.URL, http.RoundTripper, error) {
	return func(ctx context.Context, id string) (*url.URL, http.RoundTripper, error) {
		scheme, name, port, err := splitProxyName("pod", id)
		if err != nil {
			return nil, nil, err
		}
		obj, err := pods.Get(ctx, name, &metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		pod := obj.(*corev1.Pod)
		if port == "" {
			for _, c := range pod.Spec.Containers {
				if len(c.Ports) > 0 {
					port = strconv.Itoa(int(c.Ports[0].ContainerPort))
					break
				}
			}
		}
		if ip := net.ParseIP(pod.Status.PodIP); ip == nil || !ip.IsGlobalUnicast() {
			return nil, nil, apierrors.NewBadRequest("address not allowed")
		}
		host := pod.Status.PodIP
		if port != "" {
			host = net.JoinHostPort(host, port)
		}
		return &url.URL{Scheme: scheme, Host: host}, podProxyTransport, nil
	}
}

// serviceLocation is kube's service ResourceLocation: a port number is first turned into the name of the
// service port that has it; then a random ready address of a random subset holding that port name, whose
// target is a pod of the namespace with that IP.
func serviceLocation(services, endpoints, pods *genericregistry.Store) func(ctx context.Context, id string) (*url.URL, http.RoundTripper, error) {
	return func(ctx context.Context, id string) (*url.URL, http.RoundTripper, error) {
		scheme, name, portName, err := splitProxyName("service", id)
		if err != nil {
			return nil, nil, err
		}
		if number, err := strconv.ParseInt(portName, 10, 32); err == nil {
			obj, err := services.Get(ctx, name, &metav1.GetOptions{})
			if err != nil {
				return nil, nil, err
			}
			i := slices.IndexFunc(obj.(*corev1.Service).Spec.Ports, func(p corev1.ServicePort) bool { return int64(p.Port) == number })
			if i < 0 {
				return nil, nil, apierrors.NewServiceUnavailable(fmt.Sprintf("no service port %d found for service %q", number, name))
			}
			portName = obj.(*corev1.Service).Spec.Ports[i].Name
		}
		obj, err := endpoints.Get(ctx, name, &metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		subsets := obj.(*corev1.Endpoints).Subsets
		if len(subsets) == 0 {
			return nil, nil, apierrors.NewServiceUnavailable(fmt.Sprintf("no endpoints available for service %q", name))
		}
		first := rand.IntN(len(subsets))
		for s := range subsets {
			subset := subsets[(first+s)%len(subsets)]
			if len(subset.Addresses) == 0 {
				continue
			}
			for _, port := range subset.Ports {
				if port.Name != portName {
					continue
				}
				start := rand.IntN(len(subset.Addresses))
				for a := range subset.Addresses {
					addr := subset.Addresses[(start+a)%len(subset.Addresses)]
					if isPodAddress(ctx, pods, addr) {
						return &url.URL{Scheme: scheme, Host: net.JoinHostPort(addr.IP, strconv.Itoa(int(port.Port)))}, podProxyTransport, nil
					}
				}
			}
		}
		return nil, nil, apierrors.NewServiceUnavailable(fmt.Sprintf("no endpoints available for service %q", id))
	}
}

// isPodAddress says whether an endpoint address is a pod's: kube-apiserver proxies only to those.
func isPodAddress(ctx context.Context, pods *genericregistry.Store, addr corev1.EndpointAddress) bool {
	ref := addr.TargetRef
	if ref == nil || ref.Kind != "Pod" {
		return false
	}
	obj, err := pods.Get(ctx, ref.Name, &metav1.GetOptions{})
	if err != nil {
		return false
	}
	return slices.ContainsFunc(obj.(*corev1.Pod).Status.PodIPs, func(ip corev1.PodIP) bool { return ip.IP == addr.IP })
}

// nodeLocation is kube's node ResourceLocation: the agent's endpoint, or another port of the node.
func (a *agents) nodeLocation(ctx context.Context, id string) (*url.URL, http.RoundTripper, error) {
	scheme, name, port, err := splitProxyName("node", id)
	if err != nil {
		return nil, nil, err
	}
	obj, err := a.nodes.Get(ctx, name, &metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	node := obj.(*corev1.Node)
	host := nodeAddress(node)
	if host == "" {
		return nil, nil, apierrors.NewBadRequest(fmt.Sprintf("node %s has no address", name))
	}
	agentPort := strconv.Itoa(int(node.Status.DaemonEndpoints.KubeletEndpoint.Port))
	if port != "" && port != agentPort {
		return &url.URL{Scheme: scheme, Host: net.JoinHostPort(host, port)}, podProxyTransport, nil
	}
	if a.transport == nil {
		return nil, nil, apierrors.NewServiceUnavailable("this server has no client certificate for node agents")
	}
	if agentPort == "0" {
		return nil, nil, apierrors.NewBadRequest(fmt.Sprintf("node %s has no agent endpoint (a simulated node, or its agent has not reported one)", name))
	}
	return &url.URL{Scheme: "https", Host: net.JoinHostPort(host, agentPort)}, a.transport, nil
}

// proxyStorage is the REST storage of the proxy subresources, by their path under the core group.
func proxyStorage(a *agents, services, endpoints *genericregistry.Store) map[string]rest.Storage {
	return map[string]rest.Storage{
		"pods/proxy":     &proxyREST{options: func() runtime.Object { return &corev1.PodProxyOptions{} }, locate: podLocation(a.pods)},
		"services/proxy": &proxyREST{options: func() runtime.Object { return &corev1.ServiceProxyOptions{} }, locate: serviceLocation(services, endpoints, a.pods)},
		"nodes/proxy":    &proxyREST{options: func() runtime.Object { return &corev1.NodeProxyOptions{} }, locate: a.nodeLocation},
	}
}

// The proxy options come in the query string ("path", set by the installer from the rest of the URL path).
func init() {
	for _, to := range []runtime.Object{&corev1.PodProxyOptions{}, &corev1.ServiceProxyOptions{}, &corev1.NodeProxyOptions{}} {
		utilruntime.Must(Scheme.AddConversionFunc((*url.Values)(nil), to, func(a, b any, _ conversion.Scope) error {
			path := (*(a.(*url.Values))).Get("path")
			switch o := b.(type) {
			case *corev1.PodProxyOptions:
				o.Path = path
			case *corev1.ServiceProxyOptions:
				o.Path = path
			case *corev1.NodeProxyOptions:
				o.Path = path
			}
			return nil
		}))
	}
}
