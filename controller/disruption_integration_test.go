package controller_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/skiff-dev/skiff/internal/servertest"
)

func budget(ns, name string, mutate func(*policyv1.PodDisruptionBudget)) *policyv1.PodDisruptionBudget {
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}
	mutate(pdb)
	return pdb
}

// markBudgetPodReady makes the pod Running, Ready or not, as its node agent would.
func markBudgetPodReady(t *testing.T, c kubernetes.Interface, ns, name string, ready bool) {
	t.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := c.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.Conditions = append(slices.DeleteFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodReady }),
			corev1.PodCondition{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()})
		_, err = c.CoreV1().Pods(ns).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("marking %s Ready: %v", name, err)
	}
}

// livePods are the names of the namespace's pods bound to a node and not being deleted, sorted.
func livePods(t *testing.T, c kubernetes.Interface, ns string) []string {
	t.Helper()
	list, err := c.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range list.Items {
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	sort.Strings(names)
	return names
}

// waitForBudget waits until the budget's status has these counts, observed at its generation; an expected
// count of -1 is not checked.
func waitForBudget(t *testing.T, c kubernetes.Interface, ns, name string, healthy, desired, expected, allowed int32) *policyv1.PodDisruptionBudget {
	t.Helper()
	var pdb *policyv1.PodDisruptionBudget
	want := fmt.Sprintf("healthy %d desired %d expected %d allowed %d", healthy, desired, expected, allowed)
	waitFor(t, name+"'s status "+want, func() (bool, string) {
		var err error
		pdb, err = c.PolicyV1().PodDisruptionBudgets(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		s := pdb.Status
		if expected < 0 {
			s.ExpectedPods = expected
		}
		got := fmt.Sprintf("healthy %d desired %d expected %d allowed %d", s.CurrentHealthy, s.DesiredHealthy, s.ExpectedPods, s.DisruptionsAllowed)
		return got == want && s.ObservedGeneration == pdb.Generation, fmt.Sprintf("%s, observed generation %d of %d", got, s.ObservedGeneration, pdb.Generation)
	})
	return pdb
}

func evict(c kubernetes.Interface, ns, pod string, dryRun bool) error {
	e := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: ns}}
	if dryRun {
		e.DeleteOptions = &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
	}
	return c.PolicyV1().Evictions(ns).Evict(context.Background(), e)
}

