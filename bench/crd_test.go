package bench

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"encoding/json"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skiff-dev/skiff/internal/proctest"
)

var crdCount = flag.Int("crd.count", 200, "CRDs installed for the memory measurement (real bundles, repeated under other groups)")

// The bundles the CRD benchmark installs: real CRDs of public projects, read from their Go modules (as e2e
// TestCustomResourcesWithKubectl does).
var benchCRDBundles = []struct{ module, dir string }{
	{"github.com/cert-manager/cert-manager@v1.21.2", "deploy/crds"},
	{"github.com/prometheus-operator/prometheus-operator@v0.85.0", "example/prometheus-operator-crd"},
	{"sigs.k8s.io/gateway-api@v1.6.3", "config/crd/standard"},
}

var crdKubeAPIServer = flag.Bool("crd.kube-apiserver", false, "also measure kube-apiserver 1.37.2 with etcd the same way, after Skiff (make bench)")

// apiTarget is three API servers under benchmark: Skiff's, or kube-apiserver's with etcd.
type apiTarget struct {
	configs []*rest.Config
	pids    []int // the processes whose CPU and memory count
}

// crdFigures are what BenchmarkCRDs measures of one target.
type crdFigures struct {
	firstCR                   []time.Duration
	crRate, podRate           float64
	crP99, podP99             time.Duration
	crServersMs, podServersMs float64
	installed                 int
	rssBefore, rssAfter       int64
	mibPerCRDPerServer        float64
}

// BenchmarkCRDs measures custom resources on three `skiff server` processes and, with -crd.kube-apiserver,
// on three kube-apiserver 1.37.2 processes over a three-member etcd cluster, one after the other in the same
// run (Skiff's servers are stopped first, so the two never share the machine's cores):
//   - the time from a CRD's create to its first accepted custom resource, through each server;
//   - custom resource creates per second (client-go's dynamic client, JSON) at concurrency 64 spread over the
//     servers, and the servers' CPU per create (kube-apiserver's and etcd's together), beside pod creates
//     (protobuf) in the same run;
//   - the servers' memory per CRD with -crd.count real-world CRDs installed (cert-manager's, the Prometheus
//     operator's and the Gateway API's, repeated under other group names to reach the count).
//
// b.N is the number of creates of each kind; run with -benchtime=5000x.
func BenchmarkCRDs(b *testing.B) {
	if firstCallOfTwo(b) {
		return
	}
	ctx := context.Background()
	c, clients := apiCluster(b)
	createNamespace(b, ctx, clients[0], "bench")
	skiff := apiTarget{pids: clusterPIDs(c)}
	for _, p := range c.Procs {
		cfg, err := clientcmd.BuildConfigFromFlags("", p.Kubeconfig())
		if err != nil {
			b.Fatal(err)
		}
		skiff.configs = append(skiff.configs, cfg)
	}
	b.ResetTimer()
	report(b, "", measureCRDs(b, ctx, skiff))
	if !*crdKubeAPIServer {
		b.ReportMetric(0, "ns/op")
		return
	}
	for _, p := range c.Procs {
		if err := c.Stop(p); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	kas := startKubeAPIServers(b)
	createNamespaceWithServiceAccount(b, ctx, kas.configs[0], "bench")
	b.StartTimer()
	report(b, "kas-", measureCRDs(b, ctx, apiTarget{configs: kas.configs, pids: kas.pids()}))
	b.ReportMetric(0, "ns/op")
}

// report reports one target's figures, their names prefixed.
func report(b *testing.B, prefix string, f crdFigures) {
	for i, took := range f.firstCR {
		b.ReportMetric(ms(took), fmt.Sprintf("%sfirst-cr-server%d-ms", prefix, i+1))
	}
	b.ReportMetric(f.crRate, prefix+"cr-creates/s")
	b.ReportMetric(ms(f.crP99), prefix+"cr-create-p99-ms")
	b.ReportMetric(f.crServersMs, prefix+"cr-create-server-cpu-ms")
	b.ReportMetric(f.podRate, prefix+"pod-creates/s")
	b.ReportMetric(ms(f.podP99), prefix+"pod-create-p99-ms")
	b.ReportMetric(f.podServersMs, prefix+"pod-create-server-cpu-ms")
	b.ReportMetric(f.mibPerCRDPerServer, prefix+"MiB-per-crd-per-server")
	b.Logf("%s%d CRDs: the servers' RSS %.0f MiB before, %.0f MiB after (%.2f MiB per CRD per server)",
		prefix, f.installed, float64(f.rssBefore)/(1<<20), float64(f.rssAfter)/(1<<20), f.mibPerCRDPerServer)
}

// measureCRDs measures one target, whose namespace "bench" exists.
func measureCRDs(b *testing.B, ctx context.Context, target apiTarget) (f crdFigures) {
	var pods []kubernetes.Interface
	var dyns []dynamic.Interface
	var crds []apiextensionsclient.Interface
	for _, cfg := range target.configs {
		cfg = rest.CopyConfig(cfg)
		cfg.QPS, cfg.Burst = -1, 0
		pods = append(pods, kubeClient(b, cfg))
		dyns = append(dyns, dynamic.NewForConfigOrDie(cfg))
		crds = append(crds, apiextensionsclient.NewForConfigOrDie(cfg))
	}

	// Time to the first custom resource accepted through each server.
	crd := benchCRD("widgets", "bench.skiff.dev")
	created := time.Now()
	if _, err := crds[0].ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: "bench.skiff.dev", Version: "v1", Resource: "widgets"}
	f.firstCR = make([]time.Duration, len(dyns))
	for i := range dyns {
		proctest.WaitFor(b, "the first widget through server "+strconv.Itoa(i+1), 60*time.Second, func() error {
			_, err := dyns[i].Resource(gvr).Namespace("bench").Create(ctx, benchWidget(fmt.Sprintf("first-%d", i)), metav1.CreateOptions{})
			f.firstCR[i] = time.Since(created)
			return err
		})
	}

	const conc = 64
	n := b.N
	podCPU := startCPUOf(b, target.pids)
	f.podRate, _, f.podP99 = run(b, conc, n, func(w, i int) error {
		_, err := pods[w%3].CoreV1().Pods("bench").Create(ctx, benchPod(fmt.Sprintf("p-%06d", i)), metav1.CreateOptions{})
		return err
	})
	_, f.podServersMs = podCPU.perOp(n)
	crCPU := startCPUOf(b, target.pids)
	f.crRate, _, f.crP99 = run(b, conc, n, func(w, i int) error {
		_, err := dyns[w%3].Resource(gvr).Namespace("bench").Create(ctx, benchWidget(fmt.Sprintf("w-%06d", i)), metav1.CreateOptions{})
		return err
	})
	_, f.crServersMs = crCPU.perOp(n)

	// Memory per CRD: the servers' RSS after a GC settles, before and after installing the CRDs.
	f.rssBefore = rss(b, target.pids)
	f.installed = installRealCRDs(b, ctx, crds[0], *crdCount)
	proctest.WaitFor(b, "every CRD Established", 5*time.Minute, func() error {
		list, err := crds[0].ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		established := 0
		for _, crd := range list.Items {
			for _, cond := range crd.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					established++
				}
			}
		}
		if established < f.installed+1 {
			return fmt.Errorf("%d of %d Established", established, f.installed+1)
		}
		return nil
	})
	time.Sleep(10 * time.Second) // discovery, OpenAPI and the APIServices settle on every server
	f.rssAfter = rss(b, target.pids)
	f.mibPerCRDPerServer = float64(f.rssAfter-f.rssBefore) / float64(len(target.configs)) / float64(f.installed) / (1 << 20)
	return f
}

