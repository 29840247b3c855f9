package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/remotes/docker"
	"github.com/containernetworking/cni/libcni"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skiff-dev/skiff/internal/hostnetlock"
	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/testimages"
)

var startupPods = flag.Int("startup.pods", 100, "pods in the pod startup latency and density benchmark")

const benchJoinToken = "bench-join-token-0123456789"

// BenchmarkPodStartup measures, on one `skiff server` and one `skiff agent` on the real runtime (containerd,
// runc, CNI), with the image already present:
//   - create-to-Running and create-to-Ready latency (p50, p99) of -startup.pods pods, each created once the
//     one before is Ready, as an informer sees the status; each pod has an exec readiness probe (every 10 s,
//     Kubernetes' default period);
//   - the same sandbox (pause container, network namespace, CNI bridge + host-local) plus container start,
//     done directly through the containerd client and libcni in the same run, and the ratio of the two p50s;
//   - density: the agent's and its containerd's CPU and memory with all the pods running, at steady state.
//
// Run it with -benchtime=1x; the size is a flag.
func BenchmarkPodStartup(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("real pods need root")
	}
	registry := testimages.StartRegistry(b)
	imgs := testimages.Push(b, registry)
	c := proctest.NewCluster(b, 1, fmt.Sprintf("token = %q", benchJoinToken))
	c.Start(c.Procs[0])
	client := clientFor(b, c.Procs[0].Kubeconfig())
	// The agent runs in this machine's own network namespace, as some e2e tests' agents do, which may run
	// beside this benchmark (make test): they take turns.
	hostnetlock.Lock(b)
	agent := startBenchAgent(b, c.Procs[0].Kubeconfig(), registry)
	ctx := context.Background()
	proctest.WaitFor(b, "the node Ready", 60*time.Second, func() error {
		node, err := client.CoreV1().Nodes().Get(ctx, agent.name, metav1.GetOptions{})
		if err != nil || len(node.Status.Conditions) == 0 || node.Status.Conditions[0].Status != corev1.ConditionTrue {
			return fmt.Errorf("not yet: %v", err)
		}
		return nil
	})

	// An informer records when each pod is first seen Running and first seen Ready.
	var mu sync.Mutex
	created := map[string]time.Time{}
	running := map[string]time.Duration{}
	ready := map[string]time.Duration{}
	factory := informers.NewSharedInformerFactory(client, 0)
	observe := func(obj any) {
		pod := obj.(*corev1.Pod)
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		t0, ok := created[pod.Name]
		if !ok {
			return
		}
		if _, seen := running[pod.Name]; !seen && pod.Status.Phase == corev1.PodRunning {
			running[pod.Name] = now.Sub(t0)
		}
		for _, cond := range pod.Status.Conditions {
			if _, seen := ready[pod.Name]; !seen && cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				ready[pod.Name] = now.Sub(t0)
			}
		}
	}
	factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: observe, UpdateFunc: func(_, o any) { observe(o) }})
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	factory.WaitForCacheSync(stop)

	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "main", Image: imgs.Busybox, Command: []string{"sleep", "3600"},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/etc/hostname"}}},
					PeriodSeconds: 10}}}}}
	}
	// Warm up: the image is pulled and the pause image built once, outside the measurement.
	warm := pod("warm-up")
	mu.Lock()
	created[warm.Name] = time.Now()
	mu.Unlock()
	if _, err := client.CoreV1().Pods("default").Create(ctx, warm, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	waitCount(b, &mu, ready, 1, 120*time.Second)

	// One pod at a time, each created once the one before is Ready: latency, not queueing, comparable to the
	// direct starts below, which are one at a time too. Pods already running add to the node's load.
	b.ResetTimer()
	for i := 0; i < *startupPods; i++ {
		p := pod(fmt.Sprintf("startup-%d", i))
		mu.Lock()
		created[p.Name] = time.Now()
		mu.Unlock()
		if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		waitCount(b, &mu, ready, i+2, 2*time.Minute)
	}
	b.StopTimer()
	mu.Lock()
	delete(running, warm.Name)
	delete(ready, warm.Name)
	runP50, runP99 := percentiles(running)
	readyP50, readyP99 := percentiles(ready)
	mu.Unlock()

	// Density, with every pod running: CPU over 20 s, and resident memory.
	time.Sleep(5 * time.Second)
	agentCPU, agentRSS := processUsage(b, agent.cmd.Process.Pid, 20*time.Second)
	ctrdPid := containerdPid(b, agent.dataDir)
	ctrdCPU, ctrdRSS := processUsage(b, ctrdPid, 5*time.Second)

	direct := directStartups(b, agent.dataDir, imgs, *startupPods)
	directP50, directP99 := direct[(len(direct)-1)/2], direct[(len(direct)-1)*99/100]

	b.ReportMetric(ms(runP50), "running-p50-ms")
	b.ReportMetric(ms(runP99), "running-p99-ms")
	b.ReportMetric(ms(readyP50), "ready-p50-ms")
	b.ReportMetric(ms(readyP99), "ready-p99-ms")
	b.ReportMetric(ms(directP50), "direct-p50-ms")
	b.ReportMetric(float64(runP50)/float64(directP50), "overhead-ratio-p50")
	b.ReportMetric(agentCPU*100, "agent-cpu-%")
	b.ReportMetric(float64(agentRSS)/(1<<20), "agent-rss-MiB")
	b.Logf("%d pods: create→Running p50 %.0f ms p99 %.0f ms; create→Ready p50 %.0f ms p99 %.0f ms", *startupPods, ms(runP50), ms(runP99), ms(readyP50), ms(readyP99))
	b.Logf("direct containerd+CNI sandbox and container start: p50 %.0f ms p99 %.0f ms; Skiff's overhead at p50: %.2fx",
		ms(directP50), ms(directP99), float64(runP50)/float64(directP50))
	b.Logf("density, %d pods running: agent %.1f%% of a CPU, %.0f MiB RSS; its containerd %.1f%% of a CPU, %.0f MiB RSS",
		*startupPods+1, agentCPU*100, float64(agentRSS)/(1<<20), ctrdCPU*100, float64(ctrdRSS)/(1<<20))

	// Delete every pod through the API; the agent tears them down (the agent's cleanup catches the rest).
	zero := int64(0)
	_ = client.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
}

