package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/testimages"
)

// crdBundles are real CRD bundles of public projects, read unmodified from their Go modules (the module
// proxy serves them with the rest of the module cache): cert-manager's, the Prometheus operator's (large
// enough to need server-side apply) and the Gateway API's standard channel (CEL rules throughout).
var crdBundles = []struct{ module, dir string }{
	{"github.com/cert-manager/cert-manager@v1.21.2", "deploy/crds"},
	{"github.com/prometheus-operator/prometheus-operator@v0.85.0", "example/prometheus-operator-crd"},
	{"sigs.k8s.io/gateway-api@v1.6.3", "config/crd/standard"},
}

// moduleDir downloads a module (or finds it in the module cache) and returns its directory.
func moduleDir(t *testing.T, module string) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", module).Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v\n%s", module, err, out)
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		t.Fatalf("go mod download %s: %v %s", module, err, info.Error)
	}
	return info.Dir
}

// TestCustomResourcesWithKubectl is issue 28's kubectl acceptance on three servers: a CRD applied through
// one server is served by every server; api-resources, explain, get -w, edit, patch --subresource=status and
// scale work on its objects; every APIService is Available; and the CRD bundles of cert-manager, the
// Prometheus operator and the Gateway API install with `kubectl apply --server-side` and validate and default
// their objects as on kube-apiserver; and a Helm chart with a crds/ folder and templates of its custom kind
// installs, upgrades and uninstalls.
func TestCustomResourcesWithKubectl(t *testing.T) {
	parallel(t)
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not installed")
	}
	c := proctest.NewCluster(t, 3, "")
	for _, p := range c.Procs {
		c.Start(p)
	}
	var ks []kubectl
	for _, p := range c.Procs {
		k := kubectl{t: t, kubeconfig: p.Kubeconfig()}
		k.waitForAPI("kube-system")
		ks = append(ks, k)
	}
	k1, k2, k3 := ks[0], ks[1], ks[2]

	t.Run("every server serves a new CRD", func(t *testing.T) {
		start := time.Now()
		k1.withT(t).ok("apply", "-f", "testdata/crontab-crd.yaml")
		// kubectl 1.32's wait gives up at once on a CRD whose status.conditions is still null (the naming
		// controller has not set any yet), as it is right after a create on kube-apiserver too: ask again.
		proctest.WaitFor(t, "the CRD Established", 30*time.Second, func() error {
			if out, err := k1.withT(t).run("wait", "--for=condition=Established", "crd/crontabs.stable.example.com", "--timeout=30s"); err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
		for i, k := range ks {
			k := k.withT(t)
			proctest.WaitFor(t, fmt.Sprintf("server %d serving crontabs", i+1), 30*time.Second, func() error {
				if out, err := k.run("get", "crontabs"); err != nil {
					return fmt.Errorf("%v: %s", err, out)
				}
				return nil
			})
			t.Logf("server %d serves crontabs %v after the apply", i+1, time.Since(start).Round(time.Millisecond))
		}
		applyYAML(t, k3.withT(t), `apiVersion: stable.example.com/v1
kind: CronTab
metadata: {name: nightly, labels: {team: a}}
spec: {cronSpec: "0 3 * * *", image: "backup:1"}
`)
		mustContain(t, "get through another server", k2.withT(t).ok("get", "ct", "nightly"), "NAME", "SPEC", "REPLICAS", "nightly", "0 3 * * *", "1")
		mustContain(t, "get all", k1.withT(t).ok("get", "all"), "crontab.stable.example.com/nightly")
		mustContain(t, "selectable field", k1.withT(t).ok("get", "crontabs", "--field-selector", "spec.image=backup:1"), "nightly")
	})

	t.Run("kubectl verbs", func(t *testing.T) {
		k := k2.withT(t)
		mustContain(t, "api-resources", k.ok("api-resources", "--api-group=stable.example.com"), "crontabs", "ct", "stable.example.com/v1", "true", "CronTab")
		mustContain(t, "explain", k.ok("explain", "crontab.spec"), "cronSpec", "The schedule, in cron format.")
		bad := `apiVersion: stable.example.com/v1
kind: CronTab
metadata: {name: bad}
spec: {cronSpec: "never", replicas: 11}
`
		out, _ := runWithStdin(k, bad, "apply", "-f", "-")
		mustContain(t, "validation", out, "spec.cronSpec", "at most 10 replicas")

		// A watch through one server sees an edit, a status patch and a scale made through others.
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		watch := exec.CommandContext(ctx, "kubectl", "--kubeconfig", k3.kubeconfig, "get", "crontabs", "-w", "--output-watch-events", "-o", "custom-columns=EVENT:.type,NAME:.object.metadata.name,IMAGE:.object.spec.image,REPLICAS:.object.spec.replicas,STATUS:.object.status.replicas")
		stdout, err := watch.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := watch.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 100)
		go func() {
			s := bufio.NewScanner(stdout)
			for s.Scan() {
				lines <- s.Text()
			}
			close(lines)
		}()
		defer func() { cancel(); watch.Wait() }()
		waitLine := func(what string, want ...string) {
			t.Helper()
			for {
				select {
				case line, ok := <-lines:
					if !ok {
						t.Fatalf("watch ended before %s", what)
					}
					all := true
					for _, w := range want {
						all = all && strings.Contains(line, w)
					}
					if all {
						return
					}
				case <-ctx.Done():
					t.Fatalf("no watch event for %s", what)
				}
			}
		}
		waitLine("the first listing", "ADDED", "nightly")
		editor := filepath.Join(t.TempDir(), "editor.sh")
		if err := os.WriteFile(editor, []byte("#!/bin/sh\nsed -i 's/image: backup:1/image: backup:2/' \"$1\"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		edit := exec.Command("kubectl", "--kubeconfig", k1.kubeconfig, "edit", "crontab", "nightly")
		edit.Env = append(os.Environ(), "KUBE_EDITOR="+editor)
		if out, err := edit.CombinedOutput(); err != nil || !strings.Contains(string(out), "edited") {
			t.Fatalf("kubectl edit: %v\n%s", err, out)
		}
		waitLine("the edit", "MODIFIED", "backup:2")
		k1.withT(t).ok("patch", "crontab", "nightly", "--subresource=status", "--type=merge", "-p", `{"status":{"replicas":1,"selector":"team=a"}}`)
		waitLine("the status patch", "MODIFIED", "backup:2", "1")
		k2.withT(t).ok("scale", "crontab", "nightly", "--replicas=3")
		waitLine("the scale", "MODIFIED", "backup:2", "3")
	})

	t.Run("APIServices", func(t *testing.T) {
		k := k1.withT(t)
		proctest.WaitFor(t, "every APIService Available", 30*time.Second, func() error {
			out, err := k.run("get", "apiservices", "--no-headers")
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			for _, want := range []string{"v1.stable.example.com", "v1.apps", "v1.apiextensions.k8s.io", "v1beta1.metrics.k8s.io"} {
				if !strings.Contains(out, want) {
					return fmt.Errorf("%s missing:\n%s", want, out)
				}
			}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				if f := strings.Fields(line); len(f) < 3 || f[2] != "True" {
					return fmt.Errorf("not Available: %s", line)
				}
			}
			return nil
		})
	})

	t.Run("real CRD bundles", func(t *testing.T) {
		k := k1.withT(t)
		for _, b := range crdBundles {
			dir := filepath.Join(moduleDir(t, b.module), b.dir)
			out := k.ok("apply", "--server-side", "-f", dir)
			t.Logf("%s: %d CRDs applied", b.module, strings.Count(out, "serverside-applied"))
		}
		k.ok("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
		// Objects as each project's users write them: valid ones are stored with their defaults, invalid ones
		// are refused with the field named, by the OpenAPI schema or a CEL rule.
		applyYAML(t, k, `apiVersion: cert-manager.io/v1
kind: Issuer
metadata: {name: selfsigned}
spec: {selfSigned: {}}
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: web}
spec:
  secretName: web-tls
  dnsNames: [web.example.com]
  issuerRef: {name: selfsigned}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  endpoints: [{port: http}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: skiff}
spec: {controllerName: example.com/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web}
spec:
  parentRefs: [{name: gw}]
  rules:
  - backendRefs: [{name: web, port: 80}]
`)
		// Gateway API defaults: a rule without matches matches every path by prefix.
		if got := k.ok("get", "httproute", "web", "-o", "jsonpath={.spec.rules[0].matches[0].path.type} {.spec.rules[0].matches[0].path.value}"); got != "PathPrefix /" {
			t.Errorf("HTTPRoute defaults: %q; want \"PathPrefix /\"", got)
		}
		out, _ := runWithStdin(k, `apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: nosecret}
spec:
  dnsNames: [a.example.com]
  issuerRef: {name: selfsigned}
`, "apply", "-f", "-")
		mustContain(t, "cert-manager schema", out, "spec.secretName", "Required value")
		out, _ = runWithStdin(k, `apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: badpath}
spec:
  rules:
  - matches: [{path: {type: PathPrefix, value: "/a//b"}}]
`, "apply", "-f", "-")
		mustContain(t, "Gateway API CEL rule", out, "must not contain '//'")
		out, _ = runWithStdin(k, `apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: bad}
spec:
  selector: {}
  endpoints: [{port: http, scheme: gopher}]
`, "apply", "-f", "-")
		mustContain(t, "Prometheus operator schema", out, "scheme", "Unsupported value")
	})

	t.Run("Helm chart with crds/", func(t *testing.T) {
		helmBin := helmBinary(t)
		helm := func(args ...string) (string, error) {
			out, err := exec.Command(helmBin, append([]string{"--kubeconfig", k1.kubeconfig}, args...)...).CombinedOutput()
			return string(out), err
		}
		helmOK := func(args ...string) string {
			t.Helper()
			out, err := helm(args...)
			if err != nil {
				t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			return out
		}
		const chart = "testdata/charts/backups"
		// Install: Helm creates the CRD of crds/ first, waits for it to be served, then the templates' objects.
		helmOK("install", "backups", chart, "--wait", "--timeout=60s")
		k := k2.withT(t)
		mustContain(t, "installed schedule", k.ok("get", "bs", "nightly", "-o", "jsonpath={.spec.cron} {.spec.keep} {.spec.retentionDays}"), "0 3 * * * 7 30")
		// Upgrade: a changed schedule and a new one, whose keep the CRD's schema defaults.
		helmOK("upgrade", "backups", chart, "--wait", "--timeout=60s",
			"--set", "schedules[0].name=nightly,schedules[0].cron=0 4 * * *,schedules[0].keep=14",
			"--set", "schedules[1].name=weekly,schedules[1].cron=0 5 * * 0")
		mustContain(t, "upgraded schedule", k.ok("get", "bs", "nightly", "-o", "jsonpath={.spec.cron} {.spec.keep}"), "0 4 * * * 14")
		mustContain(t, "added schedule, defaulted", k.ok("get", "bs", "weekly", "-o", "jsonpath={.spec.cron} {.spec.keep} {.spec.retentionDays}"), "0 5 * * 0 3 30")
		mustContain(t, "settings", k.ok("get", "configmap", "backups-settings", "-o", "jsonpath={.data.schedules}"), "2")
		// An upgrade the CRD's CEL rule refuses fails and changes nothing.
		out, err := helm("upgrade", "backups", chart, "--set", "schedules[0].name=nightly,schedules[0].cron=0 4 * * *,schedules[0].keep=40",
			"--set", "schedules[1].name=weekly,schedules[1].cron=0 5 * * 0")
		if err == nil {
			t.Fatalf("helm upgrade past the CEL rule succeeded:\n%s", out)
		}
		mustContain(t, "refused upgrade", out, "keep must not exceed retentionDays")
		mustContain(t, "unchanged after the refused upgrade", k.ok("get", "bs", "nightly", "-o", "jsonpath={.spec.keep}"), "14")
		mustContain(t, "history", helmOK("history", "backups"), "deployed", "failed")
		// Uninstall removes the templates' objects and, as Helm does, leaves the CRD of crds/.
		helmOK("uninstall", "backups", "--wait", "--timeout=60s")
		proctest.WaitFor(t, "the chart's objects gone", 30*time.Second, func() error {
			if out := k.ok("get", "bs,configmap", "-l", "app.kubernetes.io/instance=backups", "-o", "name"); out != "" {
				return fmt.Errorf("left: %s", out)
			}
			if out, _ := k.run("get", "configmap", "backups-settings"); !strings.Contains(out, "NotFound") {
				return fmt.Errorf("settings left: %s", out)
			}
			return nil
		})
		k.ok("get", "crd", "backupschedules.charts.skiff.dev")
	})
}

// helmModule is the Helm release the chart test installs with, built from the module proxy with its own
// module graph (it is not a dependency of Skiff's).
const helmModule = "helm.sh/helm/v3/cmd/helm@v3.22.0"

// helmBinary builds helm (once the build cache is warm, only a link) into a temporary directory.
func helmBinary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "install", helmModule)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install %s: %v\n%s", helmModule, err, out)
	}
	return filepath.Join(dir, "helm")
}

