package controller

import (
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// TestDeferredHandlers: a handler registered through a deferredInformer on a running, synced informer sees
// nothing until register, and then the informer's objects: what keeps a kube controller's handlers from
// running before its constructor has set the listers they use.
func TestDeferredHandlers(t *testing.T) {
	client := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}})
	f := informers.NewSharedInformerFactory(client, 0)
	real := f.Core().V1().Pods().Informer()
	stop := make(chan struct{})
	defer close(stop)
	f.Start(stop)
	if !cache.WaitForCacheSync(stop, real.HasSynced) {
		t.Fatal("pods never synced")
	}

	var adds atomic.Int32
	d := deferHandlers(real)
	pods := deferredPods{f.Core().V1().Pods(), d}
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) { adds.Add(1) }}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // a running informer delivers to a registered handler within this
	if n := adds.Load(); n != 0 {
		t.Fatalf("%d adds before register", n)
	}
	if err := d.register(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for adds.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := adds.Load(); n != 1 {
		t.Fatalf("%d adds after register; want the pod's 1", n)
	}
	if _, err := pods.Lister().Pods("default").Get("p"); err != nil {
		t.Errorf("the lister is the informer's: %v", err)
	}
}
