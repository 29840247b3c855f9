package netpol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/internal/netnstest"
)

// node is a throwaway "node" network namespace that routes between "pod" namespaces, each on a veth pair
// with its own /24, and an Engine whose iptables and ipset run inside the node namespace.
type node struct {
	name   string
	ns     *netnstest.Netns
	engine *Engine
	pods   map[string]*testPod
}

type testPod struct {
	netns, ip string
	pod       *corev1.Pod
}

func newNode(t *testing.T) *node {
	t.Helper()
	ns := netnstest.New(t, "skiffnp", "iptables", "iptables-save", "iptables-restore", "ipset")
	n := &node{name: ns.Name, ns: ns, pods: map[string]*testPod{}}
	ns.Exec(t, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	e, err := New(Config{ID: "0000abcd", Owner: "skiff:0000abcd:/nonexistent", Local: func(node string) bool { return node == "n1" },
		Commands: Commands{IPTables: ns.Wrap(t, "iptables"), IPTablesSave: ns.Wrap(t, "iptables-save"),
			IPTablesRestore: ns.Wrap(t, "iptables-restore"), IPSet: ns.Wrap(t, "ipset")}})
	if err != nil {
		t.Fatal(err)
	}
	e.policies = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	e.pods = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	e.namespaces = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	n.engine = e
	return n
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	return netnstest.Run(t, name, args...)
}

func (n *node) exec(t *testing.T, args ...string) string {
	t.Helper()
	return n.ns.Exec(t, args...)
}

// addPod wires a pod namespace (10.77.<i>.2, its gateway 10.77.<i>.1 in the node) and adds the Pod, on
// node n1 unless nodeName says otherwise, to the engine's view. Each pod serves TCP on 80 and 8080.
func (n *node) addPod(t *testing.T, i int, namespace, name string, lbls map[string]string, ports ...corev1.ContainerPort) *testPod {
	t.Helper()
	p := &testPod{netns: fmt.Sprintf("%s-%d", n.name, i), ip: fmt.Sprintf("10.77.%d.2", i)}
	run(t, "ip", "netns", "add", p.netns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", p.netns).Run() })
	host := fmt.Sprintf("np%08x%d", rand.Uint32(), i)
	run(t, "ip", "link", "add", host, "netns", n.name, "type", "veth", "peer", "name", "eth0", "netns", p.netns)
	n.exec(t, "ip", "addr", "add", fmt.Sprintf("10.77.%d.1/24", i), "dev", host)
	n.exec(t, "ip", "link", "set", host, "up")
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", p.ip + "/24", "dev", "eth0"},
		{"link", "set", "eth0", "up"}, {"route", "add", "default", "via", fmt.Sprintf("10.77.%d.1", i)}} {
		run(t, "ip", append([]string{"netns", "exec", p.netns, "ip"}, args...)...)
	}
	p.pod = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(name + "-uid"), Labels: lbls},
		Spec:   corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Ports: ports}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: p.ip, PodIPs: []corev1.PodIP{{IP: p.ip}}}}
	if err := n.engine.pods.Add(p.pod); err != nil {
		t.Fatal(err)
	}
	for _, port := range []int{80, 8080} {
		var l net.Listener
		inNetns(t, p.netns, func() (err error) {
			l, err = net.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
			return err
		})
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				io.WriteString(c, name)
				c.Close()
			}
		}()
	}
	n.pods[name] = p
	return p
}

// inNetns runs f on a thread inside a namespace: sockets it opens belong there. The thread is never given
// back to the scheduler (it stays locked and ends with the goroutine).
func inNetns(t *testing.T, netns string, f func() error) {
	t.Helper()
	errs := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open("/run/netns/"+netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Setns(fd, unix.CLONE_NEWNET)
			unix.Close(fd)
		}
		if err == nil {
			err = f()
		}
		errs <- err
	}()
	if err := <-errs; err != nil {
		t.Fatalf("in netns %s: %v", netns, err)
	}
}

// reach tells whether from connects to to's port and reads its name: "ok", "refused" (rejected by a rule) or
// another error.
func (n *node) reach(t *testing.T, from, to string, port int) string {
	t.Helper()
	var got string
	inNetns(t, n.pods[from].netns, func() error {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("%s:%d", n.pods[to].ip, port), 2*time.Second)
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			got = "refused"
		case err != nil:
			got = err.Error()
		default:
			b, _ := io.ReadAll(c)
			c.Close()
			got = "ok"
			if string(b) != to {
				got = "answered by " + string(b)
			}
		}
		return nil
	})
	return got
}

