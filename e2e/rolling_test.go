package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skiff-dev/skiff/internal/proctest"
)

// TestRollingRestartUnderLoad restarts each of three server processes in turn (SIGTERM, start, wait until
// `skiff operator health` is healthy again, the leader last), twice, while a client writes ConfigMaps one
// after the other as an operator's retrying client would: a request that fails (connection refused, 503,
// 429, a timeout) is sent again through the next server, and a create whose outcome was unknown is
// confirmed by reading it back. No write may fail for good (60 s of retries), and every acknowledged write
// must be there at the end (issue 20's rolling restart acceptance). Then `skiff operator health` exits 0
// for the healthy cluster, and non-zero once one server is down (failure tolerance 0) and once two are (no
// quorum).
func TestRollingRestartUnderLoad(t *testing.T) {
	parallel(t)
	c := proctest.NewCluster(t, 3, fmt.Sprintf("token = %q", joinToken))
	for _, p := range c.Procs {
		c.Start(p)
	}
	c.HealthyPeers(c.Procs[0], 3)
	var clients []kubernetes.Interface
	for _, p := range c.Procs {
		proctest.WaitFor(t, p.Name+" API", 60*time.Second, func() error {
			cfg, err := clientcmd.BuildConfigFromFlags("", p.Kubeconfig())
			if err != nil {
				return err
			}
			cfg.Timeout = 5 * time.Second
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			if _, err := client.CoreV1().Namespaces().Get(context.Background(), "default", metav1.GetOptions{}); err != nil {
				return err
			}
			clients = append(clients, client)
			return nil
		})
	}

	ctx, stop := context.WithCancel(context.Background())
	var mu sync.Mutex
	var acked []string
	var failed []error
	retries := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		next := 0
		for i := 0; ctx.Err() == nil; i++ {
			name := fmt.Sprintf("load-%05d", i)
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"i": fmt.Sprint(i)}}
			deadline := time.Now().Add(60 * time.Second)
			for {
				client := clients[next%len(clients)]
				_, err := client.CoreV1().ConfigMaps("default").Create(context.Background(), cm, metav1.CreateOptions{})
				if apierrors.IsAlreadyExists(err) {
					// An earlier attempt whose answer was lost took effect: it is ours if it holds our value.
					got, getErr := client.CoreV1().ConfigMaps("default").Get(context.Background(), name, metav1.GetOptions{})
					if getErr == nil && got.Data["i"] != fmt.Sprint(i) {
						err = fmt.Errorf("%s exists with another value %v", name, got.Data)
						mu.Lock()
						failed = append(failed, err)
						mu.Unlock()
						break
					}
					err = getErr
				}
				if err == nil {
					mu.Lock()
					acked = append(acked, name)
					mu.Unlock()
					break
				}
				if time.Now().After(deadline) {
					mu.Lock()
					failed = append(failed, fmt.Errorf("%s: %w", name, err))
					mu.Unlock()
					break
				}
				mu.Lock()
				retries++
				mu.Unlock()
				next++ // the next server
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()

	for round := 1; round <= 2; round++ {
		leader := c.HealthyPeers(c.Procs[0], 3)
		var order []*proctest.Proc
		for _, p := range c.Procs {
			if p.Name != leader {
				order = append(order, p)
			}
		}
		order = append(order, c.ByName(leader))
		for _, p := range order {
			waitClusterHealthy(t, c)
			if err := c.Stop(p); err != nil {
				t.Fatalf("round %d: stopping %s: %v", round, p.Name, err)
			}
			c.Start(p)
			waitClusterHealthy(t, c)
			t.Logf("round %d: restarted %s", round, p.Name)
		}
	}
	time.Sleep(2 * time.Second) // writes after the last restart too
	stop()
	<-done

	mu.Lock()
	defer mu.Unlock()
	if len(failed) > 0 {
		t.Fatalf("%d writes failed for good (of %d): %v", len(failed), len(acked)+len(failed), errors.Join(failed...))
	}
	list, err := clients[0].CoreV1().ConfigMaps("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]bool{}
	for _, cm := range list.Items {
		stored[cm.Name] = true
	}
	var lost []string
	for _, name := range acked {
		if !stored[name] {
			lost = append(lost, name)
		}
	}
	if len(lost) > 0 {
		t.Fatalf("%d acknowledged writes lost: %v", len(lost), lost)
	}
	if len(acked) < 50 {
		t.Fatalf("only %d writes in two rolling restarts: the load did not run", len(acked))
	}
	t.Logf("%d writes acknowledged, 0 failed, 0 lost; %d attempts retried through another server", len(acked), retries)

	// `skiff operator health` as a probe: exit 0 healthy, non-zero degraded (one server down) and without a
	// quorum (two down), saying why.
	if out, err := c.Operator(c.Procs[0], "health"); err != nil || !strings.Contains(out, "healthy: true") {
		t.Fatalf("health of a healthy cluster: %v\n%s", err, out)
	}
	if err := c.Stop(c.Procs[2]); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "health to say degraded", 30*time.Second, func() error {
		out, err := c.Operator(c.Procs[0], "health")
		if err == nil || !strings.Contains(out, "failure tolerance: 0") || !strings.Contains(out, "the cluster is not healthy") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	if err := c.Stop(c.Procs[1]); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "health to fail without a quorum", 30*time.Second, func() error {
		out, err := c.Operator(c.Procs[0], "health")
		if err == nil || strings.Contains(out, "healthy: true") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	out, _ := c.Operator(c.Procs[0], "health")
	t.Logf("health without a quorum:\n%s", out)
}

// waitClusterHealthy waits until some server says the cluster is healthy (`skiff operator health` exits 0).
func waitClusterHealthy(t *testing.T, c *proctest.Cluster) {
	t.Helper()
	proctest.WaitFor(t, "the cluster healthy", 60*time.Second, func() error {
		var last error
		for _, p := range c.Procs {
			if p.PID() == 0 {
				continue
			}
			out, err := c.Operator(p, "health")
			if err == nil {
				return nil
			}
			last = fmt.Errorf("%v: %s", err, out)
		}
		return last
	})
}
