package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skiff-dev/skiff/internal/images"
	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/localcluster"
)

// TestLocalWorkloads runs the workload kinds on `skiff local` (three servers, two agents with containerd),
// with the stock kubectl, as issue 18's acceptance asks; the subtests share the cluster and run in order.
func TestLocalWorkloads(t *testing.T) {
	parallel(t)
	requireRealRuntime(t)
	dir, err := os.MkdirTemp("", "skiff-workloads-")
	if err != nil {
		t.Fatal(err)
	}
	bin := proctest.Binary(t)
	// --images: busybox tagged example.test/busybox:2 as well, for a rolling image update without a registry.
	imageDir := filepath.Join(dir, "user-images")
	spec, err := images.Busybox(images.BusyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	img, err := images.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := images.WriteTarball(img, "example.test/busybox:2", filepath.Join(imageDir, "busybox-2.tar")); err != nil {
		t.Fatal(err)
	}
	st := upLocalCluster(t, bin, dir, "--images", imageDir)
	k := kubectl{t: t, kubeconfig: st.Kubeconfig(dir)}
	k.waitNodeHealth("agent-1", "True/", 60*time.Second)
	k.waitNodeHealth("agent-2", "True/", 60*time.Second)
	t.Cleanup(func() {
		if t.Failed() {
			for _, what := range [][]string{{"get", "ds,sts,deploy,jobs,pods,pvc,pv", "-o", "wide"}, {"describe", "pvc"}, {"get", "events"}} {
				out, _ := k.run(what...)
				t.Logf("kubectl %s:\n%s", strings.Join(what, " "), out)
			}
		}
	})
	proctest.WaitFor(t, "the default service account", 30*time.Second, func() error {
		_, err := k.run("get", "serviceaccount", "default")
		return err
	})
	t.Run("DaemonSet", func(t *testing.T) { testLocalDaemonSet(t, k.withT(t)) })
	t.Run("manifest set", func(t *testing.T) { testManifestSet(t, k.withT(t)) })
	t.Run("StatefulSet with volumes", func(t *testing.T) { testLocalStatefulSetVolumes(t, k.withT(t), st, dir) })
}

// testLocalStatefulSetVolumes: a StatefulSet with a volumeClaimTemplate on local-path volumes.
//   - the default StorageClass is local-path, WaitForFirstConsumer;
//   - three pods come up in order, each bound to a claim whose volume the agent of the pod's node
//     provisioned there (node affinity), and each writes its hostname into its volume;
//   - web-1 deleted comes back with the same name, on the same node, with its data;
//   - scaled down to 1 and up to 3, the claims stay and the pods find their data;
//   - while web-1's agent is partitioned from every other host, its pod is evicted but no second web-1
//     runs anywhere; healed, web-1 runs again on its node with its data, also after an agent restart;
//   - a read-only claim mounts read-only;
//   - a hostPath PersistentVolume made by hand binds to a claim without a class and is mounted;
//   - the StatefulSet deleted with whenDeleted: Delete takes its claims along, and the agents delete the
//     released volumes and their directories.
func testLocalStatefulSetVolumes(t *testing.T, k kubectl, st *localcluster.State, dir string) {
	proctest.WaitFor(t, "the default StorageClass", 30*time.Second, func() error {
		out, err := k.run("get", "storageclass", "--no-headers")
		if f := strings.Fields(out); err != nil || len(f) < 5 || f[0] != "local-path" || f[1] != "(default)" ||
			f[2] != "skiff.dev/local-path" || f[3] != "Delete" || f[4] != "WaitForFirstConsumer" {
			return fmt.Errorf("kubectl get sc: %q %v", out, err)
		}
		return nil
	})

	// Each pod appends its hostname to its volume, then serves; tolerating an unreachable node for 5 s,
	// so the partition below evicts web-1 quickly.
	applyYAML(t, k, `apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: None
  selector: {app: web}
  ports: [{port: 80}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: web
  replicas: 3
  selector: {matchLabels: {app: web}}
  persistentVolumeClaimRetentionPolicy: {whenDeleted: Delete, whenScaled: Retain}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      tolerations:
      - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5}
      containers:
      - name: web
        image: skiff.local/busybox:1
        command: ["sh", "-c", "hostname >> /data/hosts && exec sleep 3600"]
        readinessProbe: {exec: {command: ["test", "-s", "/data/hosts"]}, periodSeconds: 1}
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 16Mi}}
`)
	k.ok("rollout", "status", "statefulset/web", "--timeout=180s")
	nodes := map[string]string{}
	for i := 0; i < 3; i++ {
		pod := fmt.Sprintf("web-%d", i)
		nodes[pod] = k.pod(pod).Spec.NodeName
		if got := k.stdout("exec", pod, "--", "cat", "/data/hosts"); got != pod+"\n" {
			t.Fatalf("%s's volume holds %q, want its hostname once", pod, got)
		}
		claim := "data-" + pod
		row := strings.Fields(k.ok("get", "pvc", claim, "--no-headers"))
		if len(row) < 6 || row[1] != "Bound" || row[3] != "16Mi" || row[4] != "RWO" || row[5] != "local-path" {
			t.Fatalf("kubectl get pvc %s: %v", claim, row)
		}
		pv := row[2]
		affinity := k.ok("get", "pv", pv, "-o", "jsonpath={.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}")
		if affinity != nodes[pod] {
			t.Fatalf("volume %s of %s is pinned to %q, but the pod runs on %s", pv, pod, affinity, nodes[pod])
		}
		path := k.ok("get", "pv", pv, "-o", "jsonpath={.spec.local.path}")
		if want := filepath.Join(dir, nodes[pod], "data", "volumes", pv); path != want {
			t.Fatalf("volume %s at %q, want %q", pv, path, want)
		}
	}
	// OrderedReady: each pod was created only once the one before it was Ready.
	for i := 1; i < 3; i++ {
		ready := k.ok("get", "pod", fmt.Sprintf("web-%d", i-1), "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].lastTransitionTime}`)
		created := k.ok("get", "pod", fmt.Sprintf("web-%d", i), "-o", "jsonpath={.metadata.creationTimestamp}")
		if created < ready {
			t.Fatalf("web-%d was created at %s, before web-%d was Ready at %s", i, created, i-1, ready)
		}
	}

	// web-1 deleted: the same name, node and data.
	old := k.pod("web-1").Metadata.UID
	k.ok("delete", "pod", "web-1", "--wait=false")
	waitStatefulPod(t, k, "web-1", old)
	if got := k.pod("web-1").Spec.NodeName; got != nodes["web-1"] {
		t.Fatalf("web-1 came back on %s, its volume is on %s", got, nodes["web-1"])
	}
	if got := k.stdout("exec", "web-1", "--", "cat", "/data/hosts"); got != "web-1\nweb-1\n" {
		t.Fatalf("web-1's volume after the pod's deletion: %q", got)
	}

	// Scaled down and up: the claims stay, the pods find their data.
	k.ok("scale", "statefulset/web", "--replicas=1")
	waitPodGone(t, k, "web-2")
	waitPodGone(t, k, "web-1")
	if out := k.ok("get", "pvc", "-o", "name"); strings.Count(out, "persistentvolumeclaim/data-web-") != 3 {
		t.Fatalf("claims after scaling down: %q", out)
	}
	k.ok("scale", "statefulset/web", "--replicas=3")
	k.ok("rollout", "status", "statefulset/web", "--timeout=180s")
	if got := k.stdout("exec", "web-2", "--", "cat", "/data/hosts"); got != "web-2\nweb-2\n" {
		t.Fatalf("web-2's volume after scaling down and up: %q", got)
	}

	// web-1's agent cut off from every other host: its pod is evicted, but its deletion cannot be confirmed
	// and its volume lives there, so no second web-1 runs anywhere until the heal.
	lost := nodes["web-1"]
	old = k.pod("web-1").Metadata.UID
	var others []string
	for _, h := range st.Hosts {
		if h.Name != lost {
			others = append(others, h.IP)
		}
	}
	if err := st.Partition(lost, others); err != nil {
		t.Fatal(err)
	}
	k.waitNodeHealth(lost, "Unknown/NodeStatusUnknown node.kubernetes.io/unreachable", 60*time.Second)
	proctest.WaitFor(t, "web-1 evicted", 60*time.Second, func() error {
		if ts := k.ok("get", "pod", "web-1", "-o", "jsonpath={.metadata.deletionTimestamp}"); ts == "" {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if p := k.pod("web-1"); p.Metadata.UID != old { // (the evicted pod stays until its agent confirms)
			t.Fatalf("a second web-1 (%s, on %q) exists while the first one's node is partitioned", p.Metadata.UID, p.Spec.NodeName)
		}
		for _, h := range st.Hosts {
			if h.Role == "agent" && h.Name != lost && len(podContainers(t, dir, h.Name, "web-1")) > 0 {
				t.Fatalf("a web-1 container runs on %s while %s is partitioned", h.Name, lost)
			}
		}
	}
	if err := st.Heal(lost, others); err != nil {
		t.Fatal(err)
	}
	k.waitNodeHealth(lost, "True/", 60*time.Second)
	waitStatefulPod(t, k, "web-1", old)
	if got := k.stdout("exec", "web-1", "--", "cat", "/data/hosts"); got != "web-1\nweb-1\nweb-1\nweb-1\n" {
		t.Fatalf("web-1's volume after the partition: %q", got)
	}

	// The data outlives an agent restart.
	old = k.pod("web-1").Metadata.UID
	if err := st.Kill(lost); err != nil {
		t.Fatal(err)
	}
	if err := st.Start(dir, lost); err != nil {
		t.Fatal(err)
	}
	k.waitNodeHealth(lost, "True/", 60*time.Second)
	k.ok("delete", "pod", "web-1", "--wait=false")
	waitStatefulPod(t, k, "web-1", old)
	// (The restarted agent may have restarted the container once before the pod was deleted: one line more.)
	if got := k.stdout("exec", "web-1", "--", "cat", "/data/hosts"); !strings.HasPrefix(got, "web-1\nweb-1\nweb-1\nweb-1\nweb-1\n") ||
		strings.Trim(strings.ReplaceAll(got, "web-1\n", ""), "\n") != "" {
		t.Fatalf("web-1's volume after its agent restarted: %q", got)
	}

	// A read-only claim mounts read-only; a hostPath volume made by hand binds to a claim without a class.
	hostDir := filepath.Join(dir, "by-hand")
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hostDir, "greeting"), []byte("made-by-hand\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	applyYAML(t, k, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolume
metadata: {name: by-hand}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: %s, type: Directory}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: by-hand}
spec:
  storageClassName: ""
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 100Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: reader}
spec:
  restartPolicy: Never
  containers:
  - name: r
    image: skiff.local/busybox:1
    command: ["sh", "-c", "grep -q made-by-hand /hand/greeting && ! touch /hand/x 2>/dev/null && cp /hand/greeting /rw/copy"]
    volumeMounts: [{name: hand, mountPath: /hand}, {name: rw, mountPath: /rw}]
  volumes:
  - {name: hand, persistentVolumeClaim: {claimName: by-hand, readOnly: true}}
  - {name: rw, persistentVolumeClaim: {claimName: data-web-0}}
`, hostDir))
	proctest.WaitFor(t, "reader Completed", 90*time.Second, func() error {
		if s := k.podStatusColumn("reader"); s != "Completed" {
			return fmt.Errorf("STATUS %s", s)
		}
		return nil
	})
	if row := strings.Fields(k.ok("get", "pvc", "by-hand", "--no-headers")); len(row) < 3 || row[1] != "Bound" || row[2] != "by-hand" {
		t.Fatalf("kubectl get pvc by-hand: %v", row)
	}
	if _, err := os.Stat(filepath.Join(hostDir, "x")); err == nil {
		t.Fatal("the read-only claim was written through")
	}

	// Deleting the StatefulSet (whenDeleted: Delete) deletes its claims; the agents delete the released
	// volumes and their directories.
	var dirs []string
	volumes := strings.Fields(k.ok("get", "pvc", "data-web-0", "data-web-1", "data-web-2", "-o", "jsonpath={.items[*].spec.volumeName}"))
	for _, pv := range volumes {
		dirs = append(dirs, k.ok("get", "pv", pv, "-o", "jsonpath={.spec.local.path}"))
	}
	k.ok("delete", "pod", "reader")
	k.ok("delete", "statefulset", "web")
	proctest.WaitFor(t, "the claims and local volumes gone", 120*time.Second, func() error {
		out := k.ok("get", "pvc,pv", "-o", "name")
		for _, name := range append([]string{"persistentvolumeclaim/data-web-"}, volumes...) {
			if strings.Contains(out, name) {
				return fmt.Errorf("left: %s", out)
			}
		}
		return nil
	})
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Fatalf("directory %s of a deleted volume: %v", d, err)
		}
	}
	// The volume made by hand (Retain) is left, Released once its claim goes.
	k.ok("delete", "pvc", "by-hand")
	proctest.WaitFor(t, "by-hand Released", 60*time.Second, func() error {
		if phase := k.ok("get", "pv", "by-hand", "-o", "jsonpath={.status.phase}"); phase != "Released" {
			return fmt.Errorf("phase %s", phase)
		}
		return nil
	})
}

// waitStatefulPod waits until the pod of that name is a new one (not oldUID), Running and Ready.
func waitStatefulPod(t *testing.T, k kubectl, name, oldUID string) {
	t.Helper()
	proctest.WaitFor(t, name+" replaced and Ready", 120*time.Second, func() error {
		out, err := k.run("get", "pod", name, "-o", "json")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		var p podJSON
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			return err
		}
		if p.Metadata.UID == oldUID || p.Metadata.UID == "" {
			return fmt.Errorf("still the old pod")
		}
		if p.Status.Phase != "Running" || len(p.Status.ContainerStatuses) == 0 || !p.Status.ContainerStatuses[0].Ready {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
}

// podContainers lists the containers of pods named name in an agent host's containerd.
func podContainers(t *testing.T, dir, host, name string) []string {
	t.Helper()
	sock := filepath.Join(dir, host, "data", "containerd", "containerd.sock")
	out, err := exec.Command("ctr", "--address", sock, "-n", "skiff", "containers", "ls", "-q",
		fmt.Sprintf(`labels."io.skiff.pod.name"==%s`, name)).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr on %s: %v %s", host, err, out)
	}
	return strings.Fields(string(out))
}

// testLocalDaemonSet: one pod on each agent; a tainted node gets none unless the DaemonSet tolerates the
// taint; `kubectl set image` replaces the pods one node at a time, which `kubectl rollout status` follows,
// and `kubectl rollout undo` goes back.
func testLocalDaemonSet(t *testing.T, k kubectl) {
	k.ok("taint", "node", "agent-2", "dedicated=infra:NoSchedule")
	daemonSet := func(name, tolerations string) string {
		return fmt.Sprintf(`apiVersion: apps/v1
kind: DaemonSet
metadata: {name: %[1]s}
spec:
  selector: {matchLabels: {app: %[1]s}}
  minReadySeconds: 2
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      terminationGracePeriodSeconds: 1
%[2]s      containers: [{name: d, image: skiff.local/busybox:1, command: ["sleep", "3600"]}]
`, name, tolerations)
	}
	applyYAML(t, k, daemonSet("plain", ""))
	applyYAML(t, k, daemonSet("tolerant", `      tolerations: [{key: dedicated, operator: Equal, value: infra, effect: NoSchedule}]
`))
	waitPods := func(label, want string) {
		t.Helper()
		proctest.WaitFor(t, label+" pods on "+want, 90*time.Second, func() error {
			if got := podsOnNodes(k, label); got != want {
				return fmt.Errorf("pods: %s", got)
			}
			return nil
		})
	}
	waitPods("app=plain", "agent-1=Running")
	waitPods("app=tolerant", "agent-1=Running agent-2=Running")
	mustContain(t, "rollout status", k.ok("rollout", "status", "ds/tolerant", "--timeout=90s"), `daemon set "tolerant" successfully rolled out`)

	cfg, err := clientcmd.BuildConfigFromFlags("", k.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	roll := func(what, image string, change ...string) {
		t.Helper()
		u := watchUnavailable(t, client, "app=tolerant", []string{"agent-1", "agent-2"})
		k.ok(change...)
		mustContain(t, what+": rollout status", k.ok("rollout", "status", "ds/tolerant", "--timeout=120s"), `daemon set "tolerant" successfully rolled out`)
		if worst := u.result(); worst != 1 {
			t.Fatalf("%s: at worst %d of 2 nodes had no Running pod during the rollout, want 1 (one at a time)", what, worst)
		}
		waitPods("app=tolerant", "agent-1=Running agent-2=Running")
		if out := k.ok("get", "pods", "-l", "app=tolerant", "-o", "jsonpath={.items[*].spec.containers[0].image}"); out != image+" "+image {
			t.Fatalf("%s: images %q, want %s on both", what, out, image)
		}
	}
	roll("set image", "example.test/busybox:2", "set", "image", "ds/tolerant", "d=example.test/busybox:2")
	mustContain(t, "rollout history", k.ok("rollout", "history", "ds/tolerant"), "REVISION", "1 ", "2 ")
	roll("rollout undo", "skiff.local/busybox:1", "rollout", "undo", "ds/tolerant")
	// Untainted, agent-2 gets plain's pod too.
	k.ok("taint", "node", "agent-2", "dedicated=infra:NoSchedule-")
	waitPods("app=plain", "agent-1=Running agent-2=Running")
	k.ok("delete", "ds", "plain", "tolerant")
}

// testManifestSet applies a Helm-style manifest set (ConfigMap, Secret, Service, Deployment, StatefulSet
// with a claim template, a post-install Job hook) with `kubectl apply -f DIR`; everything reaches its
// desired state.
func testManifestSet(t *testing.T, k kubectl) {
	dir := t.TempDir()
	files := map[string]string{
		"configmap.yaml": `apiVersion: v1
kind: ConfigMap
metadata: {name: app-config, labels: {app.kubernetes.io/instance: demo}}
data: {GREETING: hello}
`,
		"secret.yaml": `apiVersion: v1
kind: Secret
metadata: {name: app-secret, labels: {app.kubernetes.io/instance: demo}}
stringData: {password: s3cret}
`,
		"service.yaml": `apiVersion: v1
kind: Service
metadata: {name: app, labels: {app.kubernetes.io/instance: demo}}
spec:
  selector: {app: demo}
  ports: [{port: 80, targetPort: 8080}]
`,
		"deployment.yaml": `apiVersion: apps/v1
kind: Deployment
metadata: {name: app, labels: {app.kubernetes.io/instance: demo}}
spec:
  replicas: 2
  selector: {matchLabels: {app: demo}}
  template:
    metadata: {labels: {app: demo}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: skiff.local/busybox:1
        command: ["sh", "-c", "test \"$GREETING\" = hello && test \"$(cat /secret/password)\" = s3cret && mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www"]
        envFrom: [{configMapRef: {name: app-config}}]
        volumeMounts: [{name: secret, mountPath: /secret}]
        readinessProbe: {httpGet: {path: /index.html, port: 8080}, periodSeconds: 1}
      volumes: [{name: secret, secret: {secretName: app-secret}}]
`,
		"statefulset.yaml": `apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, labels: {app.kubernetes.io/instance: demo}}
spec:
  serviceName: db
  replicas: 1
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: db
        image: skiff.local/busybox:1
        command: ["sh", "-c", "echo ready > /var/lib/db/state && exec sleep 3600"]
        volumeMounts: [{name: data, mountPath: /var/lib/db}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 8Mi}}}
