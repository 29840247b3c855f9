package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/skiff-dev/skiff/internal/freeport"
)

// kwokVersion is the kwok release the Kubernetes side's nodes run on (sigs.k8s.io/kwok).
const kwokVersion = "v0.8.0"

// kwokStages are kwok's own stage definitions the nodes and pods go through: nodes initialized at once and
// heartbeating with a Lease as kubelets do (kwok's default lease duration, 40 s, renewed every 10 s, and a
// status every 10 minutes), pods made ready at once, run to completion when they are a Job's, and deleted
// when asked, as kwokctl's default configuration sets them.
var kwokStages = []string{"node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
	"pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml"}

// kwokReadyAgain is a stage of this benchmark's own beside kwok's: a running pod that is not Ready becomes
// Ready again, as a kubelet reports it once its node is back. kwok's fast stages make a pod ready only when it
// is Pending, so a pod the node lifecycle controller marked not Ready (its node's Lease renewed late on this
// loaded machine) would stay so.
const kwokReadyAgain = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready-again
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values:
      - 'True'
  next:
    statusTemplate: |
      conditions:
      - lastTransitionTime: {{ Now | Quote }}
        status: "True"
        type: Ready
`

// kwokBinary builds kwok with Skiff's module graph (so its Kubernetes libraries are 1.37.2's) and keeps its
// stages beside it; it returns the binary and the stage file.
func kwokBinary(b *testing.B) (bin, stages string) {
	name := "kwok-" + kwokVersion
	bin = benchBuild(b, buildSpec{name: name, pkg: "sigs.k8s.io/kwok/cmd/kwok", gets: []string{"sigs.k8s.io/kwok@" + kwokVersion},
		after: func(mod, cacheDir string) error {
			dir, err := moduleDir(mod, "sigs.k8s.io/kwok")
			if err != nil {
				return err
			}
			var all []string
			for _, f := range kwokStages {
				data, err := os.ReadFile(filepath.Join(dir, "kustomize", "stage", f))
				if err != nil {
					return err
				}
				all = append(all, string(data))
			}
			return os.WriteFile(filepath.Join(cacheDir, name+"-stages.yaml"), []byte(strings.Join(all, "\n---\n")), 0o644)
		}})
	return bin, filepath.Join(filepath.Dir(bin), name+"-stages.yaml")
}

// moduleDir is where the module cache holds a module the module in dir requires.
func moduleDir(dir, module string) (string, error) {
	out, err := goOutput(dir, "list", "-m", "-f", "{{.Dir}}", module)
	return strings.TrimSpace(out), err
}

// kubeMachine is one of the three control-plane machines of kubeadm's stacked topology: an etcd member, a
// kube-apiserver over it, and a kube-controller-manager and a kube-scheduler (leader-elected among the three
// machines') over that apiserver, and a kwok process running a third of the nodes through it.
type kubeMachine struct {
	etcd, apiserver *benchProc
	controlPlane    []*benchProc // kube-controller-manager, kube-scheduler
	kwok            *benchProc
}

// startKubeScale starts Kubernetes 1.37.2 as kubeadm's HA topology runs it on three machines, here on three
// loopback addresses, and registers nodes Node objects that kwok runs; it waits for every node to be Ready.
func startKubeScale(b *testing.B, nodes int) *scaleTarget {
	k := startKubeAPIServers(b)
	kcm := benchBuild(b, buildSpec{name: "kube-controller-manager-v1.37.2", pkg: "k8s.io/kubernetes/cmd/kube-controller-manager"})
	sched := benchBuild(b, buildSpec{name: "kube-scheduler-v1.37.2", pkg: "k8s.io/kubernetes/cmd/kube-scheduler"})
	kwok, kwokStagesFile := kwokBinary(b)
	dir := b.TempDir()
	kwokStages, err := os.ReadFile(kwokStagesFile)
	if err != nil {
		b.Fatal(err)
	}
	stages := filepath.Join(dir, "kwok-stages.yaml")
	if err := os.WriteFile(stages, append(kwokStages, "\n---\n"+kwokReadyAgain...), 0o644); err != nil {
		b.Fatal(err)
	}
	ports := freeport.Take(b, []string{"127.0.0.1"}, 3)
	machines := make([]*kubeMachine, 3)
	var clients []kubernetes.Interface
	for i, cfg := range k.configs {
		kubeconfig := filepath.Join(dir, fmt.Sprintf("machine%d.kubeconfig", i))
		writeKubeconfig(b, kubeconfig, cfg)
		m := &kubeMachine{etcd: k.etcd.members[i], apiserver: k.servers[i]}
		m.controlPlane = []*benchProc{
			{name: fmt.Sprintf("kube-controller-manager %d", i+1), bin: kcm, log: filepath.Join(dir, fmt.Sprintf("kcm%d.log", i)), args: []string{
				// The client rate sig-scalability's large-cluster tests give it (100 QPS); kubeadm's default,
				// 20 QPS, would make the ReplicaSet controller, not the control plane, the limit here.
				"--kube-api-qps=100", "--kube-api-burst=100",
				"--kubeconfig", kubeconfig, "--leader-elect=true", "--secure-port=0", "--controllers=*",
				"--service-account-private-key-file", k.saKey, "--use-service-account-credentials=false",
				"--root-ca-file", filepath.Join(k.certDirs[i], "apiserver.crt"), "--profiling=false"}},
			{name: fmt.Sprintf("kube-scheduler %d", i+1), bin: sched, log: filepath.Join(dir, fmt.Sprintf("sched%d.log", i)), args: []string{
				"--kube-api-qps=100", "--kube-api-burst=100",
				"--kubeconfig", kubeconfig, "--leader-elect=true", "--secure-port=0", "--profiling=false"}},
		}
		m.kwok = &benchProc{name: fmt.Sprintf("kwok %d", i+1), bin: kwok, log: filepath.Join(dir, fmt.Sprintf("kwok%d.log", i)), args: []string{
			"--kubeconfig", kubeconfig, "--config", stages, "--manage-nodes-with-label-selector", fmt.Sprintf("skiff.dev/bench-kwok=%d", i),
			"--server-address", fmt.Sprintf("127.0.0.1:%d", ports[i]), "--node-ip", "10.0.0.1",
			"--node-lease-duration-seconds", "40"}} // kubelet's: renewed every 10 s
		for _, p := range append(m.controlPlane, m.kwok) {
			b.Cleanup(func() {
				p.kill()
				if b.Failed() {
					b.Logf("--- %s log (tail) ---\n%s", p.name, p.logTail())
				}
			})
			p.start(b)
		}
		machines[i] = m
		clients = append(clients, kubeClient(b, cfg))
	}
	ctx := context.Background()
	t0 := time.Now()
	run(b, 64, nodes, func(w, i int) error {
		_, err := clients[w%3].CoreV1().Nodes().Create(ctx, kwokNode(i), metav1.CreateOptions{})
		return err
	})
	b.Logf("%d nodes registered in %v", nodes, time.Since(t0).Round(time.Millisecond))
	waitNodesReady(b, clients[0], nodes)
	return &scaleTarget{
		system:  "kubernetes",
		clients: clients,
		machines: func() [][]int {
			var all [][]int
			for _, m := range machines {
				var pids []int
				for _, p := range append([]*benchProc{m.etcd, m.apiserver}, m.controlPlane...) {
					pids = append(pids, p.pid())
				}
				all = append(all, pids)
			}
			return all
		},
		// The machine whose etcd member leads goes down whole, as a Skiff server holding the Raft leadership.
		killLeader: func() (int, int, func()) {
			i := etcdLeader(b, k.etcd)
			m := machines[i]
			all := append([]*benchProc{m.etcd, m.apiserver, m.kwok}, m.controlPlane...)
			for _, p := range all {
				p.kill()
			}
			return (i + 1) % 3, i, func() {
				for _, p := range all {
					p.start(b)
				}
			}
		},
		// One kwok process, a third of the nodes: kube-controller-manager marks them Unknown once their
		// Leases are older than its node-monitor-grace-period.
		nodeHosts: 1,
		killNodeHost: func(i int) ([]string, func()) {
			m := machines[i%3]
			m.kwok.kill()
			var names []string
			for n := i % 3; n < nodes; n += 3 {
				names = append(names, kwokNode(n).Name)
			}
			return names, func() { m.kwok.start(b) }
		},
	}
}

// kwokNode is a node as kwok's documentation registers one: kwok's annotation and taint-free, with a
// kubelet-like capacity (110 pods), assigned to one of the three kwok processes by label.
func kwokNode(i int) *corev1.Node {
	name := fmt.Sprintf("kwok-%05d", i)
	alloc := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods: resource.MustParse("110")}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name,
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
			Labels: map[string]string{corev1.LabelHostname: name, "type": "kwok", "skiff.dev/bench-kwok": fmt.Sprint(i % 3),
				corev1.LabelTopologyZone: fmt.Sprintf("zone-%d", i%3)}},
		Status: corev1.NodeStatus{Capacity: alloc, Allocatable: alloc},
	}
}

// etcdLeader is the index of the member that leads.
func etcdLeader(b *testing.B, ec *etcdCluster) int {
	for attempt := 0; attempt < 50; attempt++ {
		for i, c := range ec.clients {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, err := c.Status(ctx, ec.endpoints[i])
			cancel()
			if err == nil && st.Leader == st.Header.MemberId {
				return i
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.Fatal("no etcd member says it leads")
	return 0
}

// writeKubeconfig writes cfg (a bearer token, an unverified server certificate) as a kubeconfig file.
func writeKubeconfig(b *testing.B, path string, cfg *rest.Config) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["bench"] = &clientcmdapi.Cluster{Server: cfg.Host, InsecureSkipTLSVerify: true}
	kc.AuthInfos["bench"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["bench"] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: "bench"}
	kc.CurrentContext = "bench"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		b.Fatal(err)
	}
}
