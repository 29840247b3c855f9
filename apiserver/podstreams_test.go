package apiserver

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	translator "k8s.io/apiserver/pkg/util/proxy"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestPodStreamOptionsFromQuery decodes the query strings of pods/log, exec, attach and portforward through
// both the scheme's conversion and the ParameterCodec the request handlers use.
func TestPodStreamOptionsFromQuery(t *testing.T) {
	since := metav1.NewTime(time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC))
	cases := []struct {
		name    string
		query   string
		into    func() runtime.Object
		want    runtime.Object
		wantErr string // a BadRequest whose message holds this
	}{
		{"log, every option", "container=c&follow=true&previous=1&timestamps=T&tailLines=10&sinceSeconds=5&limitBytes=100&stream=Stdout",
			func() runtime.Object { return &corev1.PodLogOptions{} },
			&corev1.PodLogOptions{Container: "c", Follow: true, Previous: true, Timestamps: true,
				TailLines: new(int64(10)), SinceSeconds: new(int64(5)), LimitBytes: new(int64(100)), Stream: new(corev1.LogStreamStdout)}, ""},
		{"log, sinceTime", "sinceTime=2024-01-02T03:04:05Z&follow=false",
			func() runtime.Object { return &corev1.PodLogOptions{} }, &corev1.PodLogOptions{SinceTime: &since}, ""},
		{"log, sinceTime with an offset", "sinceTime=2024-01-02T05:04:05%2B02:00",
			func() runtime.Object { return &corev1.PodLogOptions{} }, &corev1.PodLogOptions{SinceTime: &since}, ""},
		{"log, empty values are unset", "container=c&tailLines=&follow=&limitBytes=",
			func() runtime.Object { return &corev1.PodLogOptions{} }, &corev1.PodLogOptions{Container: "c"}, ""},
		{"log, tailLines 0 is kept", "tailLines=0",
			func() runtime.Object { return &corev1.PodLogOptions{} }, &corev1.PodLogOptions{TailLines: new(int64(0))}, ""},
		{"log, negative tailLines decodes (validation refuses it)", "tailLines=-1",
			func() runtime.Object { return &corev1.PodLogOptions{} }, &corev1.PodLogOptions{TailLines: new(int64(-1))}, ""},
		{"log, bad tailLines", "tailLines=ten", func() runtime.Object { return &corev1.PodLogOptions{} }, nil, `tailLines: "ten" is not an integer`},
		{"log, bad sinceSeconds", "sinceSeconds=1.5", func() runtime.Object { return &corev1.PodLogOptions{} }, nil, `sinceSeconds: "1.5" is not an integer`},
		{"log, bad limitBytes", "limitBytes=1Mi", func() runtime.Object { return &corev1.PodLogOptions{} }, nil, `limitBytes: "1Mi" is not an integer`},
		{"log, bad follow", "follow=yes", func() runtime.Object { return &corev1.PodLogOptions{} }, nil, `follow: "yes" is not a boolean`},
		{"log, bad previous", "previous=2", func() runtime.Object { return &corev1.PodLogOptions{} }, nil, `previous: "2" is not a boolean`},
		{"log, bad sinceTime", "sinceTime=2024-01-02", func() runtime.Object { return &corev1.PodLogOptions{} }, nil, `sinceTime: "2024-01-02" is not an RFC 3339 time`},

		{"exec, repeated command", "container=c&command=sh&command=-c&command=echo+hi&stdin=true&stdout=1&stderr=false&tty=true",
			func() runtime.Object { return &corev1.PodExecOptions{} },
			&corev1.PodExecOptions{Container: "c", Command: []string{"sh", "-c", "echo hi"}, Stdin: true, Stdout: true, TTY: true}, ""},
		{"exec, stderr only", "command=ls&stderr=true",
			func() runtime.Object { return &corev1.PodExecOptions{} }, &corev1.PodExecOptions{Command: []string{"ls"}, Stderr: true}, ""},
		{"exec, bad stdin", "command=ls&stdin=yes", func() runtime.Object { return &corev1.PodExecOptions{} }, nil, `stdin: "yes" is not a boolean`},
		{"exec, bad tty", "command=ls&tty=on", func() runtime.Object { return &corev1.PodExecOptions{} }, nil, `tty: "on" is not a boolean`},

		{"attach", "container=c&stdin=1&stdout=true&stderr=true",
			func() runtime.Object { return &corev1.PodAttachOptions{} },
			&corev1.PodAttachOptions{Container: "c", Stdin: true, Stdout: true, Stderr: true}, ""},
		{"attach, tty", "tty=true&stdout=true",
			func() runtime.Object { return &corev1.PodAttachOptions{} }, &corev1.PodAttachOptions{Stdout: true, TTY: true}, ""},
		{"attach, bad stdout", "stdout=maybe", func() runtime.Object { return &corev1.PodAttachOptions{} }, nil, `stdout: "maybe" is not a boolean`},

		{"portforward, repeated ports", "ports=80&ports=8080",
			func() runtime.Object { return &corev1.PodPortForwardOptions{} }, &corev1.PodPortForwardOptions{Ports: []int32{80, 8080}}, ""},
		{"portforward, bad port", "ports=80&ports=http",
			func() runtime.Object { return &corev1.PodPortForwardOptions{} }, nil, `ports: "http" is not a port number`},
		{"portforward, port past int32", "ports=4294967296",
			func() runtime.Object { return &corev1.PodPortForwardOptions{} }, nil, `ports: "4294967296" is not a port number`},
	}
	decoders := []struct {
		name   string
		decode func(q url.Values, into runtime.Object) error
	}{
		{"Scheme.Convert", func(q url.Values, into runtime.Object) error { return Scheme.Convert(&q, into, nil) }},
		{"ParameterCodec", func(q url.Values, into runtime.Object) error {
			return ParameterCodec.DecodeParameters(q, corev1.SchemeGroupVersion, into)
		}},
	}
	for _, tc := range cases {
		for _, d := range decoders {
			t.Run(tc.name+"/"+d.name, func(t *testing.T) {
				q, err := url.ParseQuery(tc.query)
				if err != nil {
					t.Fatal(err)
				}
				got := tc.into()
				err = d.decode(q, got)
				if tc.wantErr != "" {
					if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), tc.wantErr) {
						t.Fatalf("err = %v, want a BadRequest with %q", err, tc.wantErr)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if !equality.Semantic.DeepEqual(got, tc.want) {
					t.Fatalf("decoded\n%#v\nwant\n%#v", got, tc.want)
				}
			})
		}
	}
}

