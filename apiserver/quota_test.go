package apiserver_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestResourceQuotaAcrossServers: 50 concurrent pod creates against `pods: 10`, spread over three servers,
// admit exactly 10 (the library's quota admission charges status.used with a compare-and-swap on the Raft
// store); the others get Kubernetes' 403; the quota controller keeps status.used, and gives back what
// deleted pods held; an object count quota (count/roles.rbac.authorization.k8s.io) and a requests quota hold too.
func TestResourceQuotaAcrossServers(t *testing.T) {
	t.Parallel()
	peers := servertest.Start(t, 3)
	ctx := context.Background()
	c := peers[0].Client
	q := resource.MustParse
	term := func() (highest uint64) {
		for _, p := range peers {
			highest = max(highest, p.Server.Node().Stats()["term"])
		}
		return highest
	}
	// Leadership must have settled first. A new leader starts the quota controller, whose first full
	// recount races with a burst of admissions (Kubernetes' controller does too): it counts the pods its
	// informer holds, which lag the charges admission made, and writes the lower figure, so the next create
	// is admitted over the quota. A run saw 11 of 50 admitted after a step-down right after bootstrap.
	proctest.WaitFor(t, "a settled leader", 30*time.Second, func() error {
		before := term()
		time.Sleep(2 * time.Second)
		if after := term(); after != before {
			return fmt.Errorf("Raft term %d then %d", before, after)
		}
		return nil
	})
	if _, err := c.CoreV1().ResourceQuotas("default").Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "q"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: q("10"), "count/roles.rbac.authorization.k8s.io": q("3"),
			corev1.ResourceRequestsCPU: q("20")}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The quota controller fills in status.hard and used; admission waits for it (and for each server's
	// informer) before it charges anything.
	proctest.WaitFor(t, "the quota's status", 20*time.Second, func() error {
		for _, p := range peers {
			rq, err := p.Client.CoreV1().ResourceQuotas("default").Get(ctx, "q", metav1.GetOptions{})
			if err != nil || len(rq.Status.Hard) != 3 {
				return fmt.Errorf("status %v %v", rq.Status, err)
			}
		}
		return nil
	})
	pod := func(i int) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%02d", i)}, Spec: corev1.PodSpec{
			SchedulerName: "nobody", // left unscheduled: only admission is under test
			Containers: []corev1.Container{{Name: "c", Image: "busybox", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: q("100m")}}}}}}
	}
	// A leader change during the burst may charge the quota for a pod it then does not hold, with no error
	// the client sees: the admission's compare-and-swap of status.used can fail with an unknown outcome
	// and yet commit, and the library's evaluator then charges again on its retry.
	termBefore := term()
	var mu sync.Mutex
	admitted, refused := 0, 0
	var other []error
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := peers[i%3].Client.CoreV1().Pods("default").Create(ctx, pod(i), metav1.CreateOptions{})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted++
			case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota: q, requested: pods=1, used: pods=") &&
				strings.Contains(err.Error(), ", limited: pods=10"):
				refused++
			default:
				other = append(other, err)
			}
		}()
	}
	wg.Wait()
	// Never more than the quota. Exactly 10 when every request had a definite answer; when the leader
	// changed meanwhile (a create whose outcome is unknown, or a charge whose create then failed), the quota
	// may have been charged for pods that do not exist, until the controller gives it back (kubernetes#61530).
	stored := func() int {
		pods, err := c.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return len(pods.Items)
	}
	// More than the quota only when the leader changed during the burst: the new leader's quota controller
	// recounts from an informer that lags the charges admission made, as Kubernetes' own does (the race the
	// settled-leader wait above avoids at the start). A loaded make test run saw 13 after a step-down mid-burst.
	if n := stored(); refused+admitted+len(other) != 50 || (n > 10 || admitted > 10) && term() == termBefore {
		t.Fatalf("%d pods stored, %d admitted, %d refused, other errors %v: more than the quota", n, admitted, refused, other)
	} else if n > 10 || admitted > 10 {
		t.Logf("%d pods stored, %d admitted after a leader change mid-burst (Raft term %d then %d): the surplus goes", n, admitted, termBefore, term())
		pods, err := c.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items[10:] {
			if err := c.CoreV1().Pods("default").Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, err := range other {
		if !apierrors.IsConflict(err) && !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "outcome is unknown") &&
			!apierrors.IsServiceUnavailable(err) && !apierrors.IsServerTimeout(err) && !apierrors.IsTimeout(err) {
			t.Errorf("unexpected error: %v", err)
		}
	}
	if termAfter := term(); len(other) == 0 && termAfter == termBefore && admitted != 10 {
		t.Fatalf("admitted %d of 50 without any failure or leader change, want exactly 10", admitted)
	} else if admitted != 10 {
		t.Logf("admitted %d of 50; %d failed; Raft term %d then %d", admitted, len(other), termBefore, termAfter)
	}
	// Whatever failed creates charged comes back: creates succeed until exactly 10 pods exist, no more.
	next := 50
	proctest.WaitFor(t, "exactly 10 pods admitted in all", 60*time.Second, func() error {
		if n := stored(); n > 10 {
			t.Fatalf("%d pods stored against pods: 10", n)
		} else if n == 10 {
			return nil
		}
		next++
		_, err := c.CoreV1().Pods("default").Create(ctx, pod(next), metav1.CreateOptions{})
		return fmt.Errorf("fewer than 10 pods; a create: %v", err)
	})
	if _, err := c.CoreV1().Pods("default").Create(ctx, pod(98), metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "exceeded quota: q") {
		t.Fatalf("an eleventh pod: %v, want refused by the quota", err)
	}
	pods, err := c.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Object counts: the fourth Role is refused.
	for i := 0; i < 4; i++ {
		_, err := c.RbacV1().Roles("default").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("role-%d", i)}}, metav1.CreateOptions{})
		if i < 3 && err != nil || i == 3 && (!apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "count/roles.rbac.authorization.k8s.io")) {
			t.Fatalf("role %d: %v", i, err)
		}
	}
	// Deleting pods gives their share back, through the controller.
	for i := range pods.Items[:4] {
		if err := c.CoreV1().Pods("default").Delete(ctx, pods.Items[i].Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
	}
	proctest.WaitFor(t, "status.used after deletions", 30*time.Second, func() error {
		rq, err := c.CoreV1().ResourceQuotas("default").Get(ctx, "q", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if used := rq.Status.Used; used.Pods().String() != "6" || used.Name(corev1.ResourceRequestsCPU, resource.DecimalSI).String() != "600m" ||
			used.Name("count/roles.rbac.authorization.k8s.io", resource.DecimalSI).String() != "3" {
			return fmt.Errorf("used %v", used)
		}
		return nil
	})
	if _, err := c.CoreV1().Pods("default").Create(ctx, pod(99), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a pod after the deletions: %v", err)
	}
}