func clientFor(b *testing.B, kubeconfig string) kubernetes.Interface {
	var cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	proctest.WaitFor(b, "kubeconfig", 60*time.Second, func() error {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		return err
	})
	cfg.QPS, cfg.Burst = -1, 0
	client := kubernetes.NewForConfigOrDie(cfg)
	proctest.WaitFor(b, "the API", 60*time.Second, func() error {
		_, err := client.CoreV1().ServiceAccounts("default").Get(context.Background(), "default", metav1.GetOptions{})
		return err
	})
	return client
}

func waitCount(b *testing.B, mu *sync.Mutex, m map[string]time.Duration, n int, timeout time.Duration) {
	proctest.WaitFor(b, fmt.Sprintf("%d pods Ready", n), timeout, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(m) < n {
			return fmt.Errorf("%d of %d", len(m), n)
		}
		return nil
	})
}

func percentiles(m map[string]time.Duration) (time.Duration, time.Duration) {
	var all []time.Duration
	for _, d := range m {
		all = append(all, d)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	return all[(len(all)-1)/2], all[(len(all)-1)*99/100]
}

// benchAgent is a `skiff agent` process on the containerd runtime.
type benchAgent struct {
	name, dataDir string
	cmd           *exec.Cmd
}

// startBenchAgent runs an agent joined to the server; at cleanup it is killed and `skiff agent -teardown`
// removes its pods, network namespaces, IPs and bridge.
func startBenchAgent(b *testing.B, kubeconfig, registry string) *benchAgent {
	dir, err := os.MkdirTemp("", "skiff-bench-") // short: containerd's socket lives under it
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	a := &benchAgent{name: "bench-node", dataDir: filepath.Join(dir, "data")}
	hcl := fmt.Sprintf(`name = %q
data_dir = %q
bind_addr = "127.0.0.1"
agent {
  servers = [%q]
  token = %q
  registry %q {
    plain_http = true
  }
}
`, a.name, a.dataDir, strings.TrimPrefix(cfg.Host, "https://"), benchJoinToken, registry)
	path := filepath.Join(dir, "agent.hcl")
	if err := os.WriteFile(path, []byte(hcl), 0o600); err != nil {
		b.Fatal(err)
	}
	var out strings.Builder
	a.cmd = exec.Command(proctest.Binary(b), "agent", "-config", path)
	a.cmd.Stdout, a.cmd.Stderr = &out, &out
	if err := a.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		a.cmd.Process.Kill()
		a.cmd.Wait()
		if b.Failed() {
			b.Logf("agent output:\n%s", out.String())
		}
		if out, err := exec.Command(proctest.Binary(b), "agent", "-config", path, "-teardown").CombinedOutput(); err != nil {
			b.Errorf("agent teardown: %v\n%s", err, out)
		}
		os.RemoveAll(dir)
	})
	return a
}

// cpuTicks is the CPU time a process has used so far, in clock ticks (USER_HZ, 100 a second on Linux).
func cpuTicks(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return utime + stime, nil
}

// processUsage is a process's CPU use (in CPUs) over the window, and its resident memory at the end.
func processUsage(b *testing.B, pid int, window time.Duration) (float64, int64) {
	ticks := func() int64 {
		t, err := cpuTicks(pid)
		if err != nil {
			b.Fatal(err)
		}
		return t
	}
	t0, c0 := time.Now(), ticks()
	time.Sleep(window)
	cpu := float64(ticks()-c0) / 100 / time.Since(t0).Seconds() // USER_HZ is 100 on Linux
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	var rss int64
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			kib, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			rss = kib << 10
		}
	}
	return cpu, rss
}

