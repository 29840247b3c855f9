package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/proxy"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/endpoints/filters"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	genericrest "k8s.io/apiserver/pkg/registry/generic/rest"
	"k8s.io/apiserver/pkg/registry/rest"
	translator "k8s.io/apiserver/pkg/util/proxy"
	"k8s.io/streaming/pkg/httpstream/wsstream"
)

// Pods' streaming subresources (log, exec, attach, portforward) proxy to the agent that runs the pod, as
// kube-apiserver proxies to the kubelet: the agent's HTTPS endpoint (the Node's InternalIP and
// status.daemonEndpoints.kubeletEndpoint.port), reached with the servers' agent client certificate.
// WebSocket clients (kubectl 1.30+) are translated to the SPDY the agent speaks by the library's translators.

// agents reaches node agents' endpoints.
type agents struct {
	pods, nodes *genericregistry.Store
	// transport trusts the agents' serving certificates and presents the servers' client certificate; nil
	// when the server has none, and then every streaming subresource answers 503.
	transport http.RoundTripper
	// authorizer checks that a stream opened by a GET (a WebSocket) is allowed as "create".
	authorizer authorizer.Authorizer
}

// authorizeAsCreate authorizes a stream as "create" whichever method carries it: the request filter saw a
// WebSocket's GET as "get", which "view"-like roles grant, and a stream into a container is a write
// (kubernetes#133515; Kubernetes' AuthorizePodWebsocketUpgradeCreatePermission).
func (a *agents) authorizeAsCreate(ctx context.Context) error {
	info, ok := genericapirequest.RequestInfoFrom(ctx)
	if !ok {
		return apierrors.NewInternalError(errors.New("no request info in context"))
	}
	if info.Verb == "create" || a.authorizer == nil {
		return nil
	}
	attrs, err := filters.GetAuthorizerAttributes(ctx)
	if err != nil {
		return apierrors.NewInternalError(fmt.Errorf("building authorizer attributes: %w", err))
	}
	decision, reason, err := a.authorizer.Authorize(ctx, verbOverride{Attributes: attrs, verb: "create"})
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	if decision != authorizer.DecisionAllow {
		return apierrors.NewForbidden(schema.GroupResource{Group: info.APIGroup, Resource: info.Resource}, info.Name, errors.New(reason))
	}
	return nil
}

// verbOverride is a request's attributes with another verb.
type verbOverride struct {
	authorizer.Attributes
	verb string
}

func (v verbOverride) GetVerb() string { return v.verb }

// pod reads a pod, 404 when it does not exist.
func (a *agents) pod(ctx context.Context, name string) (*corev1.Pod, error) {
	obj, err := a.pods.Get(ctx, name, &metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return obj.(*corev1.Pod), nil
}

// location is the agent URL for path on the pod's node, or nil for a pod that has no node yet.
func (a *agents) location(ctx context.Context, pod *corev1.Pod, path string, query url.Values) (*url.URL, error) {
	if a.transport == nil {
		return nil, apierrors.NewServiceUnavailable("this server has no client certificate for node agents")
	}
	if pod.Spec.NodeName == "" {
		return nil, nil
	}
	obj, err := a.nodes.Get(ctx, pod.Spec.NodeName, &metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	node := obj.(*corev1.Node)
	host := nodeAddress(node)
	port := node.Status.DaemonEndpoints.KubeletEndpoint.Port
	if host == "" || port == 0 {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("node %s has no agent endpoint (a simulated node, or its agent has not reported one)", node.Name))
	}
	return &url.URL{Scheme: "https", Host: net.JoinHostPort(host, strconv.Itoa(int(port))), Path: path, RawQuery: query.Encode()}, nil
}

// nodeAddress is the address the kubelet connection info prefers: InternalIP, then ExternalIP, InternalDNS,
// ExternalDNS and Hostname.
func nodeAddress(node *corev1.Node) string {
	for _, t := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP, corev1.NodeInternalDNS, corev1.NodeExternalDNS, corev1.NodeHostName} {
		for _, a := range node.Status.Addresses {
			if a.Type == t && a.Address != "" {
				return a.Address
			}
		}
	}
	return ""
}

