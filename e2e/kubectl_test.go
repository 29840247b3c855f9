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
)

// kubectl runs the machine's kubectl, unmodified, against one server's admin kubeconfig.
type kubectl struct {
	t          *testing.T
	kubeconfig string
}

func (k kubectl) run(args ...string) (string, error) {
	// No kubectl call may hang the suite.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", k.kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// ok runs kubectl and fails the test on error.
func (k kubectl) ok(args ...string) string {
	k.t.Helper()
	out, err := k.run(args...)
	if err != nil {
		k.t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// fails runs kubectl, expects an error, and returns the output.
func (k kubectl) fails(args ...string) string {
	k.t.Helper()
	out, err := k.run(args...)
	if err == nil {
		k.t.Fatalf("kubectl %s succeeded, expected an error:\n%s", strings.Join(args, " "), out)
	}
	return out
}

// waitForAPI waits until the API answers through k's kubeconfig and namespace has its default service account,
// without which the ServiceAccount admission refuses pods (the leader's controller makes it a moment after the
// namespace, later still on a loaded machine).
func (k kubectl) waitForAPI(namespace string) {
	k.t.Helper()
	proctest.WaitFor(k.t, "the API through "+k.kubeconfig, 60*time.Second, func() error {
		if out, err := k.run("get", "namespace", namespace); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if out, err := k.run("get", "serviceaccount", "default", "-n", namespace); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
}

func mustContain(t *testing.T, what, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Fatalf("%s: output lacks %q:\n%s", what, w, out)
		}
	}
}

// TestKubectlAgainstThreeServers drives three `skiff server` processes with the stock kubectl, through the
// admin kubeconfigs of different peers.
func TestKubectlAgainstThreeServers(t *testing.T) {
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

	// apply through one peer, read through another. The namespace and its pod come in one apply, and the pod
	// needs the namespace's default service account, which the leader's controller makes a moment after the
	// namespace. Like kube-apiserver, the admission looks for it for about a second and then refuses the pod;
	// on a loaded machine the controller can take longer, so a refused apply is repeated once the account exists.
	out, err := k1.run("apply", "-f", "testdata/app.yaml")
	if err != nil && strings.Contains(out, `serviceaccount "default" not found`) {
		k1.waitForAPI("demo")
		out += k1.ok("apply", "-f", "testdata/app.yaml")
	} else if err != nil {
		t.Fatalf("kubectl apply -f testdata/app.yaml: %v\n%s", err, out)
	}
	mustContain(t, "first apply", out, "namespace/demo created", "deployment.apps/web created", "service/web created", "pod/bare created")
	out = k2.ok("apply", "-f", "testdata/app.yaml")
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		// stringData is write-only (folded into data), so kubectl's three-way merge always sends it again
		// and reports the Secret "configured", as it does against kube-apiserver.
		if !strings.HasSuffix(line, "unchanged") && line != "secret/sec configured" {
			t.Fatalf("second apply changed something: %q\n%s", line, out)
		}
	}
	// stringData lands in data, base64 on the wire, and is not stored itself.
	if got := k3.ok("get", "secret", "sec", "-n", "demo", "-o", "jsonpath={.data.password} {.stringData}"); strings.TrimSpace(got) != "aHVudGVyMg==" {
		t.Fatalf("secret data: %q", got)
	}
	mustContain(t, "get -o wide", k2.ok("get", "pods", "-n", "demo", "-o", "wide"), "NAME", "READY", "STATUS", "NODE", "bare", "Pending")
	var pod struct {
		Metadata struct{ Name, ResourceVersion string }
		Spec     struct{ RestartPolicy, SchedulerName string }
		Status   struct{ Phase string }
	}
	if err := json.Unmarshal([]byte(k3.ok("get", "pod", "bare", "-n", "demo", "-o", "json")), &pod); err != nil {
		t.Fatal(err)
	}
	if pod.Spec.RestartPolicy != "Always" || pod.Spec.SchedulerName != "default-scheduler" || pod.Status.Phase != "Pending" {
		t.Fatalf("pod defaults or status wrong: %+v", pod)
	}
	mustContain(t, "get -o yaml", k3.ok("get", "deploy", "web", "-n", "demo", "-o", "yaml"), "kind: Deployment", "replicas: 2", "revisionHistoryLimit: 10")
	mustContain(t, "label selector", k1.ok("get", "pods", "-n", "demo", "-l", "app=bare"), "bare")
	mustContain(t, "field selector", k1.ok("get", "pods", "-A", "--field-selector", "spec.nodeName=,status.phase=Pending"), "demo", "bare")
	mustContain(t, "unsupported field selector", k1.fails("get", "pods", "-A", "--field-selector", "spec.colour=blue"), "field label not supported")
	mustContain(t, "get all", k2.ok("get", "all", "-n", "demo"), "pod/bare", "service/web", "deployment.apps/web")

	// A watch through one peer sees a write made through another.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	watch := exec.CommandContext(ctx, "kubectl", "--kubeconfig", k3.kubeconfig, "get", "pods", "-n", "demo", "-w", "--output-watch-events")
	stdout, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); watch.Wait() }()
	seen := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "watched") {
				close(seen)
				return
			}
		}
	}()
	time.Sleep(500 * time.Millisecond) // let the watch start; a late start still lists the pod as ADDED
	k1.ok("run", "watched", "-n", "demo", "--image", "busybox:1.36", "--restart", "Never", "--", "true")
	select {
	case <-seen:
	case <-ctx.Done():
		t.Fatal("the watch through one peer did not see a pod created through another")
	}

	// Edits of every kind.
	k1.ok("label", "pod", "bare", "-n", "demo", "tier=test")
	k2.ok("annotate", "pod", "bare", "-n", "demo", "note=hello")
	k3.ok("patch", "pod", "bare", "-n", "demo", "--type=merge", "-p", `{"metadata":{"labels":{"merge":"yes"}}}`)
	k1.ok("patch", "pod", "bare", "-n", "demo", "--type=json", "-p", `[{"op":"add","path":"/metadata/labels/json","value":"yes"}]`)
	k2.ok("patch", "deploy", "web", "-n", "demo", "-p", `{"spec":{"template":{"metadata":{"labels":{"strategic":"yes"}}}}}`)
	mustContain(t, "labels after patches", k3.ok("get", "pod", "bare", "-n", "demo", "--show-labels"), "tier=test", "merge=yes", "json=yes")
	editor := filepath.Join(t.TempDir(), "editor.sh")
	os.WriteFile(editor, []byte("#!/bin/sh\nsed -i 's/key: value/key: edited/' \"$1\"\n"), 0o755)
	edit := exec.Command("kubectl", "--kubeconfig", k1.kubeconfig, "edit", "configmap", "cfg", "-n", "demo")
	edit.Env = append(os.Environ(), "KUBE_EDITOR="+editor)
	if out, err := edit.CombinedOutput(); err != nil {
		t.Fatalf("kubectl edit: %v\n%s", err, out)
	}
	mustContain(t, "edited configmap", k2.ok("get", "cm", "cfg", "-n", "demo", "-o", "jsonpath={.data.key}"), "edited")
	k3.ok("scale", "deploy", "web", "-n", "demo", "--replicas=4")
	mustContain(t, "scaled", k1.ok("get", "deploy", "web", "-n", "demo", "-o", "jsonpath={.spec.replicas}"), "4")
	stale := filepath.Join(t.TempDir(), "stale.yaml")
	os.WriteFile(stale, []byte(k1.ok("get", "cm", "cfg", "-n", "demo", "-o", "yaml")), 0o600)
	k2.ok("label", "cm", "cfg", "-n", "demo", "bump=1")
	mustContain(t, "replace with a stale object", k3.fails("replace", "-f", stale), "the object has been modified")

	// apply of a changed file, server-side apply, diff.
	changed := filepath.Join(t.TempDir(), "changed.yaml")
	data, _ := os.ReadFile("testdata/app.yaml")
	os.WriteFile(changed, []byte(strings.Replace(string(data), "key: value", "key: changed", 1)), 0o600)
	mustContain(t, "diff of a changed file", k1.fails("diff", "-f", changed), "changed")
	mustContain(t, "apply of a changed file", k1.ok("apply", "-f", changed), "configmap/cfg configured")
	mustContain(t, "server-side apply", k2.ok("apply", "--server-side", "--force-conflicts", "-f", changed), "serverside-applied")
	k3.ok("diff", "-f", changed) // no differences: exit status 0

	// Bad input gets clear errors.
	mustContain(t, "invalid pod", k1.fails("apply", "-f", "testdata/invalid.yaml"), "spec.containers[0].image", "Required value")
	mustContain(t, "unknown field", k1.fails("apply", "-f", "testdata/unknown-field.yaml"), "unknown field", "colour")

	// The logs of a pod no node runs yet are empty, as in Kubernetes; a container it does not have is an
	// error. Ephemeral containers are added through their subresource.
	if out := k1.ok("logs", "bare", "-n", "demo"); strings.TrimSpace(out) != "" {
		t.Fatalf("logs of an unscheduled pod: %q, want nothing", out)
	}
	mustContain(t, "logs of a missing container", k1.fails("logs", "bare", "-n", "demo", "-c", "nope"), "is not valid for pod")
	k2.ok("debug", "bare", "-n", "demo", "--image=busybox:1.36", "--profile=general")
	mustContain(t, "ephemeral container", k3.ok("get", "pod", "bare", "-n", "demo", "-o", "jsonpath={.spec.ephemeralContainers[*].image}"), "busybox:1.36")

	// Events and describe.
	// describe finds a pod's events by its UID, as the components that record them set it.
	uid := k1.ok("get", "pod", "bare", "-n", "demo", "-o", "jsonpath={.metadata.uid}")
	event, _ := os.ReadFile("testdata/event.yaml")
	eventFile := filepath.Join(t.TempDir(), "event.yaml")
	os.WriteFile(eventFile, []byte(strings.Replace(string(event), "  namespace: demo\nreason", "  namespace: demo\n  uid: "+uid+"\nreason", 1)), 0o600)
	k2.ok("create", "-f", eventFile)
	mustContain(t, "events by field selector", k3.ok("get", "events", "-n", "demo", "--field-selector", "involvedObject.name=bare"), "Testing", "pod/bare")
	mustContain(t, "describe shows events", k1.ok("describe", "pod", "bare", "-n", "demo"), "Events:", "Testing")
	// events.k8s.io/v1 serves the same Events in their newer shape.
	mustContain(t, "events.k8s.io", k3.ok("get", "events.v1.events.k8s.io", "bare.manual", "-n", "demo", "-o", "yaml"),
		"apiVersion: events.k8s.io/v1", "note: an event recorded by the e2e test", "regarding:")

	// A service account token from one peer is accepted by another, as the account's identity.
	k1.ok("create", "serviceaccount", "robot", "-n", "demo")
	token := strings.TrimSpace(k1.ok("create", "token", "robot", "-n", "demo", "--duration", "15m"))
	mustContain(t, "whoami with a service account token", asToken(t, k3, "robot3", token).ok("auth", "whoami"),
		"system:serviceaccount:demo:robot", "system:serviceaccounts:demo", "system:authenticated")
	k1.ok("create", "rolebinding", "robot-view", "-n", "demo", "--clusterrole=view", "--serviceaccount=demo:robot")
	robot2 := asToken(t, k2, "robot2", token)
	proctest.WaitFor(t, "get with a service account token", 30*time.Second, func() error {
		if out, err := robot2.run("get", "pod", "bare", "-n", "demo"); err != nil || !strings.Contains(out, "bare") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	mustContain(t, "a too short token", k2.fails("create", "token", "robot", "-n", "demo", "--duration", "5m"), "spec.expirationSeconds")
	k1.ok("delete", "serviceaccount", "robot", "-n", "demo")
	// A token that authenticated is cached for 10 s, as kube-apiserver caches it
	// (--authentication-token-success-cache-ttl): it may be accepted that long after the deletion, and the
	// deletion must reach the server first; 10 s of waiting raced the cache and failed in CI.
	proctest.WaitFor(t, "the deleted account's token refused", 30*time.Second, func() error {
		if out, err := robot2.run("get", "pod", "bare", "-n", "demo"); err == nil || !strings.Contains(out, "Unauthorized") {
			return fmt.Errorf("still accepted: %v %s", err, out)
		}
		return nil
	})

	// Discovery and generators.
	mustContain(t, "explain", k1.ok("explain", "deployment.spec.replicas"), "replicas")
	mustContain(t, "api-resources", k2.ok("api-resources"), "pods", "deployments", "leases", "endpointslices")
	mustContain(t, "api-versions", k3.ok("api-versions"), "apps/v1", "batch/v1", "coordination.k8s.io/v1")
	k1.ok("create", "deployment", "made", "-n", "demo", "--image", "busybox:1.36")
	k2.ok("expose", "deployment", "made", "-n", "demo", "--port", "80")
	mustContain(t, "exposed service", k3.ok("get", "svc", "made", "-n", "demo"), "made", "80/TCP", "10.96.")
	ip := k1.ok("get", "svc", "made", "-n", "demo", "-o", "jsonpath={.spec.clusterIP}")
	mustContain(t, "a taken ClusterIP", k2.fails("create", "service", "clusterip", "dup", "-n", "demo", "--tcp=80", "--clusterip="+ip),
		"spec.clusterIPs[0]", "provided IP is already allocated")
	mustContain(t, "an out-of-range ClusterIP", k3.fails("create", "service", "clusterip", "far", "-n", "demo", "--tcp=80", "--clusterip=192.168.1.1"),
		"not in the valid range")
	mustContain(t, "leader lease", k1.ok("get", "lease", "-n", "kube-system", "skiff-leader"), "skiff-leader", "cp-")
	mustContain(t, "kubernetes service", k2.ok("get", "svc", "kubernetes", "-n", "default"), "10.96.0.1", "443/TCP")
	proctest.WaitFor(t, "kubernetes endpoints", 30*time.Second, func() error {
		out := k3.ok("get", "endpoints", "kubernetes", "-n", "default", "-o", "jsonpath={.subsets[0].addresses[*].ip}")
		for _, ip := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"} {
			if !strings.Contains(out, ip) {
				return fmt.Errorf("endpoints %q lack %s", out, ip)
			}
		}
		return nil
	})
	proctest.WaitFor(t, "kubernetes endpointslice", 30*time.Second, func() error {
		out := k1.ok("get", "endpointslice", "kubernetes", "-n", "default", "-o", "jsonpath={.endpoints[*].addresses[0]}")
		for _, ip := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"} {
			if !strings.Contains(out, ip) {
				return fmt.Errorf("endpointslice %q lacks %s", out, ip)
			}
		}
		return nil
	})
	mustContain(t, "kube-dns service", k2.ok("get", "svc", "kube-dns", "-n", "kube-system"), "10.96.0.10", "53/UDP,53/TCP")
	mustContain(t, "cluster config", k3.ok("get", "configmap", "skiff-cluster", "-n", "kube-system", "-o", "jsonpath={.data}"),
		`"clusterDNS":"10.96.0.10"`, `"clusterDomain":"cluster.local"`)

	// Deletion: a grace period on an unscheduled pod removes it at once; --force; --cascade.
	k2.ok("delete", "pod", "watched", "-n", "demo", "--grace-period=30")
	k3.ok("delete", "pod", "bare", "-n", "demo", "--force", "--grace-period=0")
	// Cascading deletion in all three modes; foreground and orphan are completed by the garbage collector.
	k1.ok("delete", "deploy", "made", "-n", "demo", "--cascade=foreground")
	k2.ok("delete", "deploy", "web", "-n", "demo", "--cascade=orphan")
	k3.ok("delete", "svc", "web", "-n", "demo", "--cascade=background")
	// The orphaned Deployment's ReplicaSets stay, without their owner; the others' are collected.
	proctest.WaitFor(t, "only web's ReplicaSets left, orphaned", 60*time.Second, func() error {
		out := strings.TrimSpace(k1.ok("get", "rs", "-n", "demo", "-o", `jsonpath={range .items[*]}{.metadata.name} {.metadata.ownerReferences}{"\n"}{end}`))
		if out == "" {
			return fmt.Errorf("no ReplicaSet left: the orphaned ones were deleted")
		}
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) != 1 || !strings.HasPrefix(f[0], "web-") {
				return fmt.Errorf("ReplicaSet %q", line)
			}
		}
		return nil
	})
	k1.ok("delete", "rs", "--all", "-n", "demo")
	proctest.WaitFor(t, "pods gone", 60*time.Second, func() error {
		if out := k2.ok("get", "pods", "-n", "demo"); !strings.Contains(out, "No resources found") {
			return fmt.Errorf("%s", out)
		}
		return nil
	})

	// The garbage collector follows ownerReferences in each propagation mode.
	dir := t.TempDir()
	for _, mode := range []string{"foreground", "orphan", "background"} {
		owner, dep := "owner-"+mode, "dependent-"+mode
		k1.ok("create", "configmap", owner, "-n", "demo")
		uid := k1.ok("get", "configmap", owner, "-n", "demo", "-o", "jsonpath={.metadata.uid}")
		file := filepath.Join(dir, dep+".yaml")
		os.WriteFile(file, []byte(fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: %s
  namespace: demo
  ownerReferences:
  - {apiVersion: v1, kind: ConfigMap, name: %s, uid: %s, blockOwnerDeletion: true}
`, dep, owner, uid)), 0o600)
		k2.ok("apply", "-f", file)
		k3.ok("delete", "configmap", owner, "-n", "demo", "--cascade="+mode)
		proctest.WaitFor(t, "garbage collection ("+mode+")", 30*time.Second, func() error {
			out, err := k1.run("get", "configmap", dep, "-n", "demo", "-o", "jsonpath={.metadata.ownerReferences}")
			switch {
			case mode == "orphan" && err == nil && strings.TrimSpace(out) == "":
				return nil // kept, without its owner
			case mode != "orphan" && err != nil && strings.Contains(out, "NotFound"):
				return nil // deleted with its owner
			}
			return fmt.Errorf("dependent: %v %s", err, out)
		})
	}
	k1.ok("delete", "namespace", "demo", "--wait=true", "--timeout=60s")
	mustContain(t, "namespace gone", k2.fails("get", "namespace", "demo"), "NotFound")
}