func (n *node) sync(t *testing.T) {
	t.Helper()
	if err := n.engine.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func namespace(name string, lbls map[string]string) *corev1.Namespace {
	l := map[string]string{"kubernetes.io/metadata.name": name}
	for k, v := range lbls {
		l[k] = v
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
}

func tcp(port intstr.IntOrString, end ...int32) networkingv1.NetworkPolicyPort {
	proto := corev1.ProtocolTCP
	p := networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &port}
	if len(end) > 0 {
		p.EndPort = &end[0]
	}
	return p
}

// TestPoliciesInTheKernel programs policies into a namespace with real iptables and ipset and checks, by
// connecting between pod namespaces, what each lets through.
func TestPoliciesInTheKernel(t *testing.T) {
	n := newNode(t)
	for _, ns := range []*corev1.Namespace{namespace("front", map[string]string{"team": "web"}), namespace("prod", nil), namespace("other", nil)} {
		n.engine.namespaces.Add(ns)
	}
	n.addPod(t, 1, "front", "client", map[string]string{"app": "client"})
	n.addPod(t, 2, "prod", "server", map[string]string{"app": "server"}, corev1.ContainerPort{Name: "http", ContainerPort: 8080})
	n.addPod(t, 3, "other", "stranger", map[string]string{"app": "stranger"})
	n.sync(t)
	check := func(step string, want map[string]string) {
		t.Helper()
		for k, w := range want {
			var from, to string
			var port int
			fmt.Sscanf(strings.NewReplacer("->", " ", ":", " ").Replace(k), "%s %s %d", &from, &to, &port)
			if got := n.reach(t, from, to, port); got != w {
				t.Errorf("%s: %s: %s, want %s", step, k, got, w)
			}
		}
	}
	check("no policy", map[string]string{"client->server:80": "ok", "stranger->server:8080": "ok", "server->client:80": "ok"})

	deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	n.engine.policies.Add(deny)
	n.sync(t)
	check("default deny ingress", map[string]string{"client->server:80": "refused", "stranger->server:8080": "refused",
		"server->client:80": "ok", "client->stranger:80": "ok"})

	allow := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "allow-web"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "web"}}}},
				Ports: []networkingv1.NetworkPolicyPort{tcp(intstr.FromString("http"))},
			}}}}
	n.engine.policies.Add(allow)
	n.sync(t)
	check("allow by namespace and named port", map[string]string{"client->server:8080": "ok", "client->server:80": "refused",
		"stranger->server:8080": "refused"})

	// A connection made while allowed stays up when a policy then denies it (conntrack), and new ones fail.
	var kept net.Conn
	inNetns(t, n.pods["client"].netns, func() (err error) {
		kept, err = net.DialTimeout("tcp", n.pods["server"].ip+":8080", 2*time.Second)
		return err
	})
	defer kept.Close()
	n.engine.policies.Delete(allow)
	n.sync(t)
	if b, err := io.ReadAll(kept); err != nil || string(b) != "server" {
		t.Errorf("an established connection after the allow rule went: %q %v", b, err)
	}
	check("allow rule removed", map[string]string{"client->server:8080": "refused"})

	// Egress: an ipBlock with an except, and a port range.
	egress := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "front", Name: "egress"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.77.0.0/16", Except: []string{"10.77.2.0/24"}}}},
				Ports: []networkingv1.NetworkPolicyPort{tcp(intstr.FromInt32(70), 85)},
			}}}}
	n.engine.policies.Delete(deny)
	n.engine.policies.Add(egress)
	n.sync(t)
	check("egress to a block with an except", map[string]string{"client->stranger:80": "ok", "client->stranger:8080": "refused",
		"client->server:80": "refused", "stranger->client:80": "ok"})

	// Egress by pod selector across namespaces and a named port, resolved on the destination.
	egress.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
		To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{},
			PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}}}},
		Ports: []networkingv1.NetworkPolicyPort{tcp(intstr.FromString("http"))},
	}}
	n.engine.policies.Update(egress)
	n.sync(t)
	check("egress to a named port", map[string]string{"client->server:8080": "ok", "client->server:80": "refused",
		"client->stranger:8080": "refused"})

	// Nothing else the engine left in the namespace but its own chains and sets.
	if out := n.exec(t, "iptables-save", "-t", "filter"); !strings.Contains(out, "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"skiff:0000abcd:/nonexistent\" -j SKIFF-NP-0000abcd-FWD") {
		t.Errorf("no FORWARD jump:\n%s", out)
	}
	n.engine.policies.Delete(egress)
	n.sync(t)
	if sets := strings.Fields(n.exec(t, "ipset", "list", "-n")); len(sets) != 0 {
		t.Errorf("sets left with no policy: %v", sets)
	}
	if out := n.exec(t, "iptables-save", "-t", "filter"); strings.Contains(out, "SKIFF") {
		t.Errorf("rules left with no policy:\n%s", out)
	}
	check("all policies gone", map[string]string{"client->server:80": "ok", "client->stranger:8080": "ok"})
}

// TestWiredWaitsForTheChain: a pod a policy isolates, wired before its status carries its address, is
// isolated when Wired returns (its ingress chain is in force); a pod no policy selects does not wait for it.
func TestWiredWaitsForTheChain(t *testing.T) {
	n := newNode(t)
	n.engine.namespaces.Add(namespace("prod", nil))
	n.engine.policies.Add(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go n.engine.loop(ctx)
	newPod := func(name, app string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: name, UID: types.UID(name), Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodPending}}
		n.engine.pods.Add(p) // the informer has the pod, not yet its address
		return p
	}
	db := newPod("db", "db")
	if err := n.engine.Wired(ctx, db, "10.77.9.2", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if out := n.exec(t, "iptables-save", "-t", "filter"); !strings.Contains(out, "-d 10.77.9.2/32 -j SKIFF-NP-0000abcd-I") {
		t.Errorf("Wired returned before the pod's chain was in force:\n%s", out)
	}
	web := newPod("web", "web")
	start := time.Now()
	if err := n.engine.Wired(ctx, web, "10.77.9.3", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if out := n.exec(t, "iptables-save", "-t", "filter"); strings.Contains(out, "10.77.9.3") {
		t.Errorf("a pod no policy selects got rules:\n%s", out)
	}
	t.Logf("an isolated pod's Wired, then a free one's in %s", time.Since(start))
}