// containerFor resolves the container a request names: the only one when none is named, 400 with the list
// otherwise, as Kubernetes answers. Init and ephemeral containers may be named.
func containerFor(pod *corev1.Pod, name string) (string, error) {
	var all []string
	for _, c := range pod.Spec.InitContainers {
		all = append(all, c.Name)
	}
	for _, c := range pod.Spec.Containers {
		all = append(all, c.Name)
	}
	for _, c := range pod.Spec.EphemeralContainers {
		all = append(all, c.Name)
	}
	if name == "" {
		if len(pod.Spec.Containers) == 1 {
			return pod.Spec.Containers[0].Name, nil
		}
		return "", apierrors.NewBadRequest(fmt.Sprintf("a container name must be specified for pod %s, choose one of: %v", pod.Name, all))
	}
	for _, c := range all {
		if c == name {
			return name, nil
		}
	}
	return "", apierrors.NewBadRequest(fmt.Sprintf("container %s is not valid for pod %s, choose one of: %v", name, pod.Name, all))
}

// logREST serves pods/log.
type logREST struct{ agents *agents }

func (r *logREST) New() runtime.Object { return &corev1.PodLogOptions{} }
func (r *logREST) Destroy()            {}
func (r *logREST) NewGetOptions() (runtime.Object, bool, string) {
	return &corev1.PodLogOptions{}, false, ""
}

// ProducesMIMETypes and ProducesObject describe the plain-text body for the OpenAPI document.
func (r *logREST) ProducesMIMETypes(string) []string { return []string{"text/plain"} }
func (r *logREST) ProducesObject(string) any         { return "" }

func (r *logREST) Get(ctx context.Context, name string, options runtime.Object) (runtime.Object, error) {
	opts := options.(*corev1.PodLogOptions)
	if errs := validatePodLogOptions(opts); len(errs) > 0 {
		return nil, apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("PodLogOptions").GroupKind(), name, errs)
	}
	pod, err := r.agents.pod(ctx, name)
	if err != nil {
		return nil, err
	}
	container, err := containerFor(pod, opts.Container)
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	for _, flag := range []struct {
		key string
		on  bool
	}{{"follow", opts.Follow}, {"previous", opts.Previous}, {"timestamps", opts.Timestamps}} {
		if flag.on {
			q.Set(flag.key, "true")
		}
	}
	for _, n := range []struct {
		key string
		v   *int64
	}{{"sinceSeconds", opts.SinceSeconds}, {"tailLines", opts.TailLines}, {"limitBytes", opts.LimitBytes}} {
		if n.v != nil {
			q.Set(n.key, strconv.FormatInt(*n.v, 10))
		}
	}
	if opts.SinceTime != nil {
		q.Set("sinceTime", opts.SinceTime.UTC().Format(time.RFC3339))
	}
	if opts.Stream != nil {
		q.Set("stream", *opts.Stream)
	}
	loc, err := r.agents.location(ctx, pod, fmt.Sprintf("/containerLogs/%s/%s/%s", pod.Namespace, pod.Name, container), q)
	if err != nil {
		return nil, err
	}
	return &genericrest.LocationStreamer{
		Location: loc, Transport: r.agents.transport, ContentType: "text/plain", Flush: opts.Follow,
		ResponseChecker: genericrest.NewGenericHttpResponseChecker(corev1.Resource("pods/log"), name),
		RedirectChecker: genericrest.PreventRedirects,
	}, nil
}

// validatePodLogOptions is Kubernetes' ValidatePodLogOptions.
func validatePodLogOptions(opts *corev1.PodLogOptions) field.ErrorList {
	var errs field.ErrorList
	if opts.TailLines != nil && *opts.TailLines < 0 {
		errs = append(errs, field.Invalid(field.NewPath("tailLines"), *opts.TailLines, "must be greater than or equal to 0"))
	}
	if opts.LimitBytes != nil && *opts.LimitBytes < 1 {
		errs = append(errs, field.Invalid(field.NewPath("limitBytes"), *opts.LimitBytes, "must be greater than 0"))
	}
	switch {
	case opts.SinceSeconds != nil && opts.SinceTime != nil:
		errs = append(errs, field.Forbidden(field.NewPath(""), "at most one of `sinceTime` or `sinceSeconds` may be specified"))
	case opts.SinceSeconds != nil && *opts.SinceSeconds < 1:
		errs = append(errs, field.Invalid(field.NewPath("sinceSeconds"), *opts.SinceSeconds, "must be greater than 0"))
	}
	if opts.Stream != nil {
		if *opts.Stream != corev1.LogStreamStdout && *opts.Stream != corev1.LogStreamStderr && *opts.Stream != corev1.LogStreamAll {
			errs = append(errs, field.NotSupported(field.NewPath("stream"), *opts.Stream, []string{corev1.LogStreamStdout, corev1.LogStreamStderr, corev1.LogStreamAll}))
		}
		if opts.TailLines != nil && *opts.Stream != corev1.LogStreamAll {
			errs = append(errs, field.Forbidden(field.NewPath(""), "`tailLines` and specific `stream` are mutually exclusive for now"))
		}
	}
	return errs
}

