package controller_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/internal/servertest"
)

func waitForDefaultAccount(t *testing.T, c kubernetes.Interface, ns string) *corev1.ServiceAccount {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		sa, err := c.CoreV1().ServiceAccounts(ns).Get(context.Background(), "default", metav1.GetOptions{})
		if err == nil {
			return sa
		}
		if time.Now().After(deadline) {
			t.Fatalf("no default service account in %s: %v", ns, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDefaultServiceAccount: every namespace, the system ones and new ones, gets a "default"
// ServiceAccount, and gets it back after it is deleted.
func TestDefaultServiceAccount(t *testing.T) {
	t.Parallel()
	c := servertest.Shared(t).Client
	ctx := context.Background()
	for _, ns := range []string{"default", "kube-system"} {
		waitForDefaultAccount(t, c, ns)
	}
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "sa-team"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := waitForDefaultAccount(t, c, "sa-team")
	if err := c.CoreV1().ServiceAccounts("sa-team").Delete(ctx, "default", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		sa, err := c.CoreV1().ServiceAccounts("sa-team").Get(ctx, "default", metav1.GetOptions{})
		if err == nil && sa.UID != first.UID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the deleted default service account was not recreated")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
