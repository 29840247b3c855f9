package controller_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestNamespaceDeletionOrderAndConditions deletes a namespace holding a pod kept by a finalizer and a
// ConfigMap, as the conformance suite's ordered deletion test does: the pod goes first and the ConfigMap
// stays while it is there, the namespace's status carries Kubernetes' deletion conditions saying what
// remains and which finalizer holds it, and once the finalizer is gone the rest goes and so does the
// namespace.
func TestNamespaceDeletionOrderAndConditions(t *testing.T) {
	t.Parallel()
	p := servertest.Shared(t)
	c := p.Client
	ctx := context.Background()
	ns := servertest.Namespace(t, p, "ordered")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "held", Finalizers: []string{"e2e.example.com/finalizer"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}}}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	condition := func(n *corev1.Namespace, typ corev1.NamespaceConditionType) string {
		i := slices.IndexFunc(n.Status.Conditions, func(c corev1.NamespaceCondition) bool { return c.Type == typ })
		if i < 0 {
			return "none"
		}
		cond := n.Status.Conditions[i]
		return fmt.Sprintf("%s %s: %s", cond.Status, cond.Reason, cond.Message)
	}
	want := map[corev1.NamespaceConditionType]string{
		corev1.NamespaceDeletionDiscoveryFailure: "False ResourcesDiscovered: All resources successfully discovered",
		corev1.NamespaceDeletionGVParsingFailure: "False ParsedGroupVersions: All legacy kube types successfully parsed",
		corev1.NamespaceDeletionContentFailure:   "False ContentDeleted: All content successfully deleted, may be waiting on finalization",
		corev1.NamespaceContentRemaining:         "True SomeResourcesRemain: Some resources are remaining: pods. has 1 resource instances",
		corev1.NamespaceFinalizersRemaining:      "True SomeFinalizersRemain: Some content in the namespace has finalizers remaining: e2e.example.com/finalizer in 1 resource instances",
	}
	proctest.WaitFor(t, "the deletion conditions", 20*time.Second, func() error {
		n, err := c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var wrong []string
		for typ, w := range want {
			if got := condition(n, typ); got != w {
				wrong = append(wrong, fmt.Sprintf("%s is %q, want %q", typ, got, w))
			}
		}
		if n.Status.Phase != corev1.NamespaceTerminating || len(wrong) > 0 {
			return fmt.Errorf("phase %s; %s", n.Status.Phase, strings.Join(wrong, "; "))
		}
		return nil
	})
	// An update of a terminating namespace leaves it terminating: only its last finalizer removes it.
	if _, err := c.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(`{"metadata":{"labels":{"touched":"yes"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("labelling the terminating namespace: %v", err)
	}
	if _, err := c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
		t.Fatalf("the namespace after an update: %v", err)
	}
	// The pod is being deleted; the ConfigMap waits for it.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, "held", metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp == nil {
			t.Fatalf("the pod: %v, deletionTimestamp %v", err, p.DeletionTimestamp)
		}
		if _, err := c.CoreV1().ConfigMaps(ns).Get(ctx, "cm", metav1.GetOptions{}); err != nil {
			t.Fatalf("the ConfigMap went before the pod: %v", err)
		}
	}

	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := c.CoreV1().Pods(ns).Get(ctx, "held", metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Finalizers = nil
		_, err = c.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "the namespace removed", 30*time.Second, func() error {
		_, err := c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %v", err)
	})
}
