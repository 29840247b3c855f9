package controller_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	appsv1apply "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1apply "k8s.io/client-go/applyconfigurations/core/v1"
	metav1apply "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// dsNode registers a Node directly through the API, as a simulated node no agent runs (the node lifecycle
// controller leaves a Node without gossip member or Lease as its writer set it).
func dsNode(t *testing.T, c kubernetes.Interface, name string, labels map[string]string, taints ...corev1.Taint) {
	t.Helper()
	all := map[string]string{corev1.LabelHostname: name}
	for k, v := range labels {
		all[k] = v
	}
	alloc := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods: resource.MustParse("110")}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: all}, Spec: corev1.NodeSpec{Taints: taints},
		Status: corev1.NodeStatus{Capacity: alloc, Allocatable: alloc,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	if _, err := c.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func daemonSet(ns, name string, mutate func(*appsv1.DaemonSet)) *appsv1.DaemonSet {
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"ds": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"ds": name}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "registry.local/agent:1"}}},
			},
		},
	}
	if mutate != nil {
		mutate(ds)
	}
	return ds
}

// fakeKubelets stand in for node agents: a bound pod of the namespace becomes Running and Ready a little
// after it is bound, and a pod being deleted is confirmed gone at once. Every pod it marked Ready is
// recorded with its node.
type fakeKubelets struct {
	c     kubernetes.Interface
	ns    string
	delay time.Duration

	mu    sync.Mutex
	ready map[string]bool // pod names marked Ready
}

func startFakeKubelets(t *testing.T, c kubernetes.Interface, ns string, delay time.Duration) *fakeKubelets {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := c.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelets{c: c, ns: ns, delay: delay, ready: map[string]bool{}}
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); w.Stop(); wg.Wait() })
	wg.Go(func() {
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			switch {
			case pod.DeletionTimestamp != nil:
				zero := int64(0)
				err := c.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
				if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
					t.Errorf("confirming the deletion of %s: %v", pod.Name, err)
				}
			case pod.Spec.NodeName != "" && pod.Status.Phase == corev1.PodPending && !k.marked(pod.Name):
				k.mark(pod.Name)
				name := pod.Name
				wg.Go(func() {
					select {
					case <-ctx.Done():
						return
					case <-time.After(k.delay):
					}
					k.run(ctx, t, name)
				})
			}
		}
	})
	return k
}

func (k *fakeKubelets) marked(name string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.ready[name]
}

func (k *fakeKubelets) mark(name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ready[name] = true
}

// run makes the pod Running and Ready now.
func (k *fakeKubelets) run(ctx context.Context, t *testing.T, name string) {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := k.c.CoreV1().Pods(k.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		pod.Status.Phase = corev1.PodRunning
		pod.Status.Conditions = slices.DeleteFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodReady })
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now})
		_, err = k.c.CoreV1().Pods(k.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		t.Errorf("marking %s Ready: %v", name, err)
	}
}

// dsPods are the live pods a DaemonSet controls, by node ("" for pods not bound yet).
func dsPods(t *testing.T, c kubernetes.Interface, ns string, ds *appsv1.DaemonSet) map[string][]corev1.Pod {
	t.Helper()
	list, err := c.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]corev1.Pod{}
	for _, p := range list.Items {
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.UID == ds.UID && p.DeletionTimestamp == nil {
			out[p.Spec.NodeName] = append(out[p.Spec.NodeName], p)
		}
	}
	return out
}

func nodesOf(pods map[string][]corev1.Pod) string {
	var nodes []string
	for n, ps := range pods {
		for range ps {
			nodes = append(nodes, n)
		}
	}
	sort.Strings(nodes)
	return strings.Join(nodes, ",")
}

// waitForDaemonPods waits until the DaemonSet has exactly one bound pod on each of nodes and none elsewhere.
func waitForDaemonPods(t *testing.T, c kubernetes.Interface, ns string, ds *appsv1.DaemonSet, nodes ...string) map[string][]corev1.Pod {
	t.Helper()
	sort.Strings(nodes)
	want := strings.Join(nodes, ",")
	var pods map[string][]corev1.Pod
	waitFor(t, fmt.Sprintf("%s's pods on %s", ds.Name, want), func() (bool, string) {
		pods = dsPods(t, c, ns, ds)
		return nodesOf(pods) == want, "pods on " + nodesOf(pods)
	})
	return pods
}