// runWithStdin runs kubectl with input on its standard input, returning its output and error.
func runWithStdin(k kubectl, input string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", k.kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(input)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestExtensionAPIServer is issue 28's aggregation acceptance: an extension API server in a pod (the tree's
// extserver, built with k8s.io/apiserver like metrics-server) is reached through an APIService backed by its
// Service with the stock kubectl, and sees the caller's identity, which the aggregator passes on with its
// front-proxy client certificate and the extension server trusts through
// kube-system/extension-apiserver-authentication. Discovery and the other groups keep working while the
// APIService is unavailable.
func TestExtensionAPIServer(t *testing.T) {
	parallel(t)
	requireRealRuntime(t)
	// skiff local: the pod reaches the API through the kubernetes Service, and the server reaches the pod
	// through its route to the agent's pod CIDR (route_pod_cidrs), as on a real network.
	dir, err := os.MkdirTemp("", "skiff-local-")
	if err != nil {
		t.Fatal(err)
	}
	imageDir := filepath.Join(dir, "images")
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		t.Fatal(err)
	}
	const image = "skiff.test/extserver:1"
	if err := testimages.WriteProgramTarball(testimages.ExtensionServer, image, filepath.Join(imageDir, "extserver.tar")); err != nil {
		t.Fatal(err)
	}
	st := upLocalCluster(t, proctest.Binary(t), dir, "--servers", "1", "--agents", "1", "--images", imageDir)
	k := kubectl{t: t, kubeconfig: st.Kubeconfig(dir)}
	k.waitNodeHealth("agent-1", "True/", 90*time.Second)
	t.Cleanup(func() {
		if t.Failed() {
			for _, what := range [][]string{{"get", "apiservices"}, {"get", "pods", "-A", "-o", "wide"}, {"logs", "-n", "whoami", "deploy/whoami"}, {"get", "events", "-A"}} {
				out, _ := k.run(what...)
				t.Logf("kubectl %s:\n%s", strings.Join(what, " "), out)
			}
		}
	})
	applyYAML(t, k, fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: whoami}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: whoami, namespace: whoami}
