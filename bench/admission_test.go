package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/internal/proctest"
)

// BenchmarkAdmission measures the admission chain on three `skiff server` processes, at concurrency 64
// spread over the peers, b.N pod creates a phase:
//   - server CPU per create in a namespace that no admission plugin has work in, and in one where every
//     plugin has: a LimitRange that defaults the containers' resources, a ResourceQuota that charges them
//     (far from its limits), and PodSecurity enforcing `restricted` on pods that meet it;
//   - a namespace with `pods: b.N/2`: b.N creates, of which exactly half are admitted; the admitted per
//     second, the quota charges the servers retried (409s on resourcequotas/status, from the servers'
//     apiserver_request_total), and the creates the clients retried (the quota admission gives up after
//     three lost charges and answers 409, as kube-apiserver does).
func BenchmarkAdmission(b *testing.B) {
	if firstCallOfTwo(b) {
		return
	}
	c, clients := apiCluster(b)
	ctx := context.Background()
	const conc = 64
	n := b.N
	// A create that the quota admission could not charge (409: its compare-and-swap of the quota's status
	// lost, three times, to other servers' charges) is retried, as a controller would.
	var retried atomic.Int64
	create := func(client kubernetes.Interface, ns string, pod *corev1.Pod) error {
		for {
			_, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
			if !apierrors.IsConflict(err) {
				return err
			}
			retried.Add(1)
		}
	}
	creates := func(ns string, pod func(string) *corev1.Pod) (rate, serverMs float64) {
		cpu := startCPU(b, c)
		rate, _, _ = run(b, conc, n, func(w, i int) error {
			return create(clients[w%3], ns, pod(fmt.Sprintf("p-%06d", i)))
		})
		_, serverMs = cpu.perOp(n)
		return rate, serverMs
	}
	b.ResetTimer()

	createNamespace(b, ctx, clients[0], "bench-plain")
	plainRate, plainMs := creates("bench-plain", benchPod)

	const full = "bench-admission"
	createNamespace(b, ctx, clients[0], full)
	setUpAdmissionNamespace(b, ctx, clients[0], full)
	fullRate, fullMs := creates(full, restrictedPod)
	b.Logf("pod creates: %.0f/s and %.2f ms of server CPU each with no plugin at work; %.0f/s and %.2f ms with LimitRange, ResourceQuota and PodSecurity restricted (%d quota conflicts retried)",
		plainRate, plainMs, fullRate, fullMs, retried.Swap(0))
	b.ReportMetric(plainMs, "plain-create-server-cpu-ms")
	b.ReportMetric(fullMs, "admission-create-server-cpu-ms")
	b.ReportMetric(fullMs/plainMs, "admission/plain")

	const limited = "bench-quota"
	createNamespace(b, ctx, clients[0], limited)
	if _, err := clients[0].CoreV1().ResourceQuotas(limited).Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "pods"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(int64(n/2), resource.DecimalSI)}}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	waitQuotaStatus(b, ctx, clients, limited, "pods")
	conflictsBefore := quotaConflicts(b, ctx, clients)
	var admitted, refused atomic.Int64
	cpu := startCPU(b, c)
	start := time.Now()
	run(b, conc, n, func(w, i int) error {
		err := create(clients[w%3], limited, benchPod(fmt.Sprintf("p-%06d", i)))
		switch {
		case err == nil:
			admitted.Add(1)
		case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
			refused.Add(1)
		default:
			return err
		}
		return nil
	})
	elapsed := time.Since(start)
	_, quotaMs := cpu.perOp(n)
	conflicts := quotaConflicts(b, ctx, clients) - conflictsBefore
	if admitted.Load() != int64(n/2) {
		b.Fatalf("%d of %d creates admitted against pods: %d", admitted.Load(), n, n/2)
	}
	b.Logf("quota pods: %d, %d creates at concurrency %d: %d admitted (%.0f/s), %d refused; the servers retried %d quota charges (409 on resourcequotas), the clients %d creates; %.2f ms of server CPU per create",
		n/2, n, conc, admitted.Load(), float64(admitted.Load())/elapsed.Seconds(), refused.Load(), conflicts, retried.Load(), quotaMs)
	b.ReportMetric(float64(admitted.Load())/elapsed.Seconds(), "quota-admitted/s")
	b.ReportMetric(float64(conflicts), "quota-server-retries")
	b.ReportMetric(float64(retried.Load()), "quota-client-retries")
	b.ReportMetric(0, "ns/op")
}

// setUpAdmissionNamespace gives a namespace work for every admission plugin: a LimitRange with defaults, a
// ResourceQuota far from its limits, and PodSecurity enforcing restricted.
func setUpAdmissionNamespace(b *testing.B, ctx context.Context, client kubernetes.Interface, ns string) {
	q := resource.MustParse
	if _, err := client.CoreV1().LimitRanges(ns).Create(ctx, &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "defaults"},
		Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{Type: corev1.LimitTypeContainer,
			Default:        corev1.ResourceList{corev1.ResourceCPU: q("200m"), corev1.ResourceMemory: q("64Mi")},
			DefaultRequest: corev1.ResourceList{corev1.ResourceCPU: q("100m"), corev1.ResourceMemory: q("32Mi")},
			Max:            corev1.ResourceList{corev1.ResourceCPU: q("2")}}}}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if _, err := client.CoreV1().ResourceQuotas(ns).Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "large"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: q("1000000"), corev1.ResourceRequestsCPU: q("1000000"),
			corev1.ResourceLimitsMemory: q("1000Ti")}}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	nsObj, err := client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if nsObj.Labels == nil {
		nsObj.Labels = map[string]string{}
	}
	nsObj.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	if _, err := client.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
	waitQuotaStatus(b, ctx, []kubernetes.Interface{client}, ns, "large")
}

// restrictedPod is benchPod meeting the restricted Pod Security Standard, without resources (the LimitRange
// gives them).
func restrictedPod(name string) *corev1.Pod {
	p := benchPod(name)
	no, yes := false, true
	p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: &yes, SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: &no,
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	return p
}

// waitQuotaStatus waits until every peer sees the quota's status filled in by the quota controller: before
// that, the quota admission refuses creates.
func waitQuotaStatus(b *testing.B, ctx context.Context, clients []kubernetes.Interface, ns, name string) {
	for _, client := range clients {
		proctest.WaitFor(b, "the quota's status", 30*time.Second, func() error {
			rq, err := client.CoreV1().ResourceQuotas(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(rq.Status.Hard) == 0 {
				return fmt.Errorf("no status yet")
			}
			return nil
		})
	}
}

// quotaConflicts sums, over the peers, the 409 answers to writes of resourcequotas: each is a quota charge
// that lost a compare-and-swap and was retried.
func quotaConflicts(b *testing.B, ctx context.Context, clients []kubernetes.Interface) int64 {
	var total int64
	for _, client := range clients {
		raw, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			b.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(raw))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `code="409"`) || !strings.Contains(line, `resource="resourcequotas"`) {
				continue
			}
			fields := strings.Fields(line)
			v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
			if err == nil {
				total += int64(v)
			}
		}
	}
	return total
}
