package apiserver_test

import (
	"context"
	"k8s.io/client-go/util/retry"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestNodePortClaimsFollowUpdates checks that NodePorts are claimed and released by updates as well as by
// creates and deletes: an update that takes a held port is refused, one that switches a Service to NodePort
// claims a port no other Service can then take, a changed nodePort frees the old one, and leaving NodePort
// frees them all.
func TestNodePortClaimsFollowUpdates(t *testing.T) {
	t.Parallel()
	peer := servertest.Shared(t)
	ns := servertest.Namespace(t, peer, "nodeports")
	ctx := context.Background()
	services := peer.Client.CoreV1().Services(ns)
	create := func(name string, typ corev1.ServiceType, nodePort int32) (*corev1.Service, error) {
		return services.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{
			Type: typ, Ports: []corev1.ServicePort{{Port: 80, NodePort: nodePort}},
		}}, metav1.CreateOptions{})
	}
	patch := func(name, body string) (*corev1.Service, error) {
		return services.Patch(ctx, name, types.MergePatchType, []byte(body), metav1.PatchOptions{})
	}
	if _, err := create("a", corev1.ServiceTypeNodePort, 30100); err != nil {
		t.Fatal(err)
	}
	if _, err := create("b", corev1.ServiceTypeClusterIP, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := patch("b", `{"spec":{"type":"NodePort","ports":[{"port":80,"nodePort":30100}]}}`); !apierrors.IsInvalid(err) {
		t.Fatalf("an update taking a's port: %v, want 422", err)
	}
	b, err := patch("b", `{"spec":{"type":"NodePort"}}`)
	if err != nil {
		t.Fatal(err)
	}
	bPort := b.Spec.Ports[0].NodePort
	if bPort == 0 || bPort == 30100 {
		t.Fatalf("b switched to NodePort got port %d", bPort)
	}
	if _, err := create("c", corev1.ServiceTypeNodePort, bPort); !apierrors.IsInvalid(err) {
		t.Fatalf("a create taking the port b's update claimed: %v, want 422", err)
	}
	if _, err := patch("a", `{"spec":{"ports":[{"port":80,"nodePort":30101}]}}`); err != nil {
		t.Fatal(err)
	}
	if _, err := create("c", corev1.ServiceTypeNodePort, 30100); err != nil {
		t.Fatalf("the port a's update gave up: %v", err)
	}
	b, err = patch("b", `{"spec":{"type":"ClusterIP"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if b.Spec.Ports[0].NodePort != 0 {
		t.Fatalf("b left NodePort but kept port %d", b.Spec.Ports[0].NodePort)
	}
	if _, err := create("d", corev1.ServiceTypeNodePort, bPort); err != nil {
		t.Fatalf("the port b gave up by leaving NodePort: %v", err)
	}
	if err := services.Delete(ctx, "d", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := create("e", corev1.ServiceTypeNodePort, bPort); err != nil {
		t.Fatalf("the port of a deleted Service: %v", err)
	}
}

// TestExternalNameTypeChanges: a Service that becomes an ExternalName one gives up its cluster IP (and its
// NodePorts), which another Service can then take, and one that stops being one gets a cluster IP, as
// kube-apiserver does; updates are made as the conformance suite's jig makes them, a read and a full update.
func TestExternalNameTypeChanges(t *testing.T) {
	t.Parallel()
	shared := servertest.Shared(t)
	c := shared.Client
	ns := servertest.Namespace(t, shared, "externalname")
	ctx := context.Background()
	services := c.CoreV1().Services(ns)
	update := func(name string, change func(*corev1.Service)) (*corev1.Service, error) {
		svc, err := services.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(svc)
		return services.Update(ctx, svc, metav1.UpdateOptions{})
	}
	toExternalName := func(s *corev1.Service) {
		s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "foo.example.com"
	}
	ipHeldBy := func(ip string) string {
		a, err := c.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return ""
		} else if err != nil {
			t.Fatal(err)
		}
		return a.Spec.ParentRef.Name
	}
	for _, typ := range []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort} {
		name := strings.ToLower(string(typ))
		svc, err := services.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{
			Type: typ, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ip, nodePort := svc.Spec.ClusterIP, svc.Spec.Ports[0].NodePort
		if ipHeldBy(ip) != name {
			t.Fatalf("%s: IPAddress %s held by %q", name, ip, ipHeldBy(ip))
		}
		svc, err = update(name, toExternalName)
		if err != nil {
			t.Fatalf("%s to ExternalName: %v", name, err)
		}
		if svc.Spec.ClusterIP != "" || svc.Spec.ClusterIPs != nil || svc.Spec.IPFamilyPolicy != nil || svc.Spec.Ports[0].NodePort != 0 {
			t.Fatalf("%s as ExternalName kept clusterIP %q %v, policy %v, nodePort %d", name, svc.Spec.ClusterIP, svc.Spec.ClusterIPs, svc.Spec.IPFamilyPolicy, svc.Spec.Ports[0].NodePort)
		}
		if holder := ipHeldBy(ip); holder != "" {
			t.Fatalf("%s's IP %s still held by %q", name, ip, holder)
		}
		// What it gave up, another Service can take.
		taker := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "taker"}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, ClusterIP: ip, Ports: []corev1.ServicePort{{Port: 80, NodePort: nodePort}}}}
		if typ == corev1.ServiceTypeClusterIP {
			taker.Spec.Type, taker.Spec.Ports[0].NodePort = corev1.ServiceTypeClusterIP, 0
		}
		if _, err := services.Create(ctx, taker, metav1.CreateOptions{}); err != nil {
			t.Fatalf("taking what %s gave up: %v", name, err)
		}
		// Back, asking for the IP the taker holds: refused; then any IP.
		if _, err := update(name, func(s *corev1.Service) { s.Spec.Type, s.Spec.ExternalName, s.Spec.ClusterIP = typ, "", ip }); !apierrors.IsInvalid(err) ||
			!strings.Contains(err.Error(), "provided IP is already allocated") {
			t.Fatalf("%s back to %s with a held IP: %v", name, typ, err)
		}
		svc, err = update(name, func(s *corev1.Service) { s.Spec.Type, s.Spec.ExternalName = typ, "" })
		if err != nil {
			t.Fatalf("%s back to %s: %v", name, typ, err)
		}
		if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == ip || len(svc.Spec.ClusterIPs) != 1 || ipHeldBy(svc.Spec.ClusterIP) != name ||
			(typ == corev1.ServiceTypeNodePort) != (svc.Spec.Ports[0].NodePort != 0) {
			t.Fatalf("%s back to %s: clusterIP %q %v (held by %q), nodePort %d", name, typ, svc.Spec.ClusterIP, svc.Spec.ClusterIPs, ipHeldBy(svc.Spec.ClusterIP), svc.Spec.Ports[0].NodePort)
		}
		if err := services.Delete(ctx, "taker", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLoadBalancerServiceFields: a LoadBalancer Service gets allocateLoadBalancerNodePorts true by default and
// NodePorts with it; with false, only the ports given one have one, and an update adding a port allocates
// none; externalIPs are kept; loadBalancerClass may not change while the Service is a LoadBalancer.
func TestLoadBalancerServiceFields(t *testing.T) {
	t.Parallel()
	peer := servertest.Shared(t)
	ns := servertest.Namespace(t, peer, "loadbalancers")
	ctx := context.Background()
	services := peer.Client.CoreV1().Services(ns)
	lb := func(name string, allocate *bool, class *string, ports ...corev1.ServicePort) (*corev1.Service, error) {
		return services.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, AllocateLoadBalancerNodePorts: allocate, LoadBalancerClass: class,
			ExternalIPs: []string{"192.0.2.10"}, Ports: ports,
		}}, metav1.CreateOptions{})
	}
	plain, err := lb("plain", nil, nil, corev1.ServicePort{Port: 80})
	if err != nil {
		t.Fatal(err)
	}
	if a := plain.Spec.AllocateLoadBalancerNodePorts; a == nil || !*a || plain.Spec.Ports[0].NodePort == 0 {
		t.Fatalf("default: allocateLoadBalancerNodePorts %v, nodePort %d; want true and a port", a, plain.Spec.Ports[0].NodePort)
	}
	if len(plain.Spec.ExternalIPs) != 1 || plain.Spec.ExternalIPs[0] != "192.0.2.10" {
		t.Fatalf("externalIPs %v", plain.Spec.ExternalIPs)
	}
	no := false
	bare, err := lb("bare", &no, nil, corev1.ServicePort{Name: "a", Port: 80}, corev1.ServicePort{Name: "b", Port: 81, NodePort: 30181})
	if err != nil {
		t.Fatal(err)
	}
	if bare.Spec.Ports[0].NodePort != 0 || bare.Spec.Ports[1].NodePort != 30181 {
		t.Fatalf("allocateLoadBalancerNodePorts false: nodePorts %d and %d, want 0 and 30181", bare.Spec.Ports[0].NodePort, bare.Spec.Ports[1].NodePort)
	}
	// The load balancer controller may write the Service's status meanwhile: update the latest version.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		latest, err := services.Get(ctx, "bare", metav1.GetOptions{})
		if err != nil {
			return err
		}
		latest.Spec.Ports = append(latest.Spec.Ports, corev1.ServicePort{Name: "c", Port: 82, Protocol: corev1.ProtocolTCP})
		bare, err = services.Update(ctx, latest, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if bare.Spec.Ports[2].NodePort != 0 || bare.Spec.Ports[1].NodePort != 30181 {
		t.Fatalf("after adding a port: nodePorts %d and %d, want 30181 kept and none", bare.Spec.Ports[1].NodePort, bare.Spec.Ports[2].NodePort)
	}
	class := "example.com/lb"
	classed, err := lb("classed", nil, &class, corev1.ServicePort{Port: 80})
	if err != nil {
		t.Fatal(err)
	}
	other := "example.com/other"
	classed.Spec.LoadBalancerClass = &other
	if _, err := services.Update(ctx, classed, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.loadBalancerClass") {
		t.Fatalf("changing loadBalancerClass: %v, want 422 on spec.loadBalancerClass", err)
	}
}

// TestHealthCheckNodePort: a LoadBalancer Service with externalTrafficPolicy Local gets a health check node
// port from the NodePort range, held as NodePorts are (another Service cannot ask for it), kept across
// updates and immutable while needed, released when the policy turns Cluster or the Service goes; a port given
// on create is honoured, and one set on a Service that needs none is refused, as by kube-apiserver.
func TestHealthCheckNodePort(t *testing.T) {
	t.Parallel()
	peer := servertest.Shared(t)
	ns := servertest.Namespace(t, peer, "healthchecks")
	ctx := context.Background()
	services := peer.Client.CoreV1().Services(ns)
	class := "example.com/elsewhere" // left to another controller: the shared server's pools stay free
	local := func(name string, hc int32) (*corev1.Service, error) {
		return services.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			HealthCheckNodePort: hc, Ports: []corev1.ServicePort{{Port: 80}},
		}}, metav1.CreateOptions{})
	}
	svc, err := local("auto", 0)
	if err != nil {
		t.Fatal(err)
	}
	hc := svc.Spec.HealthCheckNodePort
	if hc < 30000 || hc > 32767 || hc == svc.Spec.Ports[0].NodePort {
		t.Fatalf("healthCheckNodePort %d (nodePort %d); want its own port in 30000-32767", hc, svc.Spec.Ports[0].NodePort)
	}
	if _, err := local("taken", hc); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.healthCheckNodePort") ||
		!strings.Contains(err.Error(), "already allocated") {
		t.Errorf("a Service asking for a held health check port: %v; want 422 on spec.healthCheckNodePort", err)
	}
	if _, err := services.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "cluster"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeNodePort, HealthCheckNodePort: 31999, Ports: []corev1.ServicePort{{Port: 80}},
	}}, metav1.CreateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.healthCheckNodePort") {
		t.Errorf("a NodePort Service with a health check port: %v; want 422 on spec.healthCheckNodePort", err)
	}
	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "b", Port: 81, Protocol: corev1.ProtocolTCP})
	svc.Spec.Ports[0].Name = "a"
	if svc, err = services.Update(ctx, svc, metav1.UpdateOptions{}); err != nil || svc.Spec.HealthCheckNodePort != hc {
		t.Fatalf("an update: %v, healthCheckNodePort %d; want %d kept", err, svc.Spec.HealthCheckNodePort, hc)
	}
	changed := svc.DeepCopy()
	changed.Spec.HealthCheckNodePort = hc + 1
	if _, err := services.Update(ctx, changed, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "immutable") {
		t.Errorf("changing the health check port: %v; want 422, immutable", err)
	}
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	if svc, err = services.Update(ctx, svc, metav1.UpdateOptions{}); err != nil || svc.Spec.HealthCheckNodePort != 0 {
		t.Fatalf("turning Cluster: %v, healthCheckNodePort %d; want none", err, svc.Spec.HealthCheckNodePort)
	}
	again, err := local("again", hc) // released: free to ask for
	if err != nil {
		t.Fatalf("asking for the released port: %v", err)
	}
	if err := services.Delete(ctx, again.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := local("after-delete", hc); err != nil {
		t.Errorf("asking for the port of a deleted Service: %v", err)
	}
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	if svc, err = services.Update(ctx, svc, metav1.UpdateOptions{}); err != nil || svc.Spec.HealthCheckNodePort == 0 || svc.Spec.HealthCheckNodePort == hc {
		t.Fatalf("turning Local again: %v, healthCheckNodePort %d; want a new one", err, svc.Spec.HealthCheckNodePort)
	}
}