// holdDaemonPods checks for a while that the DaemonSet keeps exactly one pod on each of nodes.
func holdDaemonPods(t *testing.T, c kubernetes.Interface, ns string, ds *appsv1.DaemonSet, nodes ...string) {
	t.Helper()
	sort.Strings(nodes)
	want := strings.Join(nodes, ",")
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if got := nodesOf(dsPods(t, c, ns, ds)); got != want {
			t.Fatalf("%s's pods on %s, want %s", ds.Name, got, want)
		}
	}
}

// causes are the field paths of a 422's causes.
func causes(t *testing.T, err error) []string {
	t.Helper()
	var status apierrors.APIStatus
	if !errors.As(err, &status) || !apierrors.IsInvalid(err) {
		t.Fatalf("want 422 Invalid, got %v", err)
	}
	var fields []string
	if d := status.Status().Details; d != nil {
		for _, c := range d.Causes {
			fields = append(fields, c.Field)
		}
	}
	return fields
}

// TestDaemonSetAPI checks that DaemonSets and ControllerRevisions get Kubernetes' defaults, validation
// (422 with field paths) and status rules.
func TestDaemonSetAPI(t *testing.T) {
	t.Parallel()
	p := servertest.Shared(t)
	c := p.Client
	ns := servertest.Namespace(t, p, "ds")
	ctx := context.Background()
	dss := c.AppsV1().DaemonSets(ns)

	t.Run("defaults", func(t *testing.T) {
		in := daemonSet(ns, "defaults", nil)
		in.Status.DesiredNumberScheduled = 7 // a create cannot set status
		ds, err := dss.Create(ctx, in, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		us := ds.Spec.UpdateStrategy
		if us.Type != appsv1.RollingUpdateDaemonSetStrategyType || us.RollingUpdate == nil ||
			us.RollingUpdate.MaxUnavailable == nil || *us.RollingUpdate.MaxUnavailable != intstr.FromInt32(1) ||
			us.RollingUpdate.MaxSurge == nil || *us.RollingUpdate.MaxSurge != intstr.FromInt32(0) {
			t.Errorf("updateStrategy %+v, want RollingUpdate with maxUnavailable 1 and maxSurge 0", us)
		}
		if ds.Spec.RevisionHistoryLimit == nil || *ds.Spec.RevisionHistoryLimit != 10 {
			t.Errorf("revisionHistoryLimit %v, want 10", ds.Spec.RevisionHistoryLimit)
		}
		spec := ds.Spec.Template.Spec
		ctr := spec.Containers[0]
		if spec.RestartPolicy != corev1.RestartPolicyAlways || spec.DNSPolicy != corev1.DNSClusterFirst ||
			spec.SchedulerName != corev1.DefaultSchedulerName || spec.TerminationGracePeriodSeconds == nil ||
			spec.SecurityContext == nil || ctr.TerminationMessagePath != corev1.TerminationMessagePathDefault ||
			ctr.ImagePullPolicy != corev1.PullIfNotPresent || ctr.TerminationMessagePolicy != corev1.TerminationMessageReadFile {
			t.Errorf("template not defaulted as Kubernetes does: %+v", spec)
		}
		if ds.Generation != 1 || ds.Annotations[appsv1.DeprecatedTemplateGeneration] != "1" || ds.Status.DesiredNumberScheduled != 0 {
			t.Errorf("generation %d, template generation %q, status %+v", ds.Generation, ds.Annotations[appsv1.DeprecatedTemplateGeneration], ds.Status)
		}

		// change gets the DaemonSet afresh, changes it and sends it, again on a conflict: the controller
		// writes its status meanwhile.
		change := func(mutate func(*appsv1.DaemonSet), send func(context.Context, *appsv1.DaemonSet, metav1.UpdateOptions) (*appsv1.DaemonSet, error)) (*appsv1.DaemonSet, error) {
			var out *appsv1.DaemonSet
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				ds, err := dss.Get(ctx, "defaults", metav1.GetOptions{})
				if err != nil {
					return err
				}
				mutate(ds)
				out, err = send(ctx, ds, metav1.UpdateOptions{})
				return err
			})
			return out, err
		}
		// A template change bumps generation and template generation; a status sent to the main resource
		// is dropped, and /status keeps the spec.
		ds, err = change(func(ds *appsv1.DaemonSet) {
			ds.Spec.Template.Spec.Containers[0].Image = "registry.local/agent:2"
			ds.Status.NumberReady = 5
		}, dss.Update)
		if err != nil {
			t.Fatal(err)
		}
		if ds.Generation != 2 || ds.Annotations[appsv1.DeprecatedTemplateGeneration] != "2" || ds.Status.NumberReady == 5 {
			t.Errorf("after a template update: generation %d, template generation %q, numberReady %d",
				ds.Generation, ds.Annotations[appsv1.DeprecatedTemplateGeneration], ds.Status.NumberReady)
		}
		ds, err = change(func(ds *appsv1.DaemonSet) {
			ds.Status.ObservedGeneration, ds.Status.NumberReady = 2, 3
			ds.Spec.Template.Spec.Containers[0].Image = "registry.local/agent:3"
		}, dss.UpdateStatus)
		if err != nil {
			t.Fatal(err)
		}
		if ds.Status.NumberReady != 3 || ds.Spec.Template.Spec.Containers[0].Image != "registry.local/agent:2" || ds.Generation != 2 {
			t.Errorf("after a status update: numberReady %d, image %s, generation %d", ds.Status.NumberReady,
				ds.Spec.Template.Spec.Containers[0].Image, ds.Generation)
		}
		// Kubernetes' status validation: counts are not negative.
		_, err = change(func(ds *appsv1.DaemonSet) { ds.Status.NumberReady = -1 }, dss.UpdateStatus)
		if got := causes(t, err); !slices.Contains(got, "status.numberReady") {
			t.Errorf("negative numberReady: causes %v", got)
		}
		// The selector is immutable.
		_, err = change(func(ds *appsv1.DaemonSet) {
			ds.Spec.Selector.MatchLabels["extra"] = "x"
			ds.Spec.Template.Labels["extra"] = "x"
		}, dss.Update)
		if got := causes(t, err); !slices.Contains(got, "spec.selector") {
			t.Errorf("selector change: causes %v", got)
		}
	})

	t.Run("server-side apply", func(t *testing.T) {
		apply := func(manager, image string, force bool) (*appsv1.DaemonSet, error) {
			cfg := appsv1apply.DaemonSet("applied", ns).WithSpec(appsv1apply.DaemonSetSpec().
				WithSelector(metav1apply.LabelSelector().WithMatchLabels(map[string]string{"ds": "applied"})).
				WithTemplate(corev1apply.PodTemplateSpec().WithLabels(map[string]string{"ds": "applied"}).
					WithSpec(corev1apply.PodSpec().WithContainers(corev1apply.Container().WithName("agent").WithImage(image)))))
			return dss.Apply(ctx, cfg, metav1.ApplyOptions{FieldManager: manager, Force: force})
		}
		ds, err := apply("ops", "registry.local/agent:1", false)
		if err != nil {
			t.Fatal(err)
		}
		if ds.Spec.RevisionHistoryLimit == nil || *ds.Spec.RevisionHistoryLimit != 10 || ds.Generation != 1 {
			t.Errorf("applied: revisionHistoryLimit %v, generation %d", ds.Spec.RevisionHistoryLimit, ds.Generation)
		}
		if ds, err = apply("ops", "registry.local/agent:2", false); err != nil || ds.Generation != 2 {
			t.Fatalf("re-applied: %v, generation %d", err, ds.Generation)
		}
		// Another manager changing the image conflicts unless it forces.
		if _, err := apply("other", "registry.local/agent:3", false); !apierrors.IsConflict(err) {
			t.Errorf("apply by another manager: %v, want a conflict", err)
		}
		if ds, err = apply("other", "registry.local/agent:3", true); err != nil || ds.Spec.Template.Spec.Containers[0].Image != "registry.local/agent:3" {
			t.Errorf("forced apply: %v", err)
		}
	})

	cases := []struct {
		name   string
		mutate func(*appsv1.DaemonSet)
		field  string
	}{
		{"selector does not match the template", func(ds *appsv1.DaemonSet) { ds.Spec.Template.Labels = map[string]string{"other": "x"} },
			"spec.template.metadata.labels"},
		{"restartPolicy Never", func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever },
			"spec.template.spec.restartPolicy"},
		{"maxUnavailable and maxSurge both 0", func(ds *appsv1.DaemonSet) {
			zero := intstr.FromInt32(0)
			ds.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateDaemonSet{MaxUnavailable: &zero, MaxSurge: &zero}
		}, "spec.updateStrategy.rollingUpdate.maxUnavailable"},
		{"unknown update strategy", func(ds *appsv1.DaemonSet) { ds.Spec.UpdateStrategy.Type = "Sometimes" }, "spec.updateStrategy"},
		{"no containers", func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.Containers = nil }, "spec.template.spec.containers"},
		{"negative minReadySeconds", func(ds *appsv1.DaemonSet) { ds.Spec.MinReadySeconds = -1 }, "spec.minReadySeconds"},
		// Kubernetes accepts it; Skiff's agents cannot mount it, so Skiff refuses it as it does for pods.
		{"unsupported volume type", func(ds *appsv1.DaemonSet) {
			ds.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				NFS: &corev1.NFSVolumeSource{Server: "nfs.example", Path: "/export"}}}}
		}, "spec.template.spec.volumes[0]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dss.Create(ctx, daemonSet(ns, "invalid", tc.mutate), metav1.CreateOptions{})
			if got := causes(t, err); !slices.Contains(got, tc.field) {
				t.Errorf("causes %v, want %s among them", got, tc.field)
			}
		})
	}

	t.Run("controllerrevisions", func(t *testing.T) {
		crs := c.AppsV1().ControllerRevisions(ns)
		_, err := crs.Create(ctx, &appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Name: "nodata"}, Revision: 1}, metav1.CreateOptions{})
		if got := causes(t, err); !slices.Contains(got, "data") {
			t.Errorf("no data: causes %v", got)
		}
		cr, err := crs.Create(ctx, &appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Name: "r1"}, Revision: 1,
			Data: runtime.RawExtension{Raw: []byte(`{"spec":{"template":{"$patch":"replace"}}}`)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if string(cr.Data.Raw) != `{"spec":{"template":{"$patch":"replace"}}}` {
			t.Errorf("data stored as %s", cr.Data.Raw)
		}
		// The revision number may change (kubectl rollout undo renumbers), the data may not.
		cr.Revision = 3
		if cr, err = crs.Update(ctx, cr, metav1.UpdateOptions{}); err != nil || cr.Revision != 3 {
			t.Fatalf("revision update: %v", err)
		}
		cr.Data.Raw = []byte(`{"spec":{}}`)
		_, err = crs.Update(ctx, cr, metav1.UpdateOptions{})
		if got := causes(t, err); !slices.Contains(got, "data") {
			t.Errorf("data change: causes %v", got)
		}
	})
}