// TestPodLogOptionsConversionResets: a decoding starts from the query alone, not from what the object held.
func TestPodLogOptionsConversionResets(t *testing.T) {
	opts := &corev1.PodLogOptions{Container: "old", Follow: true, TailLines: new(int64(3))}
	q := url.Values{"timestamps": {"true"}}
	if err := Scheme.Convert(&q, opts, nil); err != nil {
		t.Fatal(err)
	}
	want := &corev1.PodLogOptions{Timestamps: true}
	if !equality.Semantic.DeepEqual(opts, want) {
		t.Fatalf("decoded %#v, want %#v", opts, want)
	}
}

func TestValidatePodLogOptions(t *testing.T) {
	type fieldErr struct {
		typ  field.ErrorType
		path string
	}
	now := metav1.Now()
	root := field.NewPath("").String() // where Kubernetes puts the errors about combinations
	cases := []struct {
		name string
		opts corev1.PodLogOptions
		want []fieldErr
	}{
		{"none", corev1.PodLogOptions{}, nil},
		{"every valid bound", corev1.PodLogOptions{TailLines: new(int64(0)), LimitBytes: new(int64(1)), SinceSeconds: new(int64(1)), Stream: new(corev1.LogStreamAll)}, nil},
		{"sinceTime alone", corev1.PodLogOptions{SinceTime: &now}, nil},
		{"a specific stream", corev1.PodLogOptions{Stream: new(corev1.LogStreamStderr)}, nil},
		{"tailLines -1", corev1.PodLogOptions{TailLines: new(int64(-1))}, []fieldErr{{field.ErrorTypeInvalid, "tailLines"}}},
		{"limitBytes 0", corev1.PodLogOptions{LimitBytes: new(int64(0))}, []fieldErr{{field.ErrorTypeInvalid, "limitBytes"}}},
		{"sinceSeconds 0", corev1.PodLogOptions{SinceSeconds: new(int64(0))}, []fieldErr{{field.ErrorTypeInvalid, "sinceSeconds"}}},
		{"both since", corev1.PodLogOptions{SinceSeconds: new(int64(10)), SinceTime: &now}, []fieldErr{{field.ErrorTypeForbidden, root}}},
		{"both since, sinceSeconds also bad", corev1.PodLogOptions{SinceSeconds: new(int64(0)), SinceTime: &now}, []fieldErr{{field.ErrorTypeForbidden, root}}},
		{"bad stream", corev1.PodLogOptions{Stream: new("Stdin")}, []fieldErr{{field.ErrorTypeNotSupported, "stream"}}},
		{"tailLines with stdout", corev1.PodLogOptions{TailLines: new(int64(5)), Stream: new(corev1.LogStreamStdout)}, []fieldErr{{field.ErrorTypeForbidden, root}}},
		{"tailLines with a bad stream", corev1.PodLogOptions{TailLines: new(int64(5)), Stream: new("bogus")},
			[]fieldErr{{field.ErrorTypeNotSupported, "stream"}, {field.ErrorTypeForbidden, root}}},
		{"several at once", corev1.PodLogOptions{TailLines: new(int64(-2)), LimitBytes: new(int64(-1)), SinceSeconds: new(int64(-5))},
			[]fieldErr{{field.ErrorTypeInvalid, "tailLines"}, {field.ErrorTypeInvalid, "limitBytes"}, {field.ErrorTypeInvalid, "sinceSeconds"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []fieldErr
			for _, e := range validatePodLogOptions(&tc.opts) {
				got = append(got, fieldErr{e.Type, e.Field})
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("errors %v, want %v", got, tc.want)
			}
		})
	}
	// The messages are Kubernetes' own.
	errs := validatePodLogOptions(&corev1.PodLogOptions{SinceSeconds: new(int64(1)), SinceTime: &now})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "at most one of `sinceTime` or `sinceSeconds` may be specified") {
		t.Errorf("both since: %v", errs)
	}
	errs = validatePodLogOptions(&corev1.PodLogOptions{TailLines: new(int64(1)), Stream: new(corev1.LogStreamStdout)})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "`tailLines` and specific `stream` are mutually exclusive") {
		t.Errorf("tailLines with a stream: %v", errs)
	}
}

