package bench

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/internal/freeport"
	"github.com/skiff-dev/skiff/internal/images"
	"github.com/skiff-dev/skiff/internal/proctest"
)

var (
	execRuns    = flag.Int("exec.runs", 100, "round trips of each kind in the exec benchmark")
	logsSeconds = flag.Int("logs.seconds", 10, "seconds the logs -f benchmark measures for")
	pfMiB       = flag.Int("pf.mib", 128, "MiB per download in the port-forward benchmark")
	pfRuns      = flag.Int("pf.runs", 3, "downloads of each kind in the port-forward benchmark (the median counts)")
)

// BenchmarkExec measures `kubectl exec POD -- true` on `skiff local` (one server, two agents), p50 and p99
// over -exec.runs round trips, beside `ctr task exec` of the same command in the same container straight on
// the agent's private containerd (no API server, no agent endpoint), and beside `kubectl get --raw` of the
// pod (kubectl's own start and one API request, without a stream); the three interleaved. Reports the
// ratio of the p50s of kubectl exec and ctr. Run it with -benchtime=1x.
func BenchmarkExec(b *testing.B) {
	requireTools(b, "kubectl", "ctr")
	st, client, dir := benchLocalCluster(b)
	kubeconfig := st.Kubeconfig(dir)
	pod := busyboxBenchPod(b, client, "exec-target", "agent-1", "exec sleep 36000", nil)
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	sock := filepath.Join(dir, "agent-1", "data", "containerd", "containerd.sock")
	var execs int
	viaKubectl := func() error { _, err := kubectlRun(kubeconfig, "exec", "exec-target", "--", "true"); return err }
	viaGet := func() error {
		_, err := kubectlRun(kubeconfig, "get", "--raw", "/api/v1/namespaces/default/pods/exec-target")
		return err
	}
	viaCtr := func() error {
		execs++
		out, err := exec.Command("ctr", "-a", sock, "-n", "skiff", "task", "exec", "--exec-id", fmt.Sprintf("bench-%d", execs), id, "true").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	for _, warm := range []func() error{viaKubectl, viaGet, viaCtr} {
		if err := warm(); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		var kubectlTimes, ctrTimes, getTimes []time.Duration
		for range *execRuns {
			for _, m := range []struct {
				run   func() error
				times *[]time.Duration
			}{{viaKubectl, &kubectlTimes}, {viaCtr, &ctrTimes}, {viaGet, &getTimes}} {
				start := time.Now()
				if err := m.run(); err != nil {
					b.Fatal(err)
				}
				*m.times = append(*m.times, time.Since(start))
			}
		}
		k50, k99 := quantiles(kubectlTimes)
		c50, c99 := quantiles(ctrTimes)
		g50, _ := quantiles(getTimes)
		b.ReportMetric(ms(k50), "kubectl-p50-ms")
		b.ReportMetric(ms(k99), "kubectl-p99-ms")
		b.ReportMetric(ms(c50), "ctr-p50-ms")
		b.ReportMetric(ms(c99), "ctr-p99-ms")
		b.ReportMetric(ms(g50), "get-p50-ms")
		b.ReportMetric(float64(k50)/float64(c50), "kubectl/ctr-p50")
	}
}

// BenchmarkLogsFollow measures `kubectl logs -f` on `skiff local` of a container writing as fast as it can
// (yes, 100-byte lines): the bytes kubectl delivers a second over -logs.seconds, in MB/s (10^6 bytes), and
// the CPU the agent process and the server process used meanwhile, in cores. The writer starts only when
// kubectl follows, and stops on its own soon after the measurement (its log is bounded by the agent's
// rotation). Run it with -benchtime=1x.
func BenchmarkLogsFollow(b *testing.B) {
	requireTools(b, "kubectl")
	st, client, dir := benchLocalCluster(b)
	kubeconfig := st.Kubeconfig(dir)
	line := strings.Repeat("0123456789", 10)[:99] // and yes's newline
	busyboxBenchPod(b, client, "writer", "agent-1", fmt.Sprintf(
		"until [ -e /tmp/go ]; do sleep 0.1; done; exec timeout -s KILL %d yes %s", *logsSeconds+60, line), nil)
	agent, _ := st.Host("agent-1")
	server, _ := st.Host("server-1")
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		follow := exec.CommandContext(ctx, "kubectl", "--kubeconfig", kubeconfig, "logs", "-f", "writer")
		stdout, err := follow.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := follow.Start(); err != nil {
			b.Fatal(err)
		}
		var received atomic.Int64
		go func() {
			buf := make([]byte, 256<<10)
			for {
				n, err := stdout.Read(buf)
				received.Add(int64(n))
				if err != nil {
					return
				}
			}
		}()
		if out, err := kubectlRun(kubeconfig, "exec", "writer", "--", "touch", "/tmp/go"); err != nil {
			b.Fatalf("starting the writer: %v %s", err, out)
		}
		proctest.WaitFor(b, "the followed log flowing", 60*time.Second, func() error {
			if received.Load() < 1<<20 {
				return fmt.Errorf("%d bytes so far", received.Load())
			}
			return nil
		})
		agent0, server0, bytes0, t0 := processCPU(b, agent.PID), processCPU(b, server.PID), received.Load(), time.Now()
		time.Sleep(time.Duration(*logsSeconds) * time.Second) // the measurement window
		agentCPU, serverCPU := processCPU(b, agent.PID)-agent0, processCPU(b, server.PID)-server0
		n, elapsed := received.Load()-bytes0, time.Since(t0).Seconds()
		cancel()
		_ = follow.Wait()
		b.ReportMetric(float64(n)/elapsed/1e6, "MB/s")
		b.ReportMetric(agentCPU.Seconds()/elapsed, "agent-cores")
		b.ReportMetric(serverCPU.Seconds()/elapsed, "server-cores")
	}
	zero := int64(0)
	_ = client.CoreV1().Pods("default").Delete(context.Background(), "writer", metav1.DeleteOptions{GracePeriodSeconds: &zero})
}

