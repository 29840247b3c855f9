package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skiff-dev/skiff/internal/proctest"
)

// failoverConfig returns a client config that dials the given API addresses in order, moving on when one
// refuses: a client-side list of servers. Every peer's certificate names "kubernetes", so one server name
// verifies them all.
func failoverConfig(t *testing.T, kubeconfig string, addrs []string) *rest.Config {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.TLSClientConfig.ServerName = "kubernetes"
	dialer := &net.Dialer{Timeout: 2 * time.Second}
	cfg.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
		var last error
		for _, a := range addrs {
			conn, err := dialer.DialContext(ctx, network, a)
			if err == nil {
				return conn, nil
			}
			last = err
		}
		return nil, last
	}
	cfg.Timeout = 10 * time.Second
	return cfg
}

func apiAddr(t *testing.T, kubeconfig string) string {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(cfg.Host, "https://")
}

// An informer watches pods through one peer; that peer is killed with kill -9 while writes continue through
// another; the informer reconnects to a surviving server and ends with exactly the pods the cluster holds,
// having missed no delete.
func TestInformerSurvivesKilledPeer(t *testing.T) {
	parallel(t)
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
	watched, writer := c.Procs[0], c.Procs[1]
	var addrs []string
	for _, p := range c.Procs {
		addrs = append(addrs, apiAddr(t, p.Kubeconfig()))
	}
	informerClient := kubernetes.NewForConfigOrDie(failoverConfig(t, watched.Kubeconfig(), addrs))
	writeClient := kubernetes.NewForConfigOrDie(failoverConfig(t, writer.Kubeconfig(), append([]string{addrs[1]}, addrs[2], addrs[0])))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	proctest.WaitFor(t, "namespace", 60*time.Second, func() error {
		_, err := writeClient.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "inf"}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	})

	factory := informers.NewSharedInformerFactoryWithOptions(informerClient, 0, informers.WithNamespace("inf"))
	podInformer := factory.Core().V1().Pods().Informer()
	var mu sync.Mutex
	deletesSeen, addsSeen := map[string]bool{}, map[string]bool{}
	podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj interface{}) {
		mu.Lock()
		addsSeen[obj.(*corev1.Pod).Name] = true
		mu.Unlock()
	}, DeleteFunc: func(obj interface{}) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if pod, ok := obj.(*corev1.Pod); ok {
			mu.Lock()
			deletesSeen[pod.Name] = true
			mu.Unlock()
		}
	}})
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	if !cache.WaitForCacheSync(ctx.Done(), podInformer.HasSynced) {
		t.Fatal("informer did not sync")
	}

	// Writes through the writer peer: create pods, delete every third one. Retries cover the election.
	retry := func(what string, f func() error) {
		for {
			err := f()
			if err == nil || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err) {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	var deleted []string
	for i := 0; i < 60; i++ {
		if i == 20 {
			c.Kill(watched) // kill -9 the peer the informer watches through
		}
		name := fmt.Sprintf("p-%03d", i)
		retry("create "+name, func() error {
			_, err := writeClient.CoreV1().Pods("inf").Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:1.36"}}},
			}, metav1.CreateOptions{})
			return err
		})
		if i%3 == 2 {
			victim := fmt.Sprintf("p-%03d", i-1)
			retry("delete "+victim, func() error {
				return writeClient.CoreV1().Pods("inf").Delete(ctx, victim, metav1.DeleteOptions{})
			})
			deleted = append(deleted, victim)
		}
	}

	var want []string
	proctest.WaitFor(t, "informer to match the cluster", 60*time.Second, func() error {
		list, err := writeClient.CoreV1().Pods("inf").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		want = want[:0]
		for _, p := range list.Items {
			want = append(want, p.Name+"@"+p.ResourceVersion)
		}
		var got []string
		for _, o := range podInformer.GetStore().List() {
			p := o.(*corev1.Pod)
			got = append(got, p.Name+"@"+p.ResourceVersion)
		}
		sort.Strings(want)
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(want, ",") {
			return fmt.Errorf("informer has %d pods, cluster %d", len(got), len(want))
		}
		return nil
	})
	if len(want) != 60-len(deleted) {
		t.Fatalf("cluster holds %d pods, want %d", len(want), 60-len(deleted))
	}
	mu.Lock()
	defer mu.Unlock()
	// A pod created and deleted while the informer was reconnecting is never seen at all; every pod it saw
	// and the cluster deleted must have been delivered as a delete.
	for _, name := range deleted {
		if addsSeen[name] && !deletesSeen[name] {
			t.Errorf("the informer never delivered the delete of %s", name)
		}
	}
}