func benchCRD(plural, group string) *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: group, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: plural, Kind: "Widget"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"image": {Type: "string"}, "replicas": {Type: "integer", Default: &apiextensionsv1.JSON{Raw: []byte("1")}},
							"env": {Type: "object", AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{Schema: &apiextensionsv1.JSONSchemaProps{Type: "string"}}},
						}},
					}}}}},
		},
	}
}

// benchWidget is about the size of benchPod's stored form.
func benchWidget(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "bench.skiff.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": name, "labels": map[string]any{"app": "bench"}},
		"spec":     map[string]any{"image": "registry.local/bench:1.0", "env": map[string]any{"MODE": "benchmark"}}}}
}

// installRealCRDs creates count CRDs from the real bundles, each bundle again under another group name
// (<n>.<group>) until there are enough, and returns how many it created.
func installRealCRDs(b *testing.B, ctx context.Context, client apiextensionsclient.Interface, count int) int {
	var all []*apiextensionsv1.CustomResourceDefinition
	for _, bundle := range benchCRDBundles {
		all = append(all, readCRDs(b, filepath.Join(goModuleDir(b, bundle.module), bundle.dir))...)
	}
	created := 0
	for copyN := 0; created < count; copyN++ {
		for _, orig := range all {
			if created == count {
				break
			}
			crd := orig.DeepCopy()
			if copyN > 0 {
				crd.Spec.Group = fmt.Sprintf("c%d.%s", copyN, crd.Spec.Group)
			}
			crd.Name = crd.Spec.Names.Plural + "." + crd.Spec.Group
			crd.ResourceVersion = ""
			// A create whose outcome is unknown (a leader change under the load) is retried; it may have
			// committed.
			for attempt := 0; ; attempt++ {
				_, err := client.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{})
				if err == nil || attempt > 0 && apierrors.IsAlreadyExists(err) {
					break
				}
				if attempt == 5 || !apierrors.IsTimeout(err) && !apierrors.IsServerTimeout(err) && !apierrors.IsTooManyRequests(err) {
					b.Fatalf("creating %s: %v", crd.Name, err)
				}
				b.Logf("creating %s: %v; retrying", crd.Name, err)
				time.Sleep(time.Second)
			}
			created++
		}
	}
	return created
}

// readCRDs reads every CustomResourceDefinition of the YAML files of dir.
func readCRDs(b *testing.B, dir string) []*apiextensionsv1.CustomResourceDefinition {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		b.Fatalf("no CRDs in %s: %v", dir, err)
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				break
			}
			var crd apiextensionsv1.CustomResourceDefinition
			if err := json.Unmarshal(raw, &crd); err == nil && crd.Kind == "CustomResourceDefinition" {
				out = append(out, &crd)
			}
		}
	}
	return out
}

// goModuleDir downloads a module (or finds it in the module cache) and returns its directory.
func goModuleDir(b *testing.B, module string) string {
	out, err := exec.Command("go", "mod", "download", "-json", module).Output()
	if err != nil {
		b.Fatalf("go mod download %s: %v", module, err)
	}
	var info struct{ Dir string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		b.Fatalf("go mod download %s: %v", module, err)
	}
	return info.Dir
}

// rss is the sum of the processes' resident memory, read after a pause so that the Go runtime's scavenger
// has returned what the last burst freed.
func rss(b *testing.B, pids []int) int64 {
	debug.FreeOSMemory() // the benchmark process's own, for a quieter machine
	time.Sleep(5 * time.Second)
	var sum int64
	for _, pid := range pids {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(line, "VmRSS:") {
				kib, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
				sum += kib << 10
			}
		}
	}
	return sum
}