// TestDaemonSetController runs Kubernetes' DaemonSet controller on a real server with nodes registered
// through the API and pods made Ready by fake kubelets: one pod per eligible node, placed by the scheduler;
// node selector and taints respected; a node added later gets its pod; a rolling update replaces the pods
// one node at a time.
func TestDaemonSetController(t *testing.T) {
	// A server of its own: its nodes would take the pods of the other tests' workloads.
	t.Parallel()
	p := servertest.Start(t, 1)[0]
	c := p.Client
	ns := servertest.Namespace(t, p, "ds")
	ctx := context.Background()
	infra := corev1.Taint{Key: "dedicated", Value: "infra", Effect: corev1.TaintEffectNoSchedule}
	dsNode(t, c, "ds-a", map[string]string{"disk": "ssd"})
	dsNode(t, c, "ds-b", nil)
	dsNode(t, c, "ds-c", nil, infra)
	kubelets := startFakeKubelets(t, c, ns, 300*time.Millisecond)
	dss := c.AppsV1().DaemonSets(ns)

	everywhere, err := dss.Create(ctx, daemonSet(ns, "everywhere", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tolerant, err := dss.Create(ctx, daemonSet(ns, "tolerant", func(ds *appsv1.DaemonSet) {
		ds.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "infra", Effect: corev1.TaintEffectNoSchedule}}
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ssd, err := dss.Create(ctx, daemonSet(ns, "ssd", func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.NodeSelector = map[string]string{"disk": "ssd"} }), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("one pod per eligible node", func(t *testing.T) {
		pods := waitForDaemonPods(t, c, ns, everywhere, "ds-a", "ds-b")
		waitForDaemonPods(t, c, ns, tolerant, "ds-a", "ds-b", "ds-c")
		waitForDaemonPods(t, c, ns, ssd, "ds-a")
		holdDaemonPods(t, c, ns, everywhere, "ds-a", "ds-b")
		holdDaemonPods(t, c, ns, ssd, "ds-a")

		// Each pod is pinned to its node by node affinity on metadata.name (the scheduler bound it there)
		// and carries the tolerations Kubernetes gives daemon pods.
		for node, ps := range pods {
			p := ps[0]
			terms := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
			if len(terms) != 1 || len(terms[0].MatchFields) != 1 || terms[0].MatchFields[0].Key != "metadata.name" ||
				!slices.Equal(terms[0].MatchFields[0].Values, []string{node}) {
				t.Errorf("pod %s on %s: node affinity %+v", p.Name, node, terms)
			}
			for _, taint := range []string{corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable, corev1.TaintNodeDiskPressure,
				corev1.TaintNodeMemoryPressure, corev1.TaintNodePIDPressure, corev1.TaintNodeUnschedulable} {
				if !slices.ContainsFunc(p.Spec.Tolerations, func(tol corev1.Toleration) bool { return tol.Key == taint }) {
					t.Errorf("pod %s: no toleration of %s in %+v", p.Name, taint, p.Spec.Tolerations)
				}
			}
		}
		waitFor(t, "everywhere's status", func() (bool, string) {
			ds, err := dss.Get(ctx, "everywhere", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			s := ds.Status
			return s.DesiredNumberScheduled == 2 && s.CurrentNumberScheduled == 2 && s.NumberReady == 2 && s.NumberAvailable == 2 &&
				s.UpdatedNumberScheduled == 2 && s.ObservedGeneration == ds.Generation, fmt.Sprintf("%+v", s)
		})
	})

	t.Run("a node added later gets a pod", func(t *testing.T) {
		dsNode(t, c, "ds-d", nil)
		waitForDaemonPods(t, c, ns, everywhere, "ds-a", "ds-b", "ds-d")
		waitForDaemonPods(t, c, ns, tolerant, "ds-a", "ds-b", "ds-c", "ds-d")
		holdDaemonPods(t, c, ns, ssd, "ds-a")
	})

	t.Run("a rolling update replaces one pod at a time", func(t *testing.T) {
		for _, ps := range waitForDaemonPods(t, c, ns, everywhere, "ds-a", "ds-b", "ds-d") {
			name := ps[0].Name
			waitFor(t, name+" Ready", func() (bool, string) { return kubelets.marked(name), "" })
		}
		waitFor(t, "everywhere available on 3 nodes", func() (bool, string) {
			ds, err := dss.Get(ctx, "everywhere", metav1.GetOptions{})
			return err == nil && ds.Status.NumberAvailable == 3, fmt.Sprint(err)
		})
		// Watch the pods: at no moment may more than one node lack an available pod (maxUnavailable 1).
		list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "ds=everywhere"})
		if err != nil {
			t.Fatal(err)
		}
		live := map[string]*corev1.Pod{}
		for i := range list.Items {
			live[list.Items[i].Name] = &list.Items[i]
		}
		w, err := c.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "ds=everywhere", ResourceVersion: list.ResourceVersion})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		worst := 0
		done := make(chan struct{})
		go func() {
			defer close(done)
			for ev := range w.ResultChan() {
				p, ok := ev.Object.(*corev1.Pod)
				if !ok {
					continue
				}
				if ev.Type == watch.Deleted || p.DeletionTimestamp != nil {
					delete(live, p.Name)
				} else {
					live[p.Name] = p
				}
				available := map[string]bool{}
				for _, p := range live {
					if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != "" {
						available[p.Spec.NodeName] = true
					}
				}
				worst = max(worst, 3-len(available))
			}
		}()

		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			ds, err := dss.Get(ctx, "everywhere", metav1.GetOptions{})
			if err != nil {
				return err
			}
			ds.Spec.Template.Spec.Containers[0].Image = "registry.local/agent:2"
			_, err = dss.Update(ctx, ds, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "every pod of everywhere updated and available", func() (bool, string) {
			pods := dsPods(t, c, ns, everywhere)
			var images []string
			for _, ps := range pods {
				for _, p := range ps {
					images = append(images, p.Spec.Containers[0].Image)
				}
			}
			ds, err := dss.Get(ctx, "everywhere", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			s := ds.Status
			return nodesOf(pods) == "ds-a,ds-b,ds-d" && !slices.Contains(images, "registry.local/agent:1") &&
					s.UpdatedNumberScheduled == 3 && s.NumberAvailable == 3 && s.ObservedGeneration == ds.Generation,
				fmt.Sprintf("pods on %s, images %v, status %+v", nodesOf(pods), images, s)
		})
		w.Stop()
		<-done
		if worst != 1 {
			t.Errorf("at worst %d nodes lacked a running pod during the update, want 1 (one at a time)", worst)
		}
		// The update made a second ControllerRevision.
		crs, err := c.AppsV1().ControllerRevisions(ns).List(ctx, metav1.ListOptions{LabelSelector: "ds=everywhere"})
		if err != nil || len(crs.Items) != 2 {
			t.Fatalf("controller revisions of everywhere: %v, %v", crs, err)
		}
	})

	// setSSD changes the ssd DaemonSet (one pod, on ds-a).
	setSSD := func(change func(*appsv1.DaemonSet)) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			ds, err := dss.Get(ctx, "ssd", metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(ds)
			_, err = dss.Update(ctx, ds, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	ssdImage := func() string {
		pods := dsPods(t, c, ns, ssd)["ds-a"]
		if len(pods) != 1 {
			return fmt.Sprintf("%d pods", len(pods))
		}
		return pods[0].Spec.Containers[0].Image
	}

	t.Run("maxSurge starts the new pod before the old one stops", func(t *testing.T) {
		w, err := c.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "ds=ssd"})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		live := map[string]bool{}
		most := make(chan int, 1)
		go func() {
			n := 0
			for ev := range w.ResultChan() {
				if p, ok := ev.Object.(*corev1.Pod); ok {
					live[p.Name] = ev.Type != watch.Deleted && p.DeletionTimestamp == nil
					count := 0
					for _, l := range live {
						if l {
							count++
						}
					}
					n = max(n, count)
				}
			}
			most <- n
		}()
		setSSD(func(ds *appsv1.DaemonSet) {
			zero, one := intstr.FromInt32(0), intstr.FromInt32(1)
			ds.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateDaemonSet{MaxUnavailable: &zero, MaxSurge: &one}
			ds.Spec.Template.Spec.Containers[0].Image = "registry.local/agent:surge"
		})
		waitFor(t, "ssd's pod replaced", func() (bool, string) {
			img := ssdImage()
			return img == "registry.local/agent:surge", img
		})
		w.Stop()
		if n := <-most; n != 2 {
			t.Errorf("at most %d live pods on ds-a during a surge update, want 2 (new before old)", n)
		}
	})

	t.Run("OnDelete replaces only deleted pods", func(t *testing.T) {
		setSSD(func(ds *appsv1.DaemonSet) {
			ds.Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType}
			ds.Spec.Template.Spec.Containers[0].Image = "registry.local/agent:ondelete"
		})
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			if img := ssdImage(); img != "registry.local/agent:surge" {
				t.Fatalf("OnDelete: the pod on ds-a changed to %s without being deleted", img)
			}
		}
		old := dsPods(t, c, ns, ssd)["ds-a"][0].Name
		if err := c.CoreV1().Pods(ns).Delete(ctx, old, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "ssd's pod recreated with the new template", func() (bool, string) {
			img := ssdImage()
			return img == "registry.local/agent:ondelete", img
		})
	})

	// Kubernetes' DaemonSet controller does not watch Node deletions: the node lifecycle controller deletes
	// the pods bound to a Node that is gone after a 40 s quarantine (as Kubernetes' pod GC does), and the
	// DaemonSet, told of its pod's deletion, stops counting the node.
	t.Run("a node that leaves is no longer counted", func(t *testing.T) {
		if err := c.CoreV1().Nodes().Delete(ctx, "ds-d", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(90 * time.Second)
		for {
			ds, err := dss.Get(ctx, "everywhere", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pods := dsPods(t, c, ns, everywhere)
			if ds.Status.DesiredNumberScheduled == 2 && ds.Status.NumberAvailable == 2 && nodesOf(pods) == "ds-a,ds-b" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("90 s after ds-d was deleted: pods on %s, status %+v", nodesOf(pods), ds.Status)
			}
			time.Sleep(500 * time.Millisecond)
		}
	})
}
