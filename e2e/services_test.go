package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/testimages"
	"github.com/skiff-dev/skiff/localcluster"
)

// fetchSummary is the test server's answer to /fetch and /load/stop (internal/testimages/testserver).
type fetchSummary struct {
	OK, Failed, NewConns int
	Errors               []string
	Backends             map[string]int
	MaxMS                int64
}

// serviceCluster is a local cluster seen from the client pods the test runs on its agents.
type serviceCluster struct {
	t  *testing.T
	k  kubectl
	st *localcluster.State
}

// inHost runs a command in a host's network namespace and returns its output.
func (c serviceCluster) inHost(host string, args ...string) (string, error) {
	h, ok := c.st.Host(host)
	if !ok {
		c.t.Fatalf("no host %s", host)
	}
	out, err := exec.Command("nsenter", append([]string{"--net=/run/netns/" + h.Netns, "--", "timeout", "120"}, args...)...).CombinedOutput()
	return string(out), err
}

// curl GETs url from a host's namespace.
func (c serviceCluster) curl(host, url string) (string, error) {
	return c.inHost(host, "curl", "-sS", "--max-time", "100", url)
}

// pod asks a client pod's test server for path (from the pod's own node) and decodes the JSON answer.
func (c serviceCluster) pod(client, path string, into any) {
	c.t.Helper()
	p := c.k.pod(client)
	out, err := c.curl(p.Spec.NodeName, "http://"+p.Status.PodIP+":8080"+path)
	if err != nil {
		c.t.Fatalf("%s %s: %v: %s", client, path, err, out)
	}
	if into != nil {
		if err := json.Unmarshal([]byte(out), into); err != nil {
			c.t.Fatalf("%s %s: %v: %s", client, path, err, out)
		}
	}
}

// fetch has a client pod GET url n times, each on a new connection.
func (c serviceCluster) fetch(client, url string, n int) fetchSummary {
	c.t.Helper()
	var s fetchSummary
	c.pod(client, fmt.Sprintf("/fetch?n=%d&timeout=5s&url=%s", n, url), &s)
	return s
}

// resolve has a client pod look a name up with its own resolver.
func (c serviceCluster) resolve(client, typ, name string) ([]string, string) {
	c.t.Helper()
	var a struct {
		Answers []string
		Error   string
	}
	c.pod(client, fmt.Sprintf("/dns?type=%s&name=%s", typ, name), &a)
	return a.Answers, a.Error
}

// endpoints lists the web Service's EndpointSlice endpoints as "podName ready serving terminating".
func (c serviceCluster) endpoints(service string) []string {
	out := c.k.ok("get", "endpointslices", "-n", "svc", "-l", "kubernetes.io/service-name="+service, "-o",
		`jsonpath={range .items[*].endpoints[*]}{.targetRef.name} {.conditions.ready} {.conditions.serving} {.conditions.terminating}{"\n"}{end}`)
	var eps []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line != "" {
			eps = append(eps, line)
		}
	}
	return eps
}

// webPods lists the Running, not terminating web pods as name -> podIP and name -> node.
func (c serviceCluster) webPods() (ips, nodes map[string]string) {
	out := c.k.ok("get", "pods", "-n", "svc", "-l", "app=web", "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.status.podIP} {.spec.nodeName} {.status.phase} {.metadata.deletionTimestamp}{"\n"}{end}`)
	ips, nodes = map[string]string{}, map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[3] == "Running" {
			ips[f[0]], nodes[f[0]] = f[1], f[2]
		}
	}
	return ips, nodes
}