func TestContainerFor(t *testing.T) {
	containers := func(names ...string) []corev1.Container {
		var out []corev1.Container
		for _, n := range names {
			out = append(out, corev1.Container{Name: n})
		}
		return out
	}
	multi := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.PodSpec{
		InitContainers: containers("setup"), Containers: containers("app", "sidecar"),
		EphemeralContainers: []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger"}}},
	}}
	single := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "one"}, Spec: corev1.PodSpec{
		InitContainers: containers("setup"), Containers: containers("only"),
	}}
	cases := []struct {
		name      string
		pod       *corev1.Pod
		container string
		want      string
		wantErr   []string // a BadRequest whose message holds each
	}{
		{"default to the only app container", single, "", "only", nil},
		{"named app container", multi, "sidecar", "sidecar", nil},
		{"init container", multi, "setup", "setup", nil},
		{"ephemeral container", multi, "debugger", "debugger", nil},
		{"init container of a single-container pod", single, "setup", "setup", nil},
		{"none named among several", multi, "", "", []string{"a container name must be specified for pod web", "setup", "app", "sidecar", "debugger"}},
		{"unknown name", multi, "nope", "", []string{"container nope is not valid for pod web", "setup", "app", "sidecar", "debugger"}},
		{"unknown name in a single-container pod", single, "other", "", []string{"container other is not valid for pod one", "setup", "only"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := containerFor(tc.pod, tc.container)
			if tc.wantErr == nil {
				if err != nil || got != tc.want {
					t.Fatalf("containerFor = %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if !apierrors.IsBadRequest(err) {
				t.Fatalf("containerFor = %q, %v; want a BadRequest", got, err)
			}
			for _, s := range tc.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("message %q lacks %q", err.Error(), s)
				}
			}
		})
	}
}