// streamREST serves exec, attach and portforward: Connect returns the proxy to the agent.
type streamREST struct {
	agents *agents
	what   string // exec, attach or portforward
}

func (r *streamREST) New() runtime.Object {
	switch r.what {
	case "exec":
		return &corev1.PodExecOptions{}
	case "attach":
		return &corev1.PodAttachOptions{}
	}
	return &corev1.PodPortForwardOptions{}
}
func (r *streamREST) Destroy() {}
func (r *streamREST) NewConnectOptions() (runtime.Object, bool, string) {
	return r.New(), false, ""
}

// ConnectMethods are GET (kubectl's WebSocket streams) and POST (SPDY).
func (r *streamREST) ConnectMethods() []string { return []string{"GET", "POST"} }

func (r *streamREST) Connect(ctx context.Context, name string, options runtime.Object, responder rest.Responder) (http.Handler, error) {
	if err := r.agents.authorizeAsCreate(ctx); err != nil {
		return nil, err
	}
	pod, err := r.agents.pod(ctx, name)
	if err != nil {
		return nil, err
	}
	if pod.Spec.NodeName == "" {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("pod %s does not have a host assigned", name))
	}
	var path string
	q := url.Values{}
	var streams translator.Options
	switch opts := options.(type) {
	case *corev1.PodExecOptions:
		container, err := containerFor(pod, opts.Container)
		if err != nil {
			return nil, err
		}
		if len(opts.Command) == 0 {
			return nil, apierrors.NewBadRequest("you must specify at least 1 command")
		}
		if streams, err = checkStreams(opts.Stdin, opts.Stdout, opts.Stderr, opts.TTY); err != nil {
			return nil, err
		}
		path = fmt.Sprintf("/exec/%s/%s/%s", pod.Namespace, pod.Name, container)
		streamQuery(q, streams)
		q["command"] = opts.Command
	case *corev1.PodAttachOptions:
		container, err := containerFor(pod, opts.Container)
		if err != nil {
			return nil, err
		}
		if streams, err = checkStreams(opts.Stdin, opts.Stdout, opts.Stderr, opts.TTY); err != nil {
			return nil, err
		}
		path = fmt.Sprintf("/attach/%s/%s/%s", pod.Namespace, pod.Name, container)
		streamQuery(q, streams)
	case *corev1.PodPortForwardOptions:
		path = fmt.Sprintf("/portForward/%s/%s", pod.Namespace, pod.Name)
		for _, p := range opts.Ports {
			if p < 1 || p > 65535 {
				return nil, apierrors.NewBadRequest(fmt.Sprintf("port %d is not a valid port number", p))
			}
			q.Add("port", strconv.Itoa(int(p)))
		}
	}
	loc, err := r.agents.location(ctx, pod, path, q)
	if err != nil {
		return nil, err
	}
	handler := proxy.NewUpgradeAwareHandler(loc, r.agents.transport, false, true, proxy.NewErrorResponder(responder))
	if r.what == "portforward" {
		// kubectl's WebSocket port-forward carries SPDY inside the WebSocket: the tunnel hands it through.
		return translator.NewTranslatingHandler(handler, translator.NewTunnelingHandler(handler), wsstream.IsWebSocketRequestWithTunnelingProtocol), nil
	}
	// WebSocket (v5.channel.k8s.io) exec and attach are translated into SPDY toward the agent.
	ws := translator.NewStreamTranslatorHandler(loc, r.agents.transport, 0, streams)
	return translator.NewTranslatingHandler(handler, ws, wsstream.IsWebSocketRequestWithStreamCloseProtocol), nil
}

// checkStreams is the kubelet's rule for exec and attach: at least one stream; a TTY has no separate stderr,
// so stderr is dropped with one.
func checkStreams(stdin, stdout, stderr, tty bool) (translator.Options, error) {
	if !stdin && !stdout && !stderr {
		return translator.Options{}, apierrors.NewBadRequest("you must specify at least 1 of stdin, stdout, stderr")
	}
	return translator.Options{Stdin: stdin, Stdout: stdout, Stderr: stderr && !tty, Tty: tty}, nil
}

func streamQuery(q url.Values, s translator.Options) {
	for _, flag := range []struct {
		key string
		on  bool
	}{{corev1.ExecStdinParam, s.Stdin}, {corev1.ExecStdoutParam, s.Stdout}, {corev1.ExecStderrParam, s.Stderr}, {corev1.ExecTTYParam, s.Tty}} {
		if flag.on {
			q.Set(flag.key, "1")
		}
	}
}

