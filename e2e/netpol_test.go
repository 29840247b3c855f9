package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/testimages"
)

// TestLocalNetworkPolicy checks NetworkPolicy enforcement on `skiff local` (1 server, 2 agents on containerd),
// from client pods on both agents to a web pod behind a Service: a default-deny ingress policy blocks every
// client while the web pod's readiness probe (its node's own traffic) still passes; an allow rule by namespace
// and named port lets the clients of one namespace in, on that port only; an egress policy of the client
// namespace that allows DNS and the web namespace keeps name resolution and the Service working and blocks
// another namespace; the policies stay in force through a kill -9 and restart of the web pod's agent; and
// with the policies deleted everything is reachable again.
func TestLocalNetworkPolicy(t *testing.T) {
	parallel(t)
	requireRealRuntime(t)
	bin := proctest.Binary(t)
	dir := t.TempDir()
	imageDir := filepath.Join(dir, "images")
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := testimages.WriteServerTarball("skiff.test/server:1", filepath.Join(imageDir, "server.tar")); err != nil {
		t.Fatal(err)
	}
	st := upLocalCluster(t, bin, dir, "--servers", "1", "--images", imageDir)
	k := kubectl{t: t, kubeconfig: st.Kubeconfig(dir)}
	c := serviceCluster{t: t, k: k, st: st}
	k.waitNodeHealth("agent-1", "True/", 60*time.Second)
	k.waitNodeHealth("agent-2", "True/", 60*time.Second)
	k.waitForAPI("default")
	pod := func(ns, name, node string, labels string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: {%s}}
spec:
  nodeName: %s
  containers:
  - name: c
    image: skiff.test/server:1
    imagePullPolicy: Never
    ports: [{name: http, containerPort: 8080}]
    readinessProbe: {httpGet: {path: /ready, port: http}, periodSeconds: 1, failureThreshold: 1}
`, name, ns, labels, node)
	}
	applyYAML(t, k, strings.Join([]string{`apiVersion: v1
kind: Namespace
metadata: {name: np-web}
---
apiVersion: v1
kind: Namespace
metadata: {name: np-client, labels: {team: client}}
---
apiVersion: v1
kind: Namespace
metadata: {name: np-other}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: np-web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
`, pod("np-web", "web", "agent-1", "app: web"),
		pod("np-client", "near", "agent-1", "role: client"), // the web pod's node: bridged traffic
		pod("np-client", "far", "agent-2", "role: client"),  // the other node: routed traffic
		pod("np-other", "stranger", "agent-2", "role: client")}, "---\n"))
	for _, p := range []string{"np-web/web", "np-client/near", "np-client/far", "np-other/stranger"} {
		ns, name, _ := strings.Cut(p, "/")
		k.ok("wait", "-n", ns, "--for=condition=Ready", "pod/"+name, "--timeout=120s")
	}
	webIP, strangerIP := k.ok("get", "pod", "-n", "np-web", "web", "-o", "jsonpath={.status.podIP}"),
		k.ok("get", "pod", "-n", "np-other", "stranger", "-o", "jsonpath={.status.podIP}")
	// reach: does client (namespace/name) get an answer from url? Each try is one connection with a 2 s
	// timeout; rules apply within a second of the write, so a few tries settle it.
	clients := map[string]podJSON{}
	for _, name := range []string{"np-client/near", "np-client/far", "np-other/stranger"} {
		ns, pod, _ := strings.Cut(name, "/")
		var p podJSON
		if err := json.Unmarshal([]byte(k.ok("get", "pod", "-n", ns, pod, "-o", "json")), &p); err != nil {
			t.Fatal(err)
		}
		clients[name] = p
	}
	reach := func(client, url string) bool {
		p := clients[client]
		out, err := c.curl(p.Spec.NodeName, fmt.Sprintf("http://%s:8080/fetch?n=1&timeout=2s&url=%s", p.Status.PodIP, url))
		if err != nil {
			t.Fatalf("%s /fetch: %v: %s", client, err, out)
		}
		var s fetchSummary
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatalf("%s /fetch: %v: %s", client, err, out)
		}
		return s.OK == 1
	}
	expect := func(step string, want map[[2]string]bool) {
		t.Helper()
		proctest.WaitFor(t, step, 20*time.Second, func() error {
			var wrong []string
			for pair, ok := range want {
				if got := reach(pair[0], pair[1]); got != ok {
					wrong = append(wrong, fmt.Sprintf("%s -> %s: reached=%v", pair[0], pair[1], got))
				}
			}
			if len(wrong) > 0 {
				return fmt.Errorf("%s", strings.Join(wrong, "; "))
			}
			return nil
		})
	}
	webSvc := "http://web.np-web.svc.cluster.local/"
	webPod := "http://" + webIP + ":8080/"
	strangerPod := "http://" + strangerIP + ":8080/"
	expect("everything reachable without policies", map[[2]string]bool{
		{"np-client/near", webSvc}: true, {"np-client/far", webSvc}: true, {"np-other/stranger", webPod}: true,
		{"np-client/far", strangerPod}: true,
	})

	applyYAML(t, k, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny, namespace: np-web}
spec:
  podSelector: {}
  policyTypes: [Ingress]
`)
	expect("default deny", map[[2]string]bool{
		{"np-client/near", webSvc}: false, {"np-client/far", webSvc}: false, {"np-client/far", webPod}: false,
		{"np-other/stranger", webPod}: false, {"np-client/far", strangerPod}: true,
	})
	// The kubelet's probes come from the node and pass: the pod stays Ready.
	time.Sleep(3 * time.Second)
	if ready := k.ok("get", "pod", "-n", "np-web", "web", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`); ready != "True" {
		t.Errorf("web pod Ready=%s under a default-deny ingress policy: its node's probes were blocked", ready)
	}

	applyYAML(t, k, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-clients, namespace: np-web}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {team: client}}}]
    ports: [{port: http}]
`)
	expect("allow by namespace and port", map[[2]string]bool{
		{"np-client/near", webSvc}: true, {"np-client/far", webSvc}: true, {"np-client/far", webPod}: true,
		{"np-other/stranger", webPod}: false,
	})

	applyYAML(t, k, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress, namespace: np-client}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]
  - to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: np-web}}}]
`)
	expect("egress to DNS and the web namespace only", map[[2]string]bool{
		{"np-client/near", webSvc}: true, {"np-client/far", webSvc}: true, {"np-client/far", strangerPod}: false,
		{"np-other/stranger", webPod}: false,
	})

	// The web pod's agent killed and restarted: its rules stay in force the whole time.
	if err := st.Kill("agent-1"); err != nil {
		t.Fatal(err)
	}
	if reach("np-other/stranger", webPod) {
		t.Error("the stranger reached the web pod while its agent was down")
	}
	if err := st.Start(dir, "agent-1"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if reach("np-other/stranger", webPod) {
			t.Fatalf("the stranger reached the web pod %d s after its agent restarted", i)
		}
		time.Sleep(time.Second)
	}
	k.waitNodeHealth("agent-1", "True/", 60*time.Second)
	expect("after the agent's restart", map[[2]string]bool{
		{"np-client/near", webSvc}: true, {"np-client/far", webPod}: true, {"np-other/stranger", webPod}: false,
	})

	k.ok("delete", "networkpolicy", "-n", "np-web", "--all")
	k.ok("delete", "networkpolicy", "-n", "np-client", "--all")
	expect("policies deleted", map[[2]string]bool{
		{"np-client/near", webSvc}: true, {"np-other/stranger", webPod}: true, {"np-client/far", strangerPod}: true,
	})
}
