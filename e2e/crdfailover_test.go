package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/skiff-dev/skiff/internal/proctest"
)

// failoverCRD is a namespaced CRD of group failover.skiff.dev that keeps any fields.
func failoverCRD(plural, kind string) *apiextensionsv1.CustomResourceDefinition {
	keep := true
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + ".failover.skiff.dev"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "failover.skiff.dev", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: plural, Kind: kind},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: &keep}}}},
		},
	}
}

// countingTransport counts the lists of one resource: LIST requests (GETs of the collection that are not
// watches) and streaming lists (watches with sendInitialEvents, which client-go's reflector sends instead of a
// LIST where the server supports them).
type countingTransport struct {
	next     http.RoundTripper
	resource string
	lists    *atomic.Int32
	// attempts records every list request's server and outcome, for a failure's report.
	attempts *syncBuilder
}

// RoundTrip counts the lists that were answered: an attempt refused while a new leader is elected (no
// leader to confirm a consistent read) is retried by the reflector, and is not a list the informer got.
func (c countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	q := req.URL.Query()
	resp, err := c.next.RoundTrip(req)
	if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/"+c.resource) || (q.Get("watch") == "true" && q.Get("sendInitialEvents") != "true") {
		return resp, err
	}
	outcome := fmt.Sprint(err)
	if err == nil {
		outcome = resp.Status
		if resp.StatusCode == http.StatusOK {
			c.lists.Add(1)
		}
	}
	fmt.Fprintf(c.attempts, "%s %s: %s\n", time.Now().Format("15:04:05.000"), req.URL.Host, outcome)
	return resp, err
}