// podStreamStorage is the REST storage of the streaming subresources, by their path under the core group.
func podStreamStorage(a *agents) map[string]rest.Storage {
	return map[string]rest.Storage{
		"pods/log":         &logREST{agents: a},
		"pods/exec":        &streamREST{agents: a, what: "exec"},
		"pods/attach":      &streamREST{agents: a, what: "attach"},
		"pods/portforward": &streamREST{agents: a, what: "portforward"},
	}
}

// The options of the streaming subresources come in the query string. Their conversions from url.Values are
// generated in kube-apiserver, outside k8s.io/api; these are the same decodings, by hand.
func init() {
	conversions := []struct {
		to     runtime.Object
		decode func(q url.Values, to runtime.Object) error
	}{
		{&corev1.PodLogOptions{}, func(q url.Values, to runtime.Object) error {
			o := to.(*corev1.PodLogOptions)
			o.Container = q.Get("container")
			var err error
			for _, b := range []struct {
				key string
				to  *bool
			}{{"follow", &o.Follow}, {"previous", &o.Previous}, {"timestamps", &o.Timestamps}, {"insecureSkipTLSVerifyBackend", &o.InsecureSkipTLSVerifyBackend}} {
				if *b.to, err = queryBool(q, b.key); err != nil {
					return err
				}
			}
			for _, n := range []struct {
				key string
				to  **int64
			}{{"sinceSeconds", &o.SinceSeconds}, {"tailLines", &o.TailLines}, {"limitBytes", &o.LimitBytes}} {
				if *n.to, err = queryInt(q, n.key); err != nil {
					return err
				}
			}
			if v := q.Get("sinceTime"); v != "" {
				t, err := time.Parse(time.RFC3339, v)
				if err != nil {
					return apierrors.NewBadRequest(fmt.Sprintf("sinceTime: %q is not an RFC 3339 time", v))
				}
				o.SinceTime = &metav1.Time{Time: t}
			}
			if v, ok := q["stream"]; ok && len(v) > 0 {
				o.Stream = &v[0]
			}
			return nil
		}},
		{&corev1.PodExecOptions{}, func(q url.Values, to runtime.Object) error {
			o := to.(*corev1.PodExecOptions)
			o.Container, o.Command = q.Get("container"), q["command"]
			return queryStreams(q, &o.Stdin, &o.Stdout, &o.Stderr, &o.TTY)
		}},
		{&corev1.PodAttachOptions{}, func(q url.Values, to runtime.Object) error {
			o := to.(*corev1.PodAttachOptions)
			o.Container = q.Get("container")
			return queryStreams(q, &o.Stdin, &o.Stdout, &o.Stderr, &o.TTY)
		}},
		{&corev1.PodPortForwardOptions{}, func(q url.Values, to runtime.Object) error {
			o := to.(*corev1.PodPortForwardOptions)
			for _, v := range q["ports"] {
				p, err := strconv.ParseInt(v, 10, 32)
				if err != nil {
					return apierrors.NewBadRequest(fmt.Sprintf("ports: %q is not a port number", v))
				}
				o.Ports = append(o.Ports, int32(p))
			}
			return nil
		}},
	}
	for _, c := range conversions {
		decode := c.decode
		utilruntime.Must(Scheme.AddConversionFunc((*url.Values)(nil), c.to, func(a, b any, _ conversion.Scope) error {
			return decode(*(a.(*url.Values)), b.(runtime.Object))
		}))
	}
}

// queryStreams reads the API's stream flags (the agent's query names them input, output, error and tty).
func queryStreams(q url.Values, stdin, stdout, stderr, tty *bool) error {
	var err error
	for _, s := range []struct {
		key string
		to  *bool
	}{{"stdin", stdin}, {"stdout", stdout}, {"stderr", stderr}, {"tty", tty}} {
		if *s.to, err = queryBool(q, s.key); err != nil {
			return err
		}
	}
	return nil
}

// queryBool reads a boolean parameter as Kubernetes' conversions do: absent or empty is false.
func queryBool(q url.Values, key string) (bool, error) {
	v := q.Get(key)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, apierrors.NewBadRequest(fmt.Sprintf("%s: %q is not a boolean", key, v))
	}
	return b, nil
}

func queryInt(q url.Values, key string) (*int64, error) {
	v, ok := q[key]
	if !ok || len(v) == 0 || v[0] == "" {
		return nil, nil
	}
	n, err := strconv.ParseInt(v[0], 10, 64)
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("%s: %q is not an integer", key, v[0]))
	}
	return &n, nil
}
