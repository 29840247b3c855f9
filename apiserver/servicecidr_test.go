package apiserver_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/apiserver"
	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestServiceCIDRs: the default ServiceCIDR "kubernetes" holds the servers' service range and is Ready, is
// created again when deleted; another ServiceCIDR's addresses are given to Services once it is Ready, and a
// malformed one is refused.
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

	// Another ServiceCIDR is stored; its addresses are handed out once it is Ready (the servicecidrs
	// controller's part, which this API server alone does not run: the test marks it).
	more, err := cidrs.Create(ctx, &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "more"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"203.0.113.0/24"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	asking := func(name, ip string) error {
		_, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{ClusterIP: ip, Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
		return err
	}
	if err := asking("early", "203.0.113.5"); !apierrors.IsInvalid(err) {
		t.Errorf("an address of a ServiceCIDR not Ready yet: %v; want 422", err)
	}
	more.Status.Conditions = []metav1.Condition{{Type: networkingv1.ServiceCIDRConditionReady, Status: metav1.ConditionTrue,
		Reason: "Test", LastTransitionTime: metav1.Now()}}
	if _, err := cidrs.UpdateStatus(ctx, more, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := asking("ready", "203.0.113.5"); err != nil {
		t.Errorf("an address of a Ready ServiceCIDR: %v", err)
	}
	if err := asking("outside", "198.51.100.5"); !apierrors.IsInvalid(err) {
		t.Errorf("an address in no ServiceCIDR: %v; want 422", err)
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

// TestServiceCIDRsExtendTheRange: on a server whose service_cidr is a /28, a ServiceCIDR added by a user is
// marked Ready by the servicecidrs controller and Services get its addresses once the first range is full;
// deleting it waits (its finalizer) while Services hold addresses only it covers, and it goes once they do.
func TestServiceCIDRsExtendTheRange(t *testing.T) {
	t.Parallel()
	small := "10.97.0.0/28"
	peers := servertest.StartWith(t, 1, func(f *config.ServerFile) { f.Server.ServiceCIDR = &small })
	cs := peers[0].Client
	ctx := context.Background()
	cidrs := cs.NetworkingV1().ServiceCIDRs()
	if _, err := cidrs.Create(ctx, &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "extra"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.98.0.0/28"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "the servicecidrs controller to mark extra Ready", 30*time.Second, func() error {
		c, err := cidrs.Get(ctx, "extra", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !apimeta.IsStatusConditionTrue(c.Status.Conditions, networkingv1.ServiceCIDRConditionReady) {
			return fmt.Errorf("conditions %+v", c.Status.Conditions)
		}
		return nil
	})
	_, first, _ := net.ParseCIDR(small)
	_, second, _ := net.ParseCIDR("10.98.0.0/28")
	var inSecond []string
	for i := range 16 { // the /28 has 13 addresses for Services, some held already (kubernetes, kube-dns)
		svc, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s%02d", i)},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("Service %d: %v", i, err)
		}
		ip := net.ParseIP(svc.Spec.ClusterIP)
		switch {
		case second.Contains(ip):
			inSecond = append(inSecond, svc.Name)
		case !first.Contains(ip):
			t.Fatalf("Service %d got %s, in neither range", i, ip)
		case len(inSecond) > 0:
			t.Errorf("Service %d got %s of the first range after others got the second's", i, ip)
		}
	}
	if len(inSecond) == 0 {
		t.Fatal("no Service got an address of the added range")
	}
	if err := cidrs.Delete(ctx, "extra", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if c, err := cidrs.Get(ctx, "extra", metav1.GetOptions{}); err != nil || c.DeletionTimestamp == nil {
		t.Fatalf("a ServiceCIDR whose addresses Services hold: %v %v; want it kept, being deleted", c, err)
	}
	for _, name := range inSecond {
		if err := cs.CoreV1().Services("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	proctest.WaitFor(t, "extra to go once its addresses are free", 60*time.Second, func() error {
		if _, err := cidrs.Get(ctx, "extra", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
}
