package dns

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	mdns "github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/skiff-dev/skiff/internal/freeport"
	"github.com/skiff-dev/skiff/internal/servertest"
)

const testNS = "dnstest"

// dnsCluster is an in-process Skiff server, the objects the tests resolve, and an embedded CoreDNS with the
// default Corefile reaching the API through a Forwarder, as an agent runs it.
type dnsCluster struct {
	addr  string // CoreDNS's UDP/TCP host:port
	webIP string // the ClusterIP of Service web
	dbIPs []string
}

// startDNSCluster starts it all; t.Cleanup stops everything, in reverse order, whether the test passed or not.
func startDNSCluster(t testing.TB) *dnsCluster {
	t.Helper()
	peer := servertest.Start(t, 1)[0]
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c := &dnsCluster{}
	client := peer.Client

	// The objects: a ClusterIP Service with a named port, a selectorless headless Service with a slice
	// written here (one endpoint with a hostname), and an ExternalName Service.
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	web, err := client.CoreV1().Services(testNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.webIP = web.Spec.ClusterIP
	if _, err := client.CoreV1().Services(testNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Name: "pg", Port: 5432, Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.dbIPs = []string{"10.244.1.5", "10.244.2.7"}
	ready, tcp, port, pg := true, corev1.ProtocolTCP, int32(5432), "pg"
	hostname := "db-0"
	if _, err := client.DiscoveryV1().EndpointSlices(testNS).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "db-1", Labels: map[string]string{discoveryv1.LabelServiceName: "db"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{c.dbIPs[0]}, Hostname: &hostname, Conditions: discoveryv1.EndpointConditions{Ready: &ready}},
			{Addresses: []string{c.dbIPs[1]}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}},
		},
		Ports: []discoveryv1.EndpointPort{{Name: &pg, Protocol: &tcp, Port: &port}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Services(testNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "ext"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "db.example.org"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The node's "upstream resolver": answers A for *.example.org., NXDOMAIN otherwise.
	upstreamPort := freeport.One(t, "127.0.0.1")
	upstream := &mdns.Server{Addr: fmt.Sprintf("127.0.0.1:%d", upstreamPort), Net: "udp", Handler: mdns.HandlerFunc(func(w mdns.ResponseWriter, r *mdns.Msg) {
		m := new(mdns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		if strings.HasSuffix(q.Name, "example.org.") && q.Qtype == mdns.TypeA {
			rr, _ := mdns.NewRR(q.Name + " 60 IN A 192.0.2.1")
			m.Answer = append(m.Answer, rr)
		} else {
			m.Rcode = mdns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})}
	started := make(chan struct{})
	upstream.NotifyStartedFunc = func() { close(started) }
	go func() { _ = upstream.ListenAndServe() }()
	<-started
	t.Cleanup(func() { _ = upstream.Shutdown() })

	// The agent's side: forwarder, kubeconfig, Corefile, CoreDNS.
	host, err := url.Parse(peer.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	fwd, err := NewForwarder(func() []string { return []string{host.Host} })
	if err != nil {
		t.Fatal(err)
	}
	fwdDone := make(chan struct{})
	go func() { fwd.Serve(ctx); close(fwdDone) }()
	t.Cleanup(func() { cancel(); <-fwdDone })
	kubeconfig := filepath.Join(t.TempDir(), "dns", "kubeconfig")
	// CoreDNS reads the API as the agent does: as its node, which the bootstrap RBAC policy lets read
	// Services, EndpointSlices and Namespaces.
	if err := WriteKubeconfig(kubeconfig, fwd.Addr(), peer.Config.CAData, Credentials{ClientCert: servertest.NodeClientCert(t, peer, "dns-node")}); err != nil {
		t.Fatal(err)
	}
	ports := freeport.Take(t, []string{"127.0.0.1"}, 3)
	corefile, err := Render(DefaultCorefile, Params{ClusterDomain: "cluster.local", Bind: "127.0.0.1", Port: ports[0],
		Kubeconfig: kubeconfig, HealthAddr: fmt.Sprintf("127.0.0.1:%d", ports[1]), MetricsAddr: fmt.Sprintf("127.0.0.1:%d", ports[2]),
		Upstream: upstream.Addr})
	if err != nil {
		t.Fatal(err)
	}
	startHelper(t, corefile)
	c.addr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	return c
}

// helperEnv names the Corefile a child test process serves (see TestMain).
const helperEnv = "SKIFF_DNS_TEST_COREFILE"

// TestMain runs CoreDNS for the tests when the environment asks for it. The tests run CoreDNS in a child
// process: its kubernetes plugin repoints klog, process-wide and without synchronization, which the race
// detector would report against the in-process server's klog calls.
func TestMain(m *testing.M) {
	RunChildIfAsked() // the node DNS process of TestNodeDNSProcessOutlivesItsStarter
	if path := os.Getenv(helperEnv); path != "" {
		os.Exit(serveCorefile(path))
	}
	os.Exit(m.Run())
}

// serveCorefile serves the Corefile at path, says "ready" on stdout, and stops when stdin closes.
func serveCorefile(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv, err := Start(string(data), hclog.New(&hclog.LoggerOptions{Name: "k8s", Level: hclog.Warn, Output: os.Stderr}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	if err := srv.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// startHelper runs CoreDNS with corefile in a child process until the test ends; the child also dies with
// the test process (its stdin closes, and the kernel kills it if the parent dies).
func startHelper(t testing.TB, corefile string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+path)
	cmd.Stderr = testWriter{t}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		stdin.Close()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("CoreDNS child: %v", err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("CoreDNS child did not stop within 10 s")
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	go func() { exited <- cmd.Wait() }()
	if err != nil || line != "ready\n" {
		t.Fatalf("CoreDNS child did not start (%q, %v):\n%s", line, err, corefile)
	}
}

// query asks CoreDNS over net ("udp" or "tcp") and returns the answer section's records as strings
// without TTLs, sorted, and the rcode.
func query(t testing.TB, addr, network, name string, qtype uint16) ([]string, int) {
	t.Helper()
	m := new(mdns.Msg)
	m.SetQuestion(mdns.Fqdn(name), qtype)
	cl := &mdns.Client{Net: network, Timeout: 2 * time.Second}
	r, _, err := cl.Exchange(m, addr)
	if err != nil {
		return []string{"error: " + err.Error()}, -1
	}
	var out []string
	for _, rr := range r.Answer {
		rr.Header().Ttl = 0
		out = append(out, strings.ReplaceAll(rr.String(), "\t", " "))
	}
	sort.Strings(out)
	return out, r.Rcode
}

// eventually polls a query until it answers want (the kubernetes plugin's informers may still be syncing).
func eventually(t *testing.T, addr, network, name string, qtype uint16, want ...string) {
	t.Helper()
	sort.Strings(want)
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, rcode := query(t, addr, network, name, qtype)
		if rcode == mdns.RcodeSuccess && slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s over %s: got %v (rcode %d), want %v", name, mdns.TypeToString[qtype], network, got, rcode, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestEmbeddedCoreDNSAnswersForTheCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	c := startDNSCluster(t)
	const svc = ".dnstest.svc.cluster.local."
	ptr, err := mdns.ReverseAddr(c.webIP)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		qname string
		qtype uint16
		want  []string
	}{
		{"service A", "web" + svc, mdns.TypeA, []string{"web" + svc + " 0 IN A " + c.webIP}},
		{"headless A", "db" + svc, mdns.TypeA, []string{"db" + svc + " 0 IN A " + c.dbIPs[0], "db" + svc + " 0 IN A " + c.dbIPs[1]}},
		{"headless hostname", "db-0.db" + svc, mdns.TypeA, []string{"db-0.db" + svc + " 0 IN A " + c.dbIPs[0]}},
		{"SRV named port", "_http._tcp.web" + svc, mdns.TypeSRV, []string{"_http._tcp.web" + svc + " 0 IN SRV 0 100 80 web" + svc}},
		{"PTR", ptr, mdns.TypePTR, []string{ptr + " 0 IN PTR web" + svc}},
		{"ExternalName CNAME", "ext" + svc, mdns.TypeCNAME, []string{"ext" + svc + " 0 IN CNAME db.example.org."}},
		{"forwarded", "www.example.org.", mdns.TypeA, []string{"www.example.org. 0 IN A 192.0.2.1"}},
	}
	for _, network := range []string{"udp", "tcp"} {
		for _, tc := range cases {
			t.Run(network+"/"+tc.name, func(t *testing.T) { eventually(t, c.addr, network, tc.qname, tc.qtype, tc.want...) })
		}
	}
	// A name of the cluster domain that does not exist is NXDOMAIN from the plugin, not forwarded.
	if _, rcode := query(t, c.addr, "udp", "nope"+svc, mdns.TypeA); rcode != mdns.RcodeNameError {
		t.Errorf("missing service: rcode %d, want NXDOMAIN", rcode)
	}
}

// BenchmarkServiceQuery measures queries per second and the p99 latency of a Service A record (cache
// warm), over UDP, with b.N queries from 8 concurrent clients.
//
//	go test ./nodeagent/dns -run '^$' -bench ServiceQuery -benchtime 20000x
func BenchmarkServiceQuery(b *testing.B) {
	c := startDNSCluster(b)
	name := "web." + testNS + ".svc.cluster.local."
	deadline := time.Now().Add(20 * time.Second)
	for {
		if got, rcode := query(b, c.addr, "udp", name, mdns.TypeA); rcode == mdns.RcodeSuccess && len(got) == 1 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the Service never resolved")
		}
		time.Sleep(100 * time.Millisecond)
	}
	const workers = 8
	lat := make([][]time.Duration, workers)
	errs := make(chan error, workers)
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < workers; w++ {
		n := b.N / workers
		if w < b.N%workers {
			n++
		}
		go func() {
			conn, err := net.Dial("udp", c.addr)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			co := &mdns.Conn{Conn: conn}
			m := new(mdns.Msg)
			m.SetQuestion(name, mdns.TypeA)
			for i := 0; i < n; i++ {
				t0 := time.Now()
				m.Id = mdns.Id()
				_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
				if err := co.WriteMsg(m); err != nil {
					errs <- err
					return
				}
				r, err := co.ReadMsg()
				if err != nil {
					errs <- err
					return
				}
				if r.Rcode != mdns.RcodeSuccess || len(r.Answer) != 1 {
					errs <- fmt.Errorf("answer %v", r)
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
			errs <- nil
		}()
	}
	for w := 0; w < workers; w++ {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "queries/s")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
}

// testWriter sends log lines to the test's log, shown when it fails.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) { w.t.Logf("%s", b); return len(b), nil }
