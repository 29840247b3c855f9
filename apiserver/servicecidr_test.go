package apiserver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/apiserver"
	"github.com/skiff-dev/skiff/internal/proctest"
)

// TestServiceCIDRs: the default ServiceCIDR "kubernetes" holds the servers' service range and is Ready, is
// created again when deleted, and a ServiceCIDR of another name is refused, naming the field.
func TestServiceCIDRs(t *testing.T) {
	t.Parallel()
	cs := kubernetes.NewForConfigOrDie(apiserver.StartTestAPI(t, apiserver.TestAPIOptions{}))
	ctx := context.Background()
	cidrs := cs.NetworkingV1().ServiceCIDRs()

	ready := func() error {
		def, err := cidrs.Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(def.Spec.CIDRs) != 1 || def.Spec.CIDRs[0] != apiserver.DefaultServiceCIDR {
			return fmt.Errorf("CIDRs %v; want [%s]", def.Spec.CIDRs, apiserver.DefaultServiceCIDR)
		}
		if !apimeta.IsStatusConditionTrue(def.Status.Conditions, networkingv1.ServiceCIDRConditionReady) {
			return fmt.Errorf("conditions %+v; want Ready", def.Status.Conditions)
		}
		return nil
	}
	proctest.WaitFor(t, "the default ServiceCIDR", 30*time.Second, ready)
	if err := cidrs.Delete(ctx, "kubernetes", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "the default ServiceCIDR created again", 30*time.Second, ready)
	if cols, rows := tableColumns(t, cs.NetworkingV1().RESTClient(), "servicecidrs"); cols != "Name,CIDRs,Age" || rows != 1 {
		t.Errorf("servicecidrs table: %s, %d rows", cols, rows)
	}

	_, err := cidrs.Create(ctx, &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "more"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"203.0.113.0/24"}}}, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Fatalf("a second ServiceCIDR: %v; want 422", err)
	}
	if causes := err.(apierrors.APIStatus).Status().Details.Causes; len(causes) != 1 || causes[0].Field != "metadata.name" {
		t.Errorf("causes %+v; want metadata.name", causes)
	}
	_, err = cidrs.Create(ctx, &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"not-a-cidr"}}}, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Fatalf("an invalid CIDR: %v; want 422", err)
	}
}

// TestIPAddresses: IPAddresses are named by an IP address in canonical form (IPv6 too), as kube-apiserver
// validates them.
func TestIPAddresses(t *testing.T) {
	t.Parallel()
	cs := kubernetes.NewForConfigOrDie(apiserver.StartTestAPI(t, apiserver.TestAPIOptions{}))
	ctx := context.Background()
	parent := &networkingv1.ParentReference{Group: "mygroup", Resource: "myresources", Namespace: "foo", Name: "bar"}
	for _, name := range []string{"255.255.255.255", "fe80::42:1dff:fe84:f9e2"} {
		if _, err := cs.NetworkingV1().IPAddresses().Create(ctx, &networkingv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: networkingv1.IPAddressSpec{ParentRef: parent}}, metav1.CreateOptions{}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, name := range []string{"fe80:0::1", "not-an-ip"} {
		_, err := cs.NetworkingV1().IPAddresses().Create(ctx, &networkingv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: networkingv1.IPAddressSpec{ParentRef: parent}}, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) {
			t.Errorf("%s: %v; want 422", name, err)
		}
	}
}

// TestServiceWithGeneratedName: a Service created with generateName gets its ClusterIP, whose IPAddress names
// the Service by its generated name (kube's IPAddress validation requires the parent's name).
func TestServiceWithGeneratedName(t *testing.T) {
	t.Parallel()
	cfg := apiserver.SharedTestAPI(t)
	ns := apiserver.NamespaceOn(t, cfg, "svcname")
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{GenerateName: "proxy-service-"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a Service with generateName: %v", err)
	}
	ip, err := cs.NetworkingV1().IPAddresses().Get(ctx, svc.Spec.ClusterIP, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ref := ip.Spec.ParentRef; ref == nil || ref.Name != svc.Name || ref.Resource != "services" {
		t.Errorf("the IPAddress's parent %+v; want the Service %s", ref, svc.Name)
	}
}