---
# What an extension API server is given, as on Kubernetes: it reads the authentication ConfigMap and
# delegates authentication and authorization to the cluster.
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: whoami-auth-reader, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: extension-apiserver-authentication-reader}
subjects: [{kind: ServiceAccount, name: whoami, namespace: whoami}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: whoami-auth-delegator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:auth-delegator}
subjects: [{kind: ServiceAccount, name: whoami, namespace: whoami}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: whoami, namespace: whoami}
spec:
  selector: {matchLabels: {app: whoami}}
  template:
    metadata: {labels: {app: whoami}}
    spec:
      serviceAccountName: whoami
      containers:
      - name: whoami
        image: %s
        imagePullPolicy: Never
        ports: [{containerPort: 8443}]
---
apiVersion: v1
kind: Service
metadata: {name: whoami, namespace: whoami}
spec:
  selector: {app: whoami}
  ports: [{port: 443, targetPort: 8443}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1alpha1.whoami.skiff.dev}
spec:
  group: whoami.skiff.dev
  version: v1alpha1
  service: {namespace: whoami, name: whoami}
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 1000
  versionPriority: 15
`, image))
	proctest.WaitFor(t, "the APIService Available", 3*time.Minute, func() error {
		out, err := k.run("get", "apiservice", "v1alpha1.whoami.skiff.dev", "-o", "jsonpath={.status.conditions[?(@.type==\"Available\")].status}")
		if err != nil || out != "True" {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	// The proxy subresources reach the pod, through its Service and directly, and the node's agent, as
	// kube-apiserver's do (the extension server answers /healthz to anyone).
	pod := k.ok("get", "pods", "-n", "whoami", "-l", "app=whoami", "-o", "jsonpath={.items[0].metadata.name}")
	for _, path := range []string{
		"/api/v1/namespaces/whoami/services/https:whoami:443/proxy/healthz",
		"/api/v1/namespaces/whoami/pods/https:" + pod + ":8443/proxy/healthz",
		"/api/v1/nodes/agent-1/proxy/healthz",
	} {
		if out := k.ok("get", "--raw", path); out != "ok" {
			t.Errorf("kubectl get --raw %s: %q, want ok", path, out)
		}
	}
	// The admin's identity reaches the extension server.
	mustContain(t, "kubectl get whoamis", k.ok("get", "whoamis"), "NAME", "USER", "me", "skiff-admin", "system:masters")
	// A service account allowed to read whoamis, and the extension server's own authorization of it.
	applyYAML(t, k, `apiVersion: v1
