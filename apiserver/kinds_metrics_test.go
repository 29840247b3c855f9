package apiserver_test

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
	metricsclient "k8s.io/metrics/pkg/client/clientset/versioned"

	"github.com/skiff-dev/skiff/apiserver"
)

// fakeMetrics is a MetricsSource from maps.
type fakeMetrics struct {
	nodes map[string]*metricsv1beta1.NodeMetrics
	pods  map[string]*metricsv1beta1.PodMetrics // by namespace/name
}

func (f *fakeMetrics) NodeMetrics(name string) (*metricsv1beta1.NodeMetrics, bool) {
	m, ok := f.nodes[name]
	return m, ok
}

func (f *fakeMetrics) PodMetrics(namespace, name string) (*metricsv1beta1.PodMetrics, bool) {
	m, ok := f.pods[namespace+"/"+name]
	return m, ok
}

func usage(cpu, memory string) corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}
}

// TestMetricsAPI: metrics.k8s.io/v1beta1 is discovered and serves the source's figures for the Nodes and
// Pods that exist, with their labels, filtered by label and field selectors; an object without metrics is
// left out of lists and NotFound on get, as with metrics-server.
func TestMetricsAPI(t *testing.T) {
	t.Parallel()
	ts := metav1.NewTime(time.Unix(1_700_000_000, 0))
	window := metav1.Duration{Duration: 15 * time.Second}
	source := &fakeMetrics{
		nodes: map[string]*metricsv1beta1.NodeMetrics{
			"n1":    {Timestamp: ts, Window: window, Usage: usage("250m", "1Gi")},
			"n2":    {Timestamp: ts, Window: window, Usage: usage("1", "2Gi")},
			"ghost": {Timestamp: ts, Window: window, Usage: usage("1", "1Gi")}, // no such Node
		},
		pods: map[string]*metricsv1beta1.PodMetrics{
			"ns1/web": {Timestamp: ts, Window: window, Containers: []metricsv1beta1.ContainerMetrics{
				{Name: "nginx", Usage: usage("100m", "64Mi")}, {Name: "sidecar", Usage: usage("5m", "8Mi")}}},
			"ns1/db":  {Timestamp: ts, Window: window, Containers: []metricsv1beta1.ContainerMetrics{{Name: "pg", Usage: usage("300m", "512Mi")}}},
			"ns2/job": {Timestamp: ts, Window: window, Containers: []metricsv1beta1.ContainerMetrics{{Name: "c", Usage: usage("1m", "1Mi")}}},
		},
	}
	cfg := apiserver.StartTestAPI(t, apiserver.TestAPIOptions{Metrics: source})
	ctx := context.Background()
	client := kubernetes.NewForConfigOrDie(cfg)
	metrics := metricsclient.NewForConfigOrDie(cfg).MetricsV1beta1()

	for _, n := range []struct{ name, role string }{{"n1", "a"}, {"n2", "b"}, {"n3", "a"}} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{"role": n.role}}}
		if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{"ns1", "ns2"} {
		if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// No serviceaccount controller runs here: make the account the ServiceAccount admission looks for.
		if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []struct{ ns, name, app string }{{"ns1", "web", "web"}, {"ns1", "db", "db"}, {"ns1", "new", "web"}, {"ns2", "job", "web"}} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: p.ns, Labels: map[string]string{"app": p.app}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		if _, err := client.CoreV1().Pods(p.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Discovery, as kubectl top checks it.
	groups, err := client.Discovery().ServerGroups()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, g := range groups.Groups {
		found = found || g.Name == "metrics.k8s.io" && g.PreferredVersion.Version == "v1beta1"
	}
	if !found {
		t.Fatalf("discovery has no metrics.k8s.io/v1beta1: %+v", groups.Groups)
	}
	resources, err := client.Discovery().ServerResourcesForGroupVersion("metrics.k8s.io/v1beta1")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range resources.APIResources {
		got[r.Name] = r.Kind + " " + string(mustJSON(t, r.Verbs))
		if r.Namespaced != (r.Name == "pods") {
			t.Errorf("%s: namespaced %v", r.Name, r.Namespaced)
		}
	}
	if want := map[string]string{"nodes": `NodeMetrics ["get","list"]`, "pods": `PodMetrics ["get","list"]`}; !maps.Equal(got, want) {
		t.Errorf("resources %v, want %v", got, want)
	}

	// The published OpenAPI describes the types (kubectl explain), from the hand-written definitions.
	doc, err := client.Discovery().RESTClient().Get().AbsPath("/openapi/v3/apis/metrics.k8s.io/v1beta1").DoRaw(ctx)
	if err != nil || !strings.Contains(string(doc), `"io.k8s.metrics.pkg.apis.metrics.v1beta1.NodeMetricsList"`) {
		t.Errorf("OpenAPI v3 of metrics.k8s.io: %v\n%.300s", err, doc)
	}

	// The raw list kubectl top nodes asks for.
	raw, err := client.Discovery().RESTClient().Get().AbsPath("/apis/metrics.k8s.io/v1beta1/nodes").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var nodeList metricsv1beta1.NodeMetricsList
	if err := json.Unmarshal(raw, &nodeList); err != nil {
		t.Fatal(err)
	}
	if nodeList.Kind != "NodeMetricsList" || nodeList.APIVersion != "metrics.k8s.io/v1beta1" {
		t.Errorf("list kind %s %s", nodeList.APIVersion, nodeList.Kind)
	}
	if names := nodeNames(nodeList.Items); !slices.Equal(names, []string{"n1", "n2"}) {
		t.Fatalf("node metrics %v, want n1 and n2 (n3 has no metrics, ghost no Node):\n%s", names, raw)
	}
	n1 := nodeList.Items[0]
	if n1.Labels["role"] != "a" || !n1.Timestamp.Equal(&ts) || n1.Window != window ||
		n1.Usage.Cpu().MilliValue() != 250 || n1.Usage.Memory().Value() != 1<<30 {
		t.Errorf("n1 metrics %+v", n1)
	}

	// Selectors and get, through the typed client kubectl uses.
	selected, err := metrics.NodeMetricses().List(ctx, metav1.ListOptions{LabelSelector: "role=a"})
	if err != nil || !slices.Equal(nodeNames(selected.Items), []string{"n1"}) {
		t.Errorf("nodes with role=a: %v %v, want n1", nodeNames(selected.Items), err)
	}
	if m, err := metrics.NodeMetricses().Get(ctx, "n2", metav1.GetOptions{}); err != nil || m.Usage.Cpu().Value() != 1 {
		t.Errorf("get n2: %+v %v", m, err)
	}
	for _, name := range []string{"n3", "ghost", "nope"} {
		if _, err := metrics.NodeMetricses().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("get %s: %v, want NotFound", name, err)
		}
	}

	podCases := []struct {
		name, namespace, labels, fields string
		want                            []string
	}{
		{"namespace", "ns1", "", "", []string{"ns1/db", "ns1/web"}},
		{"label selector", "ns1", "app=web", "", []string{"ns1/web"}},
		{"all namespaces", "", "app=web", "", []string{"ns1/web", "ns2/job"}},
		{"field selector", "", "", "metadata.name=db", []string{"ns1/db"}},
		{"other namespace", "ns2", "", "", []string{"ns2/job"}},
	}
	for _, tc := range podCases {
		list, err := metrics.PodMetricses(tc.namespace).List(ctx, metav1.ListOptions{LabelSelector: tc.labels, FieldSelector: tc.fields})
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var names []string
		for _, m := range list.Items {
			names = append(names, m.Namespace+"/"+m.Name)
		}
		slices.Sort(names)
		if !slices.Equal(names, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, names, tc.want)
		}
	}
	web, err := metrics.PodMetricses("ns1").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if web.Labels["app"] != "web" || len(web.Containers) != 2 || web.Containers[0].Usage.Cpu().MilliValue() != 100 {
		t.Errorf("web metrics %+v", web)
	}
	if _, err := metrics.PodMetricses("ns1").Get(ctx, "new", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("get a pod without metrics: %v, want NotFound", err)
	}
	if _, err := metrics.PodMetricses("ns1").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=n1"}); !apierrors.IsBadRequest(err) {
		t.Errorf("an unsupported field selector: %v, want 400", err)
	}

	// kubectl get podmetrics: a table with the usage.
	table := &metav1.Table{}
	err = client.Discovery().RESTClient().Get().AbsPath("/apis/metrics.k8s.io/v1beta1/namespaces/ns1/pods").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx).Into(table)
	if err != nil {
		t.Fatal(err)
	}
	var columns []string
	for _, c := range table.ColumnDefinitions {
		columns = append(columns, c.Name)
	}
	if !slices.Equal(columns, []string{"Name", "CPU", "Memory", "Window"}) || len(table.Rows) != 2 {
		t.Fatalf("table columns %v, %d rows", columns, len(table.Rows))
	}
	for _, row := range table.Rows {
		if row.Cells[0] == "web" && (row.Cells[1] != "105m" || row.Cells[2] != "72Mi" || row.Cells[3] != "15s") {
			t.Errorf("web row %v, want the sum of its containers", row.Cells)
		}
	}
}

// TestMetricsAPIOff: without a metrics source the group is not served.
func TestMetricsAPIOff(t *testing.T) {
	t.Parallel()
	cfg := apiserver.SharedTestAPI(t)
	client := kubernetes.NewForConfigOrDie(cfg)
	groups, err := client.Discovery().ServerGroups()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups.Groups {
		if g.Name == "metrics.k8s.io" {
			t.Fatal("metrics.k8s.io is served without a metrics source")
		}
	}
}

func nodeNames(items []metricsv1beta1.NodeMetrics) []string {
	var names []string
	for _, m := range items {
		names = append(names, m.Name)
	}
	slices.Sort(names)
	return names
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