`,
		"job-hook.yaml": `apiVersion: batch/v1
kind: Job
metadata:
  name: migrate
  labels: {app.kubernetes.io/instance: demo}
  annotations: {helm.sh/hook: post-install, helm.sh/hook-delete-policy: hook-succeeded}
spec:
  backoffLimit: 6
  template:
    spec:
      restartPolicy: OnFailure
      containers:
      - name: migrate
        image: skiff.local/busybox:1
        # Waits for the Service's endpoints to answer, as a migration waits for its database.
        command: ["sh", "-c", "printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 3 app 80 | grep -q ok"]
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out := k.ok("apply", "-f", dir)
	mustContain(t, "apply -f DIR", out, "configmap/app-config created", "secret/app-secret created", "service/app created",
		"deployment.apps/app created", "statefulset.apps/db created", "job.batch/migrate created")
	k.ok("rollout", "status", "deployment/app", "--timeout=120s")
	k.ok("rollout", "status", "statefulset/db", "--timeout=120s")
	k.ok("wait", "--for=condition=complete", "job/migrate", "--timeout=120s")
	if got := k.stdout("exec", "db-0", "--", "cat", "/var/lib/db/state"); got != "ready\n" {
		t.Fatalf("db-0's volume: %q", got)
	}
	// Applied again: nothing to do. (kubectl reports the Secret, whose stringData the API folds into data, and
	// the StatefulSet, whose claim templates the API defaults, as configured each time: its three-way patch
	// sends the stringData and the claim template list again whole, which changes nothing stored.)
	mustContain(t, "apply again", k.ok("apply", "-f", dir), "configmap/app-config unchanged", "service/app unchanged",
		"deployment.apps/app unchanged", "job.batch/migrate unchanged")
	k.ok("delete", "-f", dir, "--wait=false")
	k.ok("delete", "pvc", "data-db-0", "--wait=false")
}