func TestCheckStreams(t *testing.T) {
	cases := []struct {
		name                       string
		stdin, stdout, stderr, tty bool
		want                       translator.Options
		wantQuery                  string
		wantErr                    bool
	}{
		{name: "no stream", wantErr: true},
		{name: "tty alone", tty: true, wantErr: true},
		{name: "stdout", stdout: true, want: translator.Options{Stdout: true}, wantQuery: "output=1"},
		{name: "stderr", stderr: true, want: translator.Options{Stderr: true}, wantQuery: "error=1"},
		{name: "all three", stdin: true, stdout: true, stderr: true, want: translator.Options{Stdin: true, Stdout: true, Stderr: true}, wantQuery: "error=1&input=1&output=1"},
		{name: "tty drops stderr", stdin: true, stdout: true, stderr: true, tty: true,
			want: translator.Options{Stdin: true, Stdout: true, Tty: true}, wantQuery: "input=1&output=1&tty=1"},
		{name: "stdin and tty", stdin: true, tty: true, want: translator.Options{Stdin: true, Tty: true}, wantQuery: "input=1&tty=1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := checkStreams(tc.stdin, tc.stdout, tc.stderr, tc.tty)
			if tc.wantErr {
				if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), "at least 1 of stdin, stdout, stderr") {
					t.Fatalf("err = %v, want a BadRequest", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("checkStreams = %+v, %v; want %+v", got, err, tc.want)
			}
			q := url.Values{}
			streamQuery(q, got)
			if q.Encode() != tc.wantQuery {
				t.Errorf("agent query %q, want %q", q.Encode(), tc.wantQuery)
			}
		})
	}
}

func TestNodeAddress(t *testing.T) {
	addr := func(typ corev1.NodeAddressType, a string) corev1.NodeAddress {
		return corev1.NodeAddress{Type: typ, Address: a}
	}
	cases := []struct {
		name  string
		addrs []corev1.NodeAddress
		want  string
	}{
		{"none", nil, ""},
		{"internal IP listed last wins", []corev1.NodeAddress{addr(corev1.NodeHostName, "n1"), addr(corev1.NodeExternalIP, "203.0.113.1"), addr(corev1.NodeInternalIP, "10.0.0.1")}, "10.0.0.1"},
		{"first internal IP", []corev1.NodeAddress{addr(corev1.NodeInternalIP, "10.0.0.1"), addr(corev1.NodeInternalIP, "10.0.0.2")}, "10.0.0.1"},
		{"external IP before host name", []corev1.NodeAddress{addr(corev1.NodeHostName, "n1"), addr(corev1.NodeExternalIP, "203.0.113.1")}, "203.0.113.1"},
		{"host name alone", []corev1.NodeAddress{addr(corev1.NodeHostName, "n1")}, "n1"},
		{"empty internal IP skipped", []corev1.NodeAddress{addr(corev1.NodeInternalIP, ""), addr(corev1.NodeHostName, "n1")}, "n1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := &corev1.Node{Status: corev1.NodeStatus{Addresses: tc.addrs}}
			if got := nodeAddress(node); got != tc.want {
				t.Fatalf("nodeAddress = %q, want %q", got, tc.want)
			}
		})
	}
}

// streamsBackend applies commands straight to a store, as a one-peer Raft would (the pod streams and RBAC
// tests share it).

// fakeAgent is an agent endpoint that records what reaches it and answers as told.
type fakeAgent struct {
	srv *httptest.Server

	mu       sync.Mutex
	requests []*http.Request
	code     int
	body     string
}

func newFakeAgent(t *testing.T) *fakeAgent {
	a := &fakeAgent{code: http.StatusOK}
	a.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.requests = append(a.requests, r.Clone(context.Background()))
		code, body := a.code, a.body
		a.mu.Unlock()
		if code != http.StatusOK {
			http.Error(w, body, code)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, body)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *fakeAgent) answer(code int, body string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.code, a.body, a.requests = code, body, nil
}