// TestDisruptionBudgets checks PodDisruptionBudgets end to end in one server: Kubernetes' defaults and
// validation (422 with field paths), the disruption controller's status for minAvailable and for a
// maxUnavailable percentage of a ReplicaSet's scale, and the eviction subresource spending the budget: a
// dry run spends nothing, one eviction is allowed, the next refused with 429 and Kubernetes' message, and
// a pod covered by two budgets cannot be evicted (500).
func TestDisruptionBudgets(t *testing.T) {
	// A server of its own: its node would take the pods of the other tests' workloads, whose deletion then
	// waits for a kubelet that is not there.
	t.Parallel()
	p := servertest.Start(t, 1)[0]
	c := p.Client
	ns := servertest.Namespace(t, p, "pdb")
	ctx := context.Background()
	pdbs := c.PolicyV1().PodDisruptionBudgets(ns)

	t.Run("validation", func(t *testing.T) {
		cases := []struct {
			name   string
			mutate func(*policyv1.PodDisruptionBudget)
			fields []string
		}{
			{"both", func(p *policyv1.PodDisruptionBudget) {
				one := intstr.FromInt32(1)
				p.Spec.MinAvailable, p.Spec.MaxUnavailable = &one, &one
			}, []string{"spec"}},
			{"negative", func(p *policyv1.PodDisruptionBudget) {
				n := intstr.FromInt32(-1)
				p.Spec.MinAvailable = &n
			}, []string{"spec.minAvailable"}},
			{"over-100", func(p *policyv1.PodDisruptionBudget) {
				n := intstr.FromString("150%")
				p.Spec.MaxUnavailable = &n
			}, []string{"spec.maxUnavailable"}},
			{"policy", func(p *policyv1.PodDisruptionBudget) {
				bad := policyv1.UnhealthyPodEvictionPolicyType("Sometimes")
				p.Spec.UnhealthyPodEvictionPolicy = &bad
			}, []string{"spec.unhealthyPodEvictionPolicy"}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				_, err := pdbs.Create(ctx, budget(ns, "bad-"+tc.name, tc.mutate), metav1.CreateOptions{})
				if got := causes(t, err); !slices.Equal(got, tc.fields) {
					t.Errorf("causes %v, want %v (%v)", got, tc.fields, err)
				}
			})
		}
		// A create cannot set status; the generation starts at 1.
		in := budget(ns, "status", func(p *policyv1.PodDisruptionBudget) {
			two := intstr.FromInt32(2)
			p.Spec.MinAvailable = &two
			p.Status.DisruptionsAllowed = 5
		})
		out, err := pdbs.Create(ctx, in, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if out.Status.DisruptionsAllowed != 0 || out.Generation != 1 {
			t.Errorf("created with status %+v, generation %d", out.Status, out.Generation)
		}
		if err := pdbs.Delete(ctx, out.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	// Three pods of a ReplicaSet on one node, made Ready by the test as an agent would.
	dsNode(t, c, "pdb-node", nil)
	replicas := int32(3)
	labels := map[string]string{"app": "web"}
	_, err := c.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1.ReplicaSetSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.local/web:1"}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pods []string
	waitFor(t, "3 pods bound", func() (bool, string) {
		pods = livePods(t, c, ns)
		return len(pods) == 3, strings.Join(pods, ",")
	})
	for _, p := range pods {
		markBudgetPodReady(t, c, ns, p, true)
	}

	two := intstr.FromInt32(2)
	_, err = pdbs.Create(ctx, budget(ns, "web-min", func(p *policyv1.PodDisruptionBudget) { p.Spec.MinAvailable = &two }), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitForBudget(t, c, ns, "web-min", 3, 2, 3, 1)

	// A second budget over the same pods, maxUnavailable 50% of the ReplicaSet's 3 (rounded up): 1 needed.
	half := intstr.FromString("50%")
	_, err = pdbs.Create(ctx, budget(ns, "web-max", func(p *policyv1.PodDisruptionBudget) { p.Spec.MaxUnavailable = &half }), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitForBudget(t, c, ns, "web-max", 3, 1, 3, 2)
	err = evict(c, ns, pods[0], false)
	if code := statusCode(err); code != http.StatusInternalServerError || !strings.Contains(err.Error(), "more than one PodDisruptionBudget") {
		t.Fatalf("evicting a pod of two budgets: %d %v, want 500", code, err)
	}
	if err := pdbs.Delete(ctx, "web-max", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// A dry run is allowed and spends nothing.
	if err := evict(c, ns, pods[0], true); err != nil {
		t.Fatalf("dry-run eviction: %v", err)
	}
	pdb, err := pdbs.Get(ctx, "web-min", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pdb.Status.DisruptionsAllowed != 1 || len(pdb.Status.DisruptedPods) != 0 {
		t.Errorf("after a dry run: allowed %d, disrupted %v", pdb.Status.DisruptionsAllowed, pdb.Status.DisruptedPods)
	}
	if got := livePods(t, c, ns); !slices.Equal(got, pods) {
		t.Errorf("after a dry run, live pods %v, want %v", got, pods)
	}

	// One eviction is allowed: the pod is deleted with the DisruptionTarget condition and recorded.
	if err := evict(c, ns, pods[0], false); err != nil {
		t.Fatalf("first eviction: %v", err)
	}
	pod, err := c.CoreV1().Pods(ns).Get(ctx, pods[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.DeletionTimestamp == nil || !slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue && c.Reason == "EvictionByEvictionAPI"
	}) {
		t.Errorf("evicted pod: deletionTimestamp %v, conditions %+v", pod.DeletionTimestamp, pod.Status.Conditions)
	}

	// The next would break the budget: 429 with Kubernetes' message.
	err = evict(c, ns, pods[1], false)
	if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "Cannot evict pod as it would violate the pod's disruption budget.") {
		t.Fatalf("second eviction: %v, want 429", err)
	}
	if got := livePods(t, c, ns); !slices.Contains(got, pods[1]) {
		t.Errorf("refused eviction deleted %s: live %v", pods[1], got)
	}
	// The controller agrees: two healthy (the evicted pod is going, the ReplicaSet's replacement is not
	// Ready), none to spare; minAvailable as a number expects every matching pod, those four included.
	waitForBudget(t, c, ns, "web-min", 2, 2, 4, 0)
	err = evict(c, ns, pods[2], false)
	var status apierrors.APIStatus
	if !apierrors.IsTooManyRequests(err) || !errors.As(err, &status) || status.Status().Details == nil || len(status.Status().Details.Causes) == 0 ||
		status.Status().Details.Causes[0].Message != "The disruption budget web-min needs 2 healthy pods and has 2 currently" {
		t.Fatalf("third eviction: %v, want 429 naming the budget's need", err)
	}

	// A pod that runs but is not Ready does not count as healthy: while the budget is met without it
	// (IfHealthyBudget, the default), it is evicted without spending the budget.
	replacement := func(known ...string) string {
		var name string
		waitFor(t, "a replacement pod bound", func() (bool, string) {
			live := livePods(t, c, ns)
			for _, p := range live {
				if !slices.Contains(known, p) {
					name = p
					return true, ""
				}
			}
			return false, strings.Join(live, ",")
		})
		markBudgetPodReady(t, c, ns, name, false)
		return name
	}
	unready := replacement(pods...)
	if err := evict(c, ns, unready, false); err != nil {
		t.Fatalf("evicting an unready pod while the budget is met: %v", err)
	}
	pdb, err = pdbs.Get(ctx, "web-min", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, spent := pdb.Status.DisruptedPods[unready]; spent || pdb.Status.DisruptionsAllowed != 0 {
		t.Errorf("evicting an unready pod spent the budget: allowed %d, disrupted %v", pdb.Status.DisruptionsAllowed, pdb.Status.DisruptedPods)
	}

	// With minAvailable 3 the budget is not met: an unready pod is refused, unless the budget's
	// unhealthyPodEvictionPolicy is AlwaysAllow.
	change := func(mutate func(*policyv1.PodDisruptionBudget)) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := pdbs.Get(ctx, "web-min", metav1.GetOptions{})
			if err != nil {
				return err
			}
			mutate(cur)
			_, err = pdbs.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	three := intstr.FromInt32(3)
	change(func(p *policyv1.PodDisruptionBudget) { p.Spec.MinAvailable = &three })
	unready = replacement(append(pods, unready)...)
	waitForBudget(t, c, ns, "web-min", 2, 3, -1, 0)
	if err := evict(c, ns, unready, false); !apierrors.IsTooManyRequests(err) {
		t.Fatalf("evicting an unready pod while the budget is not met: %v, want 429", err)
	}
	always := policyv1.AlwaysAllow
	change(func(p *policyv1.PodDisruptionBudget) { p.Spec.UnhealthyPodEvictionPolicy = &always })
	waitForBudget(t, c, ns, "web-min", 2, 3, -1, 0)
	if err := evict(c, ns, unready, false); err != nil {
		t.Fatalf("evicting an unready pod under AlwaysAllow: %v", err)
	}
}

func statusCode(err error) int32 {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Code
	}
	return 0
}
