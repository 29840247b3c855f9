package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/skiff-dev/skiff/internal/proctest"
)

// TestSchedulerWithKubectlAndLeaderFailover runs three `skiff server` processes with simulated nodes:
//   - with the stock kubectl, a pod whose nodeSelector matches no node shows FailedScheduling in
//     `kubectl describe pod`, and schedules after `kubectl label node`;
//   - the leader, which runs the scheduler, is killed with kill -9 while pods are pending: the new leader's
//     scheduler binds every pod, and no pod is ever bound to a second node.
func TestSchedulerWithKubectlAndLeaderFailover(t *testing.T) {
	parallel(t)
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not installed")
	}
	c := proctest.NewCluster(t, 3, "")
	for _, p := range c.Procs {
		c.Start(p)
	}
	for _, p := range c.Procs {
		proctest.WaitFor(t, p.Name+" kubeconfig", 60*time.Second, func() error {
			_, err := os.Stat(p.Kubeconfig())
			return err
		})
	}
	leader := c.ByName(c.HealthyPeers(c.Procs[0], 3))
	var follower, other *proctest.Proc
	for _, p := range c.Procs {
		switch {
		case p == leader:
		case follower == nil:
			follower = p
		default:
			other = p
		}
	}
	k := kubectl{t: t, kubeconfig: follower.Kubeconfig()}
	k.waitForAPI("default")
	mustContain(t, "apply nodes", k.ok("apply", "-f", "testdata/nodes.yaml"), "node/sim-1 created", "node/sim-3 created")

	// kubectl: FailedScheduling, then a label makes room.
	k.ok("run", "picky", "--image=registry.local/app:1", "--restart=Never", `--overrides={"spec":{"nodeSelector":{"disktype":"ssd"}}}`)
	proctest.WaitFor(t, "FailedScheduling in describe", 30*time.Second, func() error {
		out := k.ok("describe", "pod", "picky")
		if !strings.Contains(out, "FailedScheduling") || !strings.Contains(out, "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.") {
			return fmt.Errorf("not yet:\n%s", out)
		}
		return nil
	})
	k.ok("label", "node", "sim-2", "disktype=ssd")
	proctest.WaitFor(t, "picky bound to sim-2", 30*time.Second, func() error {
		if out := k.ok("get", "pod", "picky", "-o", "jsonpath={.spec.nodeName}"); out != "sim-2" {
			return fmt.Errorf("nodeName %q", out)
		}
		return nil
	})
	proctest.WaitFor(t, "Scheduled in describe", 30*time.Second, func() error {
		if out := k.ok("describe", "pod", "picky"); !strings.Contains(out, "Successfully assigned default/picky to sim-2") {
			return fmt.Errorf("not yet:\n%s", out)
		}
		return nil
	})

	// Leader failover with pods pending. An informer through the peers that survive records every binding.
	client := kubernetes.NewForConfigOrDie(failoverConfig(t, follower.Kubeconfig(),
		[]string{apiAddr(t, follower.Kubeconfig()), apiAddr(t, other.Kubeconfig())}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "load"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	boundTo := map[string]string{}
	var rebinds []string
	record := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Spec.NodeName == "" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if prev, seen := boundTo[pod.Name]; seen && prev != pod.Spec.NodeName {
			rebinds = append(rebinds, fmt.Sprintf("%s: %s then %s", pod.Name, prev, pod.Spec.NodeName))
		}
		boundTo[pod.Name] = pod.Spec.NodeName
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace("load"))
	informer := factory.Core().V1().Pods().Informer()
	informer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: record, UpdateFunc: func(_, obj any) { record(obj) }})
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("informer did not sync")
	}

	const pods = 300
	create := func(from, to int) {
		var wg sync.WaitGroup
		for worker := 0; worker < 8; worker++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := from + worker; i < to; i += 8 {
					p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%03d", i)},
						Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.local/app:1"}}}}
					for ctx.Err() == nil { // retried through the election
						_, err := client.CoreV1().Pods("load").Create(ctx, p, metav1.CreateOptions{})
						if err == nil || apierrors.IsAlreadyExists(err) {
							break
						}
						time.Sleep(100 * time.Millisecond)
					}
				}
			}()
		}
		wg.Wait()
	}
	create(0, pods/2)
	c.Kill(leader) // pods are pending or being bound right now
	create(pods/2, pods)

	proctest.WaitFor(t, "every pod bound after the failover", 2*time.Minute, func() error {
		list, err := client.CoreV1().Pods("load").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		unbound := 0
		for _, p := range list.Items {
			if p.Spec.NodeName == "" {
				unbound++
			}
		}
		if len(list.Items) != pods || unbound > 0 {
			return fmt.Errorf("%d pods, %d unbound", len(list.Items), unbound)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(rebinds) > 0 {
		t.Fatalf("pods bound twice: %v", rebinds)
	}
	if len(boundTo) != pods {
		t.Fatalf("the informer saw %d of %d pods bound", len(boundTo), pods)
	}
	cancel()
}