func (a *fakeAgent) last(t *testing.T) *http.Request {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.requests) == 0 {
		t.Fatal("no request reached the agent")
	}
	return a.requests[len(a.requests)-1]
}

func (a *fakeAgent) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.requests)
}

func (a *fakeAgent) port(t *testing.T) int32 {
	_, p, err := net.SplitHostPort(a.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return int32(n)
}

// TestPodStreamsHTTP drives pods/log, exec, attach and portforward through a running API server to a fake
// agent: the answers without an agent, and what the agent is asked.
func TestPodStreamsHTTP(t *testing.T) {
	t.Parallel()
	agent := newFakeAgent(t)
	cfg := StartTestAPI(t, TestAPIOptions{AgentTransport: agent.srv.Client().Transport})
	ctx := context.Background()
	client := kubernetes.NewForConfigOrDie(cfg)

	nodes := []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "agent-node"}, Status: corev1.NodeStatus{
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "agent-node"}, {Type: corev1.NodeInternalIP, Address: "127.0.0.1"}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: agent.port(t)}},
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "simulated"}, Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}},
		}},
	}
	for _, n := range nodes {
		if _, err := client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name, node string, containers ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: node}}
		for _, c := range containers {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c, Image: "busybox"})
		}
		return p
	}
	// No serviceaccount controller runs here: make the account the ServiceAccount admission looks for.
	if _, err := client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*corev1.Pod{pod("unscheduled", "", "c"), pod("simulated", "simulated", "c"), pod("web", "agent-node", "app"), pod("two", "agent-node", "a", "b")} {
		if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	tlsConfig, err := rest.TLSConfigFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// HTTP/1.1, as kubectl's SPDY upgrades are.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	t.Cleanup(hc.CloseIdleConnections)
	do := func(t *testing.T, method, path string, upgrade bool) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, cfg.Host+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+cfg.BearerToken)
		if upgrade {
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "SPDY/3.1")
			req.Header.Set("X-Stream-Protocol-Version", "v4.channel.k8s.io")
			req.Close = true // the server hijacks the connection
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	// message reads a Status body's message (or the raw body when it is not one).
	message := func(body string) string {
		var s metav1.Status
		if json.Unmarshal([]byte(body), &s) == nil && s.Kind == "Status" {
			return s.Message
		}
		return body
	}
	const pods = "/api/v1/namespaces/default/pods/"

	t.Run("errors before the agent", func(t *testing.T) {
		cases := []struct {
			name     string
			method   string
			path     string
			wantCode int
			wantMsg  []string
		}{
			{"log of a missing pod", "GET", pods + "missing/log", http.StatusNotFound, []string{`"missing" not found`}},
			{"negative tailLines", "GET", pods + "web/log?tailLines=-1", http.StatusUnprocessableEntity, []string{"tailLines", "must be greater than or equal to 0"}},
			{"both since", "GET", pods + "web/log?sinceSeconds=5&sinceTime=2024-01-02T03:04:05Z", http.StatusUnprocessableEntity, []string{"at most one of `sinceTime` or `sinceSeconds`"}},
			{"bad tailLines", "GET", pods + "web/log?tailLines=x", http.StatusBadRequest, []string{`tailLines: "x" is not an integer`}},
			{"log with no container named", "GET", pods + "two/log", http.StatusBadRequest, []string{"a container name must be specified for pod two, choose one of: [a b]"}},
			{"log of an unknown container", "GET", pods + "web/log?container=nope", http.StatusBadRequest, []string{"container nope is not valid for pod web", "app"}},
			{"log on a node without an endpoint", "GET", pods + "simulated/log", http.StatusBadRequest, []string{"node simulated has no agent endpoint"}},
			{"exec on a pod without a node", "POST", pods + "unscheduled/exec?command=ls&stdout=true", http.StatusBadRequest, []string{"pod unscheduled does not have a host assigned"}},
			{"attach on a pod without a node", "POST", pods + "unscheduled/attach?stdout=true", http.StatusBadRequest, []string{"does not have a host assigned"}},
			{"portforward on a pod without a node", "POST", pods + "unscheduled/portforward?ports=80", http.StatusBadRequest, []string{"does not have a host assigned"}},
			{"exec on a node without an endpoint", "POST", pods + "simulated/exec?command=ls&stdout=true", http.StatusBadRequest, []string{"node simulated has no agent endpoint"}},
			{"exec of a missing pod", "POST", pods + "missing/exec?command=ls&stdout=true", http.StatusNotFound, []string{`"missing" not found`}},
			{"exec without a command", "POST", pods + "web/exec?stdout=true", http.StatusBadRequest, []string{"you must specify at least 1 command"}},
			{"exec without a stream", "POST", pods + "web/exec?command=ls", http.StatusBadRequest, []string{"at least 1 of stdin, stdout, stderr"}},
			{"exec of an unknown container", "POST", pods + "web/exec?command=ls&stdout=true&container=nope", http.StatusBadRequest, []string{"container nope is not valid"}},
			{"attach with a bad flag", "POST", pods + "web/attach?stdout=sure", http.StatusBadRequest, []string{`stdout: "sure" is not a boolean`}},
			{"portforward to port 0", "POST", pods + "web/portforward?ports=0", http.StatusBadRequest, []string{"port 0 is not a valid port number"}},
			{"portforward to port 65536", "POST", pods + "web/portforward?ports=65536", http.StatusBadRequest, []string{"port 65536 is not a valid port number"}},
			{"portforward to a named port", "POST", pods + "web/portforward?ports=http", http.StatusBadRequest, []string{`ports: "http" is not a port number`}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				agent.answer(http.StatusOK, "")
				code, body := do(t, tc.method, tc.path, false)
				if code != tc.wantCode {
					t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.path, code, body, tc.wantCode)
				}
				for _, s := range tc.wantMsg {
					if !strings.Contains(message(body), s) {
						t.Errorf("message %q lacks %q", message(body), s)
					}
				}
				if n := agent.count(); n != 0 {
					t.Errorf("%d requests reached the agent", n)
				}
			})
		}
	})

	t.Run("log of a pod without a node is empty", func(t *testing.T) {
		agent.answer(http.StatusOK, "")
		code, body := do(t, "GET", pods+"unscheduled/log", false)
		// Kubernetes answers with an empty stream (a nil location), which the library's StreamObject writes as
		// 204 No Content.
		if code != http.StatusNoContent {
			t.Fatalf("log of an unscheduled pod: %d %s, want 204", code, body)
		}
		if body != "" {
			t.Fatalf("log of an unscheduled pod: body %q, want none", body)
		}
		if n := agent.count(); n != 0 {
			t.Errorf("%d requests reached the agent", n)
		}
	})

	t.Run("log proxied to the agent", func(t *testing.T) {
		cases := []struct {
			name      string
			query     string
			wantPath  string
			wantQuery url.Values
		}{
			{"defaults", "", "/containerLogs/default/web/app", url.Values{}},
			{"every option", "follow=true&previous=true&timestamps=true&tailLines=7&limitBytes=1000&sinceSeconds=30",
				"/containerLogs/default/web/app", url.Values{"follow": {"true"}, "previous": {"true"}, "timestamps": {"true"},
					"tailLines": {"7"}, "limitBytes": {"1000"}, "sinceSeconds": {"30"}}},
			{"sinceTime in UTC", "sinceTime=2024-01-02T05:04:05%2B02:00", "/containerLogs/default/web/app", url.Values{"sinceTime": {"2024-01-02T03:04:05Z"}}},
			{"false flags left out", "follow=false&timestamps=0", "/containerLogs/default/web/app", url.Values{}},
			{"a stream", "stream=Stderr", "/containerLogs/default/web/app", url.Values{"stream": {"Stderr"}}},
			{"named container", "container=b&tailLines=0", "/containerLogs/default/two/b", url.Values{"tailLines": {"0"}}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				agent.answer(http.StatusOK, "line 1\nline 2\n")
				podName := strings.Split(tc.wantPath, "/")[3]
				path := pods + podName + "/log"
				if tc.query != "" {
					path += "?" + tc.query
				}
				code, body := do(t, "GET", path, false)
				if code != http.StatusOK || body != "line 1\nline 2\n" {
					t.Fatalf("GET %s: %d %q", path, code, body)
				}
				got := agent.last(t)
				if got.Method != http.MethodGet || got.URL.Path != tc.wantPath {
					t.Errorf("agent saw %s %s, want GET %s", got.Method, got.URL.Path, tc.wantPath)
				}
				if q := got.URL.Query(); q.Encode() != tc.wantQuery.Encode() {
					t.Errorf("agent saw query %q, want %q", q.Encode(), tc.wantQuery.Encode())
				}
			})
		}
	})

	t.Run("agent errors come back", func(t *testing.T) {
		cases := []struct {
			name     string
			code     int
			msg      string
			wantCode int
			wantMsg  string
		}{
			{"bad request keeps its message", http.StatusBadRequest, `container "app" in pod "web" is waiting to start: ContainerCreating`,
				http.StatusBadRequest, `container "app" in pod "web" is waiting to start: ContainerCreating`},
			// The library's response checker words a 404 itself, as kube-apiserver does.
			{"not found", http.StatusNotFound, `the log of container "app" in pod "web" is gone`, http.StatusNotFound, "pods/log web"},
			{"server error", http.StatusInternalServerError, "containerd is down", http.StatusInternalServerError, "containerd is down"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				agent.answer(tc.code, tc.msg)
				code, body := do(t, "GET", pods+"web/log", false)
				if code != tc.wantCode || !strings.Contains(message(body), tc.wantMsg) {
					t.Fatalf("GET log with the agent answering %d: %d %s, want %d with %q", tc.code, code, body, tc.wantCode, tc.wantMsg)
				}
				if agent.count() != 1 {
					t.Errorf("%d requests reached the agent, want 1", agent.count())
				}
			})
		}
	})

	t.Run("streams proxied to the agent", func(t *testing.T) {
		cases := []struct {
			name      string
			path      string
			wantPath  string
			wantQuery url.Values
		}{
			{"exec", "web/exec?command=sh&command=-c&command=echo+hi&stdin=true&stdout=true&stderr=true",
				"/exec/default/web/app", url.Values{"command": {"sh", "-c", "echo hi"}, "input": {"1"}, "output": {"1"}, "error": {"1"}}},
			{"exec with a tty", "two/exec?container=b&command=sh&stdin=true&stdout=true&stderr=true&tty=true",
				"/exec/default/two/b", url.Values{"command": {"sh"}, "input": {"1"}, "output": {"1"}, "tty": {"1"}}},
			{"attach", "web/attach?stdout=true&stderr=true", "/attach/default/web/app", url.Values{"output": {"1"}, "error": {"1"}}},
			{"portforward", "web/portforward?ports=80&ports=8080", "/portForward/default/web", url.Values{"port": {"80", "8080"}}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				// The fake agent refuses the upgrade: its answer is echoed to the client.
				agent.answer(http.StatusBadRequest, "no streams here")
				code, body := do(t, "POST", pods+tc.path, true)
				if code != http.StatusBadRequest || !strings.Contains(body, "no streams here") {
					t.Fatalf("POST %s: %d %q, want the agent's 400", tc.path, code, body)
				}
				got := agent.last(t)
				if got.URL.Path != tc.wantPath {
					t.Errorf("agent saw %s, want %s", got.URL.Path, tc.wantPath)
				}
				if q := got.URL.Query(); q.Encode() != tc.wantQuery.Encode() {
					t.Errorf("agent saw query %q, want %q", q.Encode(), tc.wantQuery.Encode())
				}
			})
		}
	})
}

// TestPodStreamsWithoutAgentTransport: a server with no client certificate for agents answers 503.
func TestPodStreamsWithoutAgentTransport(t *testing.T) {
	t.Parallel()
	cfg := StartTestAPI(t, TestAPIOptions{})
	ctx := context.Background()
	client := kubernetes.NewForConfigOrDie(cfg)
	// No serviceaccount controller runs here: make the account the ServiceAccount admission looks for.
	if _, err := client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := client.CoreV1().Pods("default").GetLogs("p", &corev1.PodLogOptions{}).DoRaw(ctx)
	if !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("log without an agent transport: %v, want 503", err)
	}
}
