package controller_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// waitForRootCA waits until ns holds kube-root-ca.crt with the CA, other than the one with UID not.
func waitForRootCA(t *testing.T, c kubernetes.Interface, ns, ca, not string) *corev1.ConfigMap {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		cm, err := c.CoreV1().ConfigMaps(ns).Get(context.Background(), "kube-root-ca.crt", metav1.GetOptions{})
		if err == nil && cm.Data["ca.crt"] != ca {
			err = fmt.Errorf("ca.crt is %q", cm.Data["ca.crt"])
		} else if err == nil && string(cm.UID) == not {
			err = fmt.Errorf("still the deleted one")
		}
		if err == nil {
			return cm
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-root-ca.crt in %s: %v", ns, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRootCACertPublisher: every namespace, the system ones and new ones, holds kube-root-ca.crt with the
// cluster CA that the API's serving certificate chains to, and gets it back after it is deleted or changed.
func TestRootCACertPublisher(t *testing.T) {
	t.Parallel()
	p := servertest.Shared(t)
	c, ca := p.Client, string(p.Config.CAData)
	if ca == "" {
		t.Fatal("the admin config has no CA")
	}
	ctx := context.Background()
	for _, ns := range []string{"default", "kube-system"} {
		waitForRootCA(t, c, ns, ca, "")
	}
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ca-team"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := waitForRootCA(t, c, "ca-team", ca, "")
	if first.Annotations["kubernetes.io/description"] == "" {
		t.Errorf("no description annotation: %v", first.Annotations)
	}
	if err := c.CoreV1().ConfigMaps("ca-team").Delete(ctx, "kube-root-ca.crt", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	second := waitForRootCA(t, c, "ca-team", ca, string(first.UID))
	second.Data["ca.crt"] = "tampered"
	if _, err := c.CoreV1().ConfigMaps("ca-team").Update(ctx, second, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForRootCA(t, c, "ca-team", ca, "")
}