func containerdPid(b *testing.B, dataDir string) int {
	data, err := os.ReadFile(filepath.Join(dataDir, "containerd", "containerd.pid"))
	if err != nil {
		b.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

// directStartups starts n sandboxes, each a pause container with a pinned network namespace wired by CNI
// (bridge + host-local, as the agent does) plus one busybox container in it, directly through the containerd
// client and libcni, one after another; it returns the sorted start times and removes everything it made.
func directStartups(b *testing.B, dataDir string, imgs testimages.Images, n int) []time.Duration {
	client, err := containerd.New(filepath.Join(dataDir, "containerd", "containerd.sock"))
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	ctx := namespaces.WithNamespace(context.Background(), "bench-direct")
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(docker.MatchLocalhost))})
	pull := func(ref string) containerd.Image {
		img, err := client.Pull(ctx, ref, containerd.WithPullUnpack, containerd.WithResolver(resolver))
		if err != nil {
			b.Fatal(err)
		}
		return img
	}
	pause, busybox := pull(imgs.Pause), pull(imgs.Busybox)
	work := b.TempDir()
	netConf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"bench-direct","plugins":[
  {"type":"bridge","bridge":"skbenchdirect","isGateway":true,"ipMasq":true,"hairpinMode":true,
   "ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"10.251.0.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}]}},
  {"type":"portmap","capabilities":{"portMappings":true},"snat":true}]}`, filepath.Join(work, "ipam"))
	list, err := libcni.ConfListFromBytes([]byte(netConf))
	if err != nil {
		b.Fatal(err)
	}
	lo, _ := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.0.0","name":"bench-lo","plugins":[{"type":"loopback"}]}`))
	cni := libcni.NewCNIConfigWithCacheDir([]string{"/usr/lib/cni", "/opt/cni/bin"}, filepath.Join(work, "cache"), nil)

	type made struct {
		ctrs  []containerd.Container
		netns string
		id    string
	}
	var all []made
	defer func() {
		for _, m := range all {
			rt := &libcni.RuntimeConf{ContainerID: m.id, NetNS: m.netns, IfName: "eth0"}
			_ = cni.DelNetworkList(ctx, list, rt)
			for _, c := range m.ctrs {
				if task, err := c.Task(ctx, nil); err == nil {
					_, _ = task.Delete(ctx, containerd.WithProcessKill)
				}
				_ = c.Delete(ctx, containerd.WithSnapshotCleanup)
			}
			_ = unix.Unmount(m.netns, unix.MNT_DETACH)
			_ = os.Remove(m.netns)
		}
		_ = exec.Command("ip", "link", "del", "skbenchdirect").Run()
		_ = client.ImageService().Delete(ctx, pause.Name())
		_ = client.ImageService().Delete(ctx, busybox.Name())
		_ = client.NamespaceService().Delete(ctx, "bench-direct")
		cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/bench-direct")
		for _, dir := range cgroups {
			_ = unix.Rmdir(dir)
		}
	}()
	var times []time.Duration
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("bench-direct-%d", i)
		t0 := time.Now()
		m := made{id: id, netns: "/run/netns/" + id}
		all = append(all, m)
		sb, err := client.NewContainer(ctx, id, containerd.WithNewSnapshot(id, pause), containerd.WithNewSpec(oci.WithImageConfig(pause)))
		if err != nil {
			b.Fatal(err)
		}
		all[i].ctrs = append(all[i].ctrs, sb)
		task, err := sb.NewTask(ctx, cio.NullIO)
		if err == nil {
			err = task.Start(ctx)
		}
		if err != nil {
			b.Fatal(err)
		}
		if err := pinNetns(fmt.Sprintf("/proc/%d/ns/net", task.Pid()), m.netns); err != nil {
			b.Fatal(err)
		}
		if _, err := cni.AddNetworkList(ctx, lo, &libcni.RuntimeConf{ContainerID: id, NetNS: m.netns, IfName: "lo"}); err != nil {
			b.Fatal(err)
		}
		if _, err := cni.AddNetworkList(ctx, list, &libcni.RuntimeConf{ContainerID: id, NetNS: m.netns, IfName: "eth0"}); err != nil {
			b.Fatal(err)
		}
		cid := id + "-main"
		main, err := client.NewContainer(ctx, cid, containerd.WithNewSnapshot(cid, busybox), containerd.WithNewSpec(oci.WithImageConfig(busybox),
			oci.WithProcessArgs("sleep", "3600"), oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: m.netns})))
		if err != nil {
			b.Fatal(err)
		}
		all[i].ctrs = append(all[i].ctrs, main)
		mainTask, err := main.NewTask(ctx, cio.NullIO)
		if err == nil {
			err = mainTask.Start(ctx)
		}
		if err != nil {
			b.Fatal(err)
		}
		times = append(times, time.Since(t0))
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	return times
}

// pinNetns bind-mounts a network namespace file at path, as `ip netns` does.
func pinNetns(from, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, nil, 0o444); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return unix.Mount(from, path, "none", unix.MS_BIND, "")
}