kind: ServiceAccount
metadata: {name: reader, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: whoami-reader}
rules: [{apiGroups: [whoami.skiff.dev], resources: [whoamis], verbs: [get, list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: whoami-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: whoami-reader}
subjects: [{kind: ServiceAccount, name: reader, namespace: default}]
`)
	token := strings.TrimSpace(k.ok("create", "token", "reader", "-n", "default"))
	reader := asToken(t, k, "reader", token)
	mustContain(t, "get whoami as a service account", reader.ok("get", "whoami", "me", "-o", "jsonpath={.user} {.groups}"),
		"system:serviceaccount:default:reader", "system:serviceaccounts")
	// Without the binding the extension server refuses it (its SubjectAccessReview says no).
	k.ok("delete", "clusterrolebinding", "whoami-reader")
	proctest.WaitFor(t, "the service account refused", 30*time.Second, func() error {
		if out, err := reader.run("get", "whoamis"); err == nil || !strings.Contains(out, "Forbidden") && !strings.Contains(out, "forbidden") {
			return fmt.Errorf("still allowed: %v %s", err, out)
		}
		return nil
	})

	// An unavailable APIService (its pods gone) is marked so, and breaks nothing else.
	k.ok("scale", "-n", "whoami", "deploy/whoami", "--replicas=0")
	proctest.WaitFor(t, "the APIService unavailable", 2*time.Minute, func() error {
		out, _ := k.run("get", "apiservice", "v1alpha1.whoami.skiff.dev", "-o", "jsonpath={.status.conditions[?(@.type==\"Available\")].status}")
		if out != "False" {
			return fmt.Errorf("Available=%s", out)
		}
		return nil
	})
	k.ok("get", "pods", "-A")
	k.ok("create", "namespace", "scratch")
	k.ok("delete", "namespace", "scratch", "--timeout=60s")
}