// TestLocalServices checks Services end to end on `skiff local` (3 servers, 2 agents on containerd, the
// service proxy's iptables and the agents' DNS), from client pods on both agents, with the stock kubectl:
// ClusterIP by every DNS form, NodePort (externalTrafficPolicy Local keeps the source), scaling to zero
// (refused at once) and back, readiness and termination leaving the endpoints, a rolling restart under load
// with no failed request, headless, SRV, PTR and ExternalName records, an established flow and name
// resolution through a kill -9 and restart of the agent, routing and DNS through a kill -9 of the Raft
// leader, and nothing left behind.
func TestLocalServices(t *testing.T) {
	parallelOnHostNetwork(t)
	requireRealRuntime(t)
	before, _ := exec.Command("iptables-save").Output()
	dir, err := os.MkdirTemp("", "skiff-services-")
	if err != nil {
		t.Fatal(err)
	}
	bin := proctest.Binary(t)
	imageDir := filepath.Join(dir, "images")
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := testimages.WriteServerTarball("skiff.test/server:1", filepath.Join(imageDir, "server.tar")); err != nil {
		t.Fatal(err)
	}
	// Cleanups run last in, first out: this one runs after upLocalCluster's `skiff local down`.
	t.Cleanup(func() {
		after, _ := exec.Command("iptables-save").Output()
		if n, m := strings.Count(string(before), "SKIFF"), strings.Count(string(after), "SKIFF"); m > n {
			t.Errorf("the host's namespace has %d SKIFF rules and chains after the test, %d before", m, n)
		}
	})
	st := upLocalCluster(t, bin, dir, "--images", imageDir)
	k := kubectl{t: t, kubeconfig: st.Kubeconfig(dir)}
	c := serviceCluster{t: t, k: k, st: st}
	k.waitNodeHealth("agent-1", "True/", 60*time.Second)
	k.waitNodeHealth("agent-2", "True/", 60*time.Second)
	k.ok("create", "namespace", "svc")
	applyYAML(t, k, `apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: svc}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 15
      containers:
      - name: web
        image: skiff.test/server:1
        imagePullPolicy: Never
        ports: [{name: http, containerPort: 8080}]
        readinessProbe: {httpGet: {path: /ready, port: http}, periodSeconds: 1, failureThreshold: 1}
        lifecycle: {preStop: {exec: {command: ["sleep", "5"]}}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: svc}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: v1
kind: Service
metadata: {name: web-headless, namespace: svc}
spec:
  clusterIP: None
  selector: {app: web}
  ports: [{name: http, port: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web-np, namespace: svc}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: v1
kind: Service
metadata: {name: web-local, namespace: svc}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: svc}
spec:
  type: ExternalName
  externalName: web.svc.svc.cluster.local
---
apiVersion: v1
kind: Service
metadata: {name: web-sticky, namespace: svc}
spec:
  sessionAffinity: ClientIP
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: v1
kind: Service
metadata: {name: self, namespace: svc}
spec:
  selector: {role: client-1}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: client-1, namespace: svc, labels: {role: client-1}}
spec:
  nodeName: agent-1
  containers: [{name: c, image: skiff.test/server:1, imagePullPolicy: Never}]
---
apiVersion: v1
kind: Pod
metadata: {name: client-2, namespace: svc}
spec:
  nodeName: agent-2
  containers: [{name: c, image: skiff.test/server:1, imagePullPolicy: Never}]
`)
	// From here on kubectl works in the svc namespace, through a copy of the cluster kubeconfig (a context per
	// server, so that it can move off a killed leader).
	k = kubectl{t: t, kubeconfig: filepath.Join(dir, "svc.kubeconfig")}
	if err := os.WriteFile(k.kubeconfig, []byte(readFile(t, localcluster.ClusterKubeconfig(dir))), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, server := range []string{"server-1", "server-2", "server-3"} {
		k.ok("config", "set-context", server, "--namespace", "svc")
	}
	k.ok("config", "use-context", "server-1")
	c.k = k
	k.ok("wait", "--for=condition=Available", "deployment/web", "--timeout=120s")
	k.ok("wait", "--for=condition=Ready", "pod/client-1", "pod/client-2", "--timeout=120s")
	proctest.WaitFor(t, "3 ready web endpoints", 30*time.Second, func() error {
		if eps := c.endpoints("web"); len(eps) != 3 || strings.Count(strings.Join(eps, "\n"), " true true false") != 3 {
			return fmt.Errorf("endpoints %q", eps)
		}
		return nil
	})
	clusterIP := strings.TrimSpace(k.ok("get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"))

	// ClusterIP by every name, from both agents: 200 requests, all answered, by at least two backends (once
	// both proxies have programmed the three endpoints the EndpointSlice just listed).
	for _, client := range []string{"client-1", "client-2"} {
		proctest.WaitFor(t, client+" reaching every web pod", 10*time.Second, func() error {
			if s := c.fetch(client, "http://"+clusterIP+"/", 30); len(s.Backends) != 3 {
				return fmt.Errorf("%+v", s)
			}
			return nil
		})
	}
	for _, client := range []string{"client-1", "client-2"} {
		for _, name := range []string{"web", "web.svc", "web.svc.svc.cluster.local", clusterIP} {
			s := c.fetch(client, "http://"+name+"/", 50)
			if s.OK != 50 || len(s.Backends) < 2 {
				t.Fatalf("%s -> %s: %+v", client, name, s)
			}
		}
	}
	// Session affinity keeps a client on one backend; a pod reaches itself through its own Service (hairpin).
	if s := c.fetch("client-2", "http://web-sticky/", 20); s.OK != 20 || len(s.Backends) != 1 {
		t.Fatalf("sessionAffinity ClientIP: %+v", s)
	}
	if s := c.fetch("client-1", "http://self/", 5); s.OK != 5 || s.Backends["client-1"] != 5 {
		t.Fatalf("client-1 through its own Service: %+v", s)
	}
	// The README's line: busybox's nc reaches the Service by name through the cluster DNS.
	applyYAML(t, k, `apiVersion: v1
kind: Pod
metadata: {name: readme-client, namespace: svc}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: skiff.local/busybox:1
    command: ["sh", "-c", "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 web 80 | grep -q hostname=web-"]
`)
	proctest.WaitFor(t, "readme-client Completed", 60*time.Second, func() error {
		if s := k.podStatusColumn("readme-client"); s != "Completed" {
			return fmt.Errorf("STATUS %s", s)
		}
		return nil
	})
	mustContain(t, "kubectl get endpointslices", k.ok("get", "endpointslices", "-l", "kubernetes.io/service-name=web"), "IPv4", "8080")
	mustContain(t, "kubectl describe svc", k.ok("describe", "svc", "web"), "Endpoints:", ":8080", "TargetPort:")

	// NodePort on both agents' addresses, from another host and from a pod.
	nodePort := strings.TrimSpace(k.ok("get", "svc", "web-np", "-o", "jsonpath={.spec.ports[0].nodePort}"))
	for _, agent := range []string{"agent-1", "agent-2"} {
		h, _ := st.Host(agent)
		url := "http://" + h.IP + ":" + nodePort + "/"
		if out, err := c.curl("server-1", url); err != nil || !strings.Contains(out, "hostname=web-") {
			t.Fatalf("NodePort %s from server-1: %v %s", url, err, out)
		}
		if s := c.fetch("client-1", url, 5); s.OK != 5 {
			t.Fatalf("NodePort %s from client-1: %+v", url, s)
		}
	}
	// externalTrafficPolicy Local: the backend sees the client's own address.
	localPort := strings.TrimSpace(k.ok("get", "svc", "web-local", "-o", "jsonpath={.spec.ports[0].nodePort}"))
	_, nodes := c.webPods()
	var withPod string
	for _, n := range nodes {
		withPod = n
	}
	h, _ := st.Host(withPod)
	s1, _ := st.Host("server-1")
	if out, err := c.curl("server-1", "http://"+h.IP+":"+localPort+"/"); err != nil || !strings.Contains(out, "client="+s1.IP+":") {
		t.Fatalf("externalTrafficPolicy Local NodePort on %s from server-1 (%s): %v %s", withPod, s1.IP, err, out)
	}

	// DNS: headless Services resolve to the ready pods, SRV for a named port, PTR for a ClusterIP, ExternalName
	// as a CNAME.
	ips, _ := c.webPods()
	got, errMsg := c.resolve("client-1", "A", "web-headless")
	want := slices.Sorted(func(yield func(string) bool) {
		for _, ip := range ips {
			if !yield(ip) {
				return
			}
		}
	})
	if slices.Sort(got); errMsg != "" || !slices.Equal(got, want) {
		t.Fatalf("web-headless resolves to %v (%s), want the pods %v", got, errMsg, want)
	}
	if got, errMsg := c.resolve("client-2", "SRV", "_http._tcp.web.svc.svc.cluster.local"); errMsg != "" || len(got) != 1 || got[0] != "web.svc.svc.cluster.local.:80" {
		t.Fatalf("SRV of web's named port: %v %s", got, errMsg)
	}
	if got, errMsg := c.resolve("client-2", "PTR", clusterIP); errMsg != "" || len(got) != 1 || got[0] != "web.svc.svc.cluster.local." {
		t.Fatalf("PTR of %s: %v %s", clusterIP, got, errMsg)
	}
	if got, errMsg := c.resolve("client-1", "CNAME", "ext.svc.svc.cluster.local"); errMsg != "" || len(got) != 1 || got[0] != "web.svc.svc.cluster.local." {
		t.Fatalf("ExternalName ext: %v %s", got, errMsg)
	}

	// Scaled to zero: refused at once, not a timeout; scaled back: answered once a pod is Ready.
	k.ok("scale", "deployment", "web", "--replicas=0")
	proctest.WaitFor(t, "no web endpoints", 60*time.Second, func() error {
		if eps := c.endpoints("web"); len(eps) != 0 {
			return fmt.Errorf("endpoints %q", eps)
		}
		return nil
	})
	// The proxy syncs at most once a second.
	proctest.WaitFor(t, "web refused", 10*time.Second, func() error {
		if s := c.fetch("client-1", "http://"+clusterIP+"/", 1); s.Failed != 1 || !strings.Contains(strings.Join(s.Errors, ""), "connection refused") {
			return fmt.Errorf("%+v", s)
		}
		return nil
	})
	k.ok("scale", "deployment", "web", "--replicas=3")
	var ready time.Time
	proctest.WaitFor(t, "a web pod Ready", 60*time.Second, func() error {
		out := k.ok("get", "pods", "-l", "app=web", "-o", `jsonpath={.items[*].status.conditions[?(@.type=="Ready")].status}`)
		if !strings.Contains(out, "True") {
			return fmt.Errorf("ready: %q", out)
		}
		ready = time.Now()
		return nil
	})
	proctest.WaitFor(t, "web answers again", 30*time.Second, func() error {
		if s := c.fetch("client-2", "http://"+clusterIP+"/", 1); s.OK != 1 {
			return fmt.Errorf("%+v", s)
		}
		return nil
	})
	t.Logf("web answered %v after kubectl saw its first pod Ready (docs/BENCHMARKS.md has the measured latency)", time.Since(ready).Round(10*time.Millisecond))
	k.ok("wait", "--for=condition=Available", "deployment/web", "--timeout=120s")

	// A pod whose readiness fails leaves the endpoints and the rules; a deleted pod turns terminating at once.
	proctest.WaitFor(t, "3 web pods Running", 60*time.Second, func() error {
		if ips, _ = c.webPods(); len(ips) != 3 {
			return fmt.Errorf("%v", ips)
		}
		return nil
	})
	_, nodes = c.webPods()
	var sick string
	for name := range ips {
		sick = name
		break
	}
	if out, err := c.curl(nodes[sick], "http://"+ips[sick]+":8080/unready"); err != nil {
		t.Fatalf("/unready on %s: %v %s", sick, err, out)
	}
	proctest.WaitFor(t, sick+" not ready in the EndpointSlice", 30*time.Second, func() error {
		if eps := c.endpoints("web"); !slices.Contains(eps, sick+" false false false") {
			return fmt.Errorf("endpoints %q", eps)
		}
		return nil
	})
	proctest.WaitFor(t, sick+" out of the rules", 10*time.Second, func() error {
		if s := c.fetch("client-1", "http://web/", 30); s.OK != 30 || s.Backends[sick] > 0 {
			return fmt.Errorf("%+v", s)
		}
		return nil
	})
	k.ok("delete", "pod", sick, "--wait=false")
	proctest.WaitFor(t, sick+" terminating in the EndpointSlice", 10*time.Second, func() error {
		for _, ep := range c.endpoints("web") {
			if strings.HasPrefix(ep, sick+" ") && strings.HasSuffix(ep, " true") {
				return nil
			}
		}
		return fmt.Errorf("endpoints %q", c.endpoints("web"))
	})
	k.ok("wait", "--for=condition=Available", "deployment/web", "--timeout=120s")

	// A rolling restart under a steady load: not one request fails.
	c.pod("client-1", "/load/start?rate=20&url=http://web/", nil)
	k.ok("rollout", "restart", "deployment/web")
	k.ok("rollout", "status", "deployment/web", "--timeout=180s")
	time.Sleep(2 * time.Second)
	var load fetchSummary
	c.pod("client-1", "/load/stop", &load)
	replicaSets := map[string]bool{} // web-<template hash>-<suffix>: old and new pods both answered
	for backend := range load.Backends {
		replicaSets[backend[:strings.LastIndexByte(backend, '-')]] = true
	}
	if load.Failed != 0 || load.OK < 20 || len(replicaSets) < 2 {
		t.Fatalf("requests during the rolling restart: %+v", load)
	}
	t.Logf("rolling restart under load: %d requests, none failed, backends %v", load.OK, load.Backends)

	// kill -9 and restart of an agent: a flow it carries through the ClusterIP keeps working.
	c.pod("client-2", "/load/start?rate=10&keepalive=1&url=http://"+clusterIP+"/", nil)
	time.Sleep(time.Second)
	dnsPID := func() string {
		return strings.TrimSpace(readFile(t, filepath.Join(dir, "agent-2", "data", "dns", "pid")))
	}
	pid := dnsPID()
	if err := st.Kill("agent-2"); err != nil {
		t.Fatal(err)
	}
	// The node's DNS lives in a process of its own: names resolve while the agent is down.
	if got, errMsg := c.resolve("client-2", "A", "web-np.svc.svc.cluster.local"); errMsg != "" || len(got) != 1 {
		t.Fatalf("client-2 resolving with its agent killed: %v %s", got, errMsg)
	}
	time.Sleep(time.Second)
	if err := st.Start(dir, "agent-2"); err != nil {
		t.Fatal(err)
	}
	k.waitNodeHealth("agent-2", "True/", 60*time.Second)
	if again := dnsPID(); again != pid {
		t.Fatalf("the restarted agent replaced its node's DNS process (pid %s, was %s) instead of adopting it", again, pid)
	}
	time.Sleep(3 * time.Second)
	c.pod("client-2", "/load/stop", &load)
	if load.Failed != 0 || load.NewConns != 1 || load.OK < 30 {
		t.Fatalf("a kept-alive flow through the agent's restart: %+v", load)
	}

	// kill -9 of the Raft leader: Services keep routing and names keep resolving.
	leader := raftLeader(t, bin, st.Kubeconfig(dir))
	if err := st.Kill(leader); err != nil {
		t.Fatal(err)
	}
	survivor := "server-1"
	if leader == "server-1" {
		survivor = "server-2"
	}
	k.ok("config", "use-context", survivor)
	for _, client := range []string{"client-1", "client-2"} {
		if s := c.fetch(client, "http://web/", 20); s.OK != 20 {
			t.Fatalf("%s through web with the leader killed: %+v", client, s)
		}
		if got, errMsg := c.resolve(client, "A", "web.svc.svc.cluster.local"); errMsg != "" || len(got) != 1 || got[0] != clusterIP {
			t.Fatalf("%s resolving web with the leader killed: %v %s", client, got, errMsg)
		}
	}
	// The proxy programmed its chains in the agents' namespaces (they go with them at `down`).
	for _, agent := range []string{"agent-1", "agent-2"} {
		if out, err := c.inHost(agent, "iptables-save", "-t", "nat"); err != nil || !strings.Contains(out, clusterIP) {
			t.Fatalf("%s's nat table has no rule for %s: %v\n%s", agent, clusterIP, err, out)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