// BenchmarkPortForward measures a download of -pf.mib MiB from busybox httpd in a pod on `skiff local`,
// through `kubectl port-forward` (kubectl -> the server -> the agent's endpoint -> the pod) beside a direct
// connection to the pod IP from its agent's host; the median of -pf.runs downloads each, in MB/s (10^6
// bytes), their ratio, and the CPU the agent and server processes used during the forwarded downloads, in
// cores. Run it with -benchtime=1x.
func BenchmarkPortForward(b *testing.B) {
	requireTools(b, "kubectl", "curl")
	st, client, dir := benchLocalCluster(b)
	kubeconfig := st.Kubeconfig(dir)
	size := int64(*pfMiB) << 20
	ready := &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}}}
	pod := busyboxBenchPod(b, client, "bulk", "agent-1", fmt.Sprintf(
		"mkdir -p /www && head -c %d /dev/urandom > /www/big && exec httpd -f -p 8080 -h /www", size), ready)
	port := freeport.One(b)
	pf := exec.Command("kubectl", "--kubeconfig", kubeconfig, "port-forward", "pod/bulk", fmt.Sprintf("%d:8080", port))
	stdout, err := pf.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := pf.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pf.Process.Kill(); pf.Wait() })
	forwarding := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "Forwarding from 127.0.0.1:") {
				close(forwarding)
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case <-forwarding:
	case <-time.After(60 * time.Second):
		b.Fatal("kubectl port-forward did not start forwarding in 60 s")
	}
	download := &http.Client{Timeout: 5 * time.Minute}
	forwarded := func() (float64, error) {
		start := time.Now()
		resp, err := download.Get(fmt.Sprintf("http://127.0.0.1:%d/big", port))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil || n != size {
			return 0, fmt.Errorf("%d of %d bytes: %v", n, size, err)
		}
		return float64(n) / time.Since(start).Seconds() / 1e6, nil
	}
	direct := func() (float64, error) {
		out, err := inAgent(st, "agent-1", "curl", "-sS", "--max-time", "300", "-o", "/dev/null", "-w", "%{size_download} %{time_total}",
			"http://"+pod.Status.PodIP+":8080/big")
		var n int64
		var secs float64
		if _, serr := fmt.Sscan(string(out), &n, &secs); err != nil || serr != nil || n != size {
			return 0, fmt.Errorf("curl: %v %v: %s", err, serr, out)
		}
		return float64(n) / secs / 1e6, nil
	}
	agent, _ := st.Host("agent-1")
	server, _ := st.Host("server-1")
	for b.Loop() {
		var viaForward, viaDirect []float64
		var agentCPU, serverCPU, forwardTime time.Duration
		for range *pfRuns {
			agent0, server0, t0 := processCPU(b, agent.PID), processCPU(b, server.PID), time.Now()
			f, err := forwarded()
			if err != nil {
				b.Fatalf("download through kubectl port-forward: %v", err)
			}
			agentCPU += processCPU(b, agent.PID) - agent0
			serverCPU += processCPU(b, server.PID) - server0
			forwardTime += time.Since(t0)
			d, err := direct()
			if err != nil {
				b.Fatalf("direct download: %v", err)
			}
			viaForward, viaDirect = append(viaForward, f), append(viaDirect, d)
		}
		f, d := median(viaForward), median(viaDirect)
		b.ReportMetric(f, "forward-MB/s")
		b.ReportMetric(d, "direct-MB/s")
		b.ReportMetric(f/d, "forward/direct")
		b.ReportMetric(agentCPU.Seconds()/forwardTime.Seconds(), "agent-cores")
		b.ReportMetric(serverCPU.Seconds()/forwardTime.Seconds(), "server-cores")
	}
}

// busyboxBenchPod creates a pod running script in the offline busybox image on node, and waits until it is
// Ready.
func busyboxBenchPod(b *testing.B, client kubernetes.Interface, name, node, script string, readiness *corev1.Probe) *corev1.Pod {
	b.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Name: "c", Image: images.OfflineBusyboxRef, ImagePullPolicy: corev1.PullNever,
			Command: []string{"sh", "-c", script}, ReadinessProbe: readiness,
		}}},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	proctest.WaitFor(b, name+" Ready", 120*time.Second, func() error {
		var err error
		if pod, err = client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && len(pod.Status.ContainerStatuses) > 0 {
				return nil
			}
		}
		return fmt.Errorf("not Ready: %s", pod.Status.Phase)
	})
	return pod
}

// kubectlRun runs the machine's kubectl against kubeconfig.
func kubectlRun(kubeconfig string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

func requireTools(b *testing.B, tools ...string) {
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s not installed", tool)
		}
	}
}

// quantiles sorts the durations and returns their p50 and p99.
func quantiles(d []time.Duration) (p50, p99 time.Duration) {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[(len(d)-1)/2], d[(len(d)-1)*99/100]
}

func median(v []float64) float64 {
	sort.Float64s(v)
	return v[(len(v)-1)/2]
}