// TestCustomResourcesAcrossLeaderKill is issue 28's failover row: the Raft leader is killed with kill -9 while
// custom resources are written through a follower and CRDs are created, updated and deleted. An informer on the
// custom resource, watching through the killed leader, resumes on another server from where it was, without
// relisting more than once, and ends with exactly the objects the cluster holds; once the killed server is back,
// every server holds the same CRDs (same resourceVersions, conditions and columns) and serves the same kinds.
func TestCustomResourcesAcrossLeaderKill(t *testing.T) {
	parallel(t)
	c := proctest.NewCluster(t, 3, "")
	for _, p := range c.Procs {
		c.Start(p)
	}
	for _, p := range c.Procs {
		proctest.WaitFor(t, p.Name+" kubeconfig", 60*time.Second, func() error {
			_, err := os.Stat(p.Kubeconfig())
			return err
		})
	}
	leader := c.ByName(c.HealthyPeers(c.Procs[0], 3))
	var writer *proctest.Proc
	var addrs []string
	for _, p := range c.Procs {
		if p != leader && writer == nil {
			writer = p
		}
		addrs = append(addrs, apiAddr(t, p.Kubeconfig()))
	}
	writerAddr := apiAddr(t, writer.Kubeconfig())
	writerFirst := []string{writerAddr}
	for _, a := range addrs {
		if a != writerAddr {
			writerFirst = append(writerFirst, a)
		}
	}
	writeCfg := failoverConfig(t, writer.Kubeconfig(), writerFirst)
	crds := apiextensionsclient.NewForConfigOrDie(writeCfg).ApiextensionsV1().CustomResourceDefinitions()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	retry := func(what string, f func() error) {
		t.Helper()
		for {
			err := f()
			if err == nil || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err) {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for _, crd := range []*apiextensionsv1.CustomResourceDefinition{failoverCRD("widgets", "Widget"), failoverCRD("gadgets", "Gadget")} {
		retry("create CRD "+crd.Name, func() error { _, err := crds.Create(ctx, crd, metav1.CreateOptions{}); return err })
	}
	widgetsGVR := schema.GroupVersionResource{Group: "failover.skiff.dev", Version: "v1", Resource: "widgets"}
	writeWidgets := dynamic.NewForConfigOrDie(writeCfg).Resource(widgetsGVR).Namespace("default")
	proctest.WaitFor(t, "widgets served", 60*time.Second, func() error {
		_, err := writeWidgets.List(ctx, metav1.ListOptions{})
		return err
	})

	// The informer watches through the leader, falling over to the others in order.
	informerCfg := failoverConfig(t, leader.Kubeconfig(), addrs)
	var lists atomic.Int32
	attempts := &syncBuilder{}
	informerCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return countingTransport{next: rt, resource: "widgets", lists: &lists, attempts: attempts}
	})
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dynamic.NewForConfigOrDie(informerCfg), 0, "default", nil)
	informer := factory.ForResource(widgetsGVR).Informer()
	var mu sync.Mutex
	addsSeen, deletesSeen := map[string]bool{}, map[string]bool{}
	informer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) {
		mu.Lock()
		addsSeen[obj.(*unstructured.Unstructured).GetName()] = true
		mu.Unlock()
	}, DeleteFunc: func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if u, ok := obj.(*unstructured.Unstructured); ok {
			mu.Lock()
			deletesSeen[u.GetName()] = true
			mu.Unlock()
		}
	}})
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("informer did not sync")
	}

	// Creates, updates with a precondition and deletes of widgets; at the 20th, kill -9 the leader and change
	// the CRDs while a new leader is elected.
	var deleted []string
	for i := 0; i < 60; i++ {
		if i == 20 {
			c.Kill(leader)
			retry("create CRD gizmos", func() error {
				_, err := crds.Create(ctx, failoverCRD("gizmos", "Gizmo"), metav1.CreateOptions{})
				return err
			})
			retry("update CRD widgets", func() error {
				crd, err := crds.Get(ctx, "widgets.failover.skiff.dev", metav1.GetOptions{})
				if err != nil {
					return err
				}
				crd.Spec.Versions[0].AdditionalPrinterColumns = []apiextensionsv1.CustomResourceColumnDefinition{{Name: "Size", Type: "integer", JSONPath: ".spec.size"}}
				_, err = crds.Update(ctx, crd, metav1.UpdateOptions{})
				return err
			})
			retry("delete CRD gadgets", func() error {
				return crds.Delete(ctx, "gadgets.failover.skiff.dev", metav1.DeleteOptions{})
			})
		}
		name := fmt.Sprintf("w-%03d", i)
		retry("create "+name, func() error {
			_, err := writeWidgets.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "failover.skiff.dev/v1", "kind": "Widget",
				"metadata": map[string]any{"name": name}, "spec": map[string]any{"size": int64(i)}}}, metav1.CreateOptions{})
			return err
		})
		if i%3 == 1 {
			retry("update "+name, func() error {
				w, err := writeWidgets.Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				_ = unstructured.SetNestedField(w.Object, int64(1000+i), "spec", "size")
				_, err = writeWidgets.Update(ctx, w, metav1.UpdateOptions{}) // w's resourceVersion is the precondition
				return err
			})
		}
		if i%3 == 2 {
			victim := fmt.Sprintf("w-%03d", i-2)
			retry("delete "+victim, func() error { return writeWidgets.Delete(ctx, victim, metav1.DeleteOptions{}) })
			deleted = append(deleted, victim)
		}
	}

	proctest.WaitFor(t, "the informer to match the cluster", 60*time.Second, func() error {
		list, err := writeWidgets.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var want, got []string
		for _, w := range list.Items {
			want = append(want, w.GetName()+"@"+w.GetResourceVersion())
		}
		for _, o := range informer.GetStore().List() {
			u := o.(*unstructured.Unstructured)
			got = append(got, u.GetName()+"@"+u.GetResourceVersion())
		}
		sort.Strings(want)
		sort.Strings(got)
		if len(want) != 60-len(deleted) {
			return fmt.Errorf("the cluster holds %d widgets, want %d", len(want), 60-len(deleted))
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			return fmt.Errorf("the informer has %d widgets, the cluster %d", len(got), len(want))
		}
		return nil
	})
	mu.Lock()
	for _, name := range deleted {
		if addsSeen[name] && !deletesSeen[name] {
			t.Errorf("the informer never delivered the delete of %s", name)
		}
	}
	mu.Unlock()
	// One list to start; a second only if the watch could not resume from its resourceVersion.
	if n := lists.Load(); n > 2 {
		t.Errorf("the informer listed widgets %d times across the leader's kill; want at most 2; its list requests:\n%s", n, attempts.String())
	} else {
		t.Logf("the informer listed widgets %d time(s)", n)
	}

	// The killed server back: every server holds the same CRDs and serves the same kinds.
	c.Start(leader)
	c.HealthyPeers(writer, 3)
	proctest.WaitFor(t, "every server to hold the same CRDs", 90*time.Second, func() error {
		var first string
		for _, p := range c.Procs {
			cfg := failoverConfig(t, p.Kubeconfig(), []string{apiAddr(t, p.Kubeconfig())})
			list, err := apiextensionsclient.NewForConfigOrDie(cfg).ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
			if err != nil {
				return fmt.Errorf("%s: %v", p.Name, err)
			}
			var rows []string
			for _, crd := range list.Items {
				established := false
				for _, c := range crd.Status.Conditions {
					established = established || c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue
				}
				var columns []string
				for _, col := range crd.Spec.Versions[0].AdditionalPrinterColumns {
					columns = append(columns, col.Name)
				}
				rows = append(rows, fmt.Sprintf("%s@%s established=%v columns=%v", crd.Name, crd.ResourceVersion, established, columns))
			}
			sort.Strings(rows)
			got := strings.Join(rows, "\n")
			want := []string{"gizmos.failover.skiff.dev@", "widgets.failover.skiff.dev@", "columns=[Size]"}
			for _, w := range want {
				if !strings.Contains(got, w) {
					return fmt.Errorf("%s lacks %q:\n%s", p.Name, w, got)
				}
			}
			if strings.Contains(got, "gadgets") || strings.Contains(got, "established=false") {
				return fmt.Errorf("%s:\n%s", p.Name, got)
			}
			if first == "" {
				first = got
			} else if got != first {
				return fmt.Errorf("%s differs:\n%s\nfrom:\n%s", p.Name, got, first)
			}
			dyn := dynamic.NewForConfigOrDie(cfg)
			if _, err := dyn.Resource(schema.GroupVersionResource{Group: "failover.skiff.dev", Version: "v1", Resource: "gizmos"}).Namespace("default").List(ctx, metav1.ListOptions{}); err != nil {
				return fmt.Errorf("%s: gizmos: %v", p.Name, err)
			}
			if _, err := dyn.Resource(schema.GroupVersionResource{Group: "failover.skiff.dev", Version: "v1", Resource: "gadgets"}).Namespace("default").List(ctx, metav1.ListOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s still serves gadgets: %v", p.Name, err)
			}
		}
		return nil
	})
}
