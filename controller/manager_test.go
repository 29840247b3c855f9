package controller

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// TestControllersBuiltBeforeInformersStart: no informer delivers an event while any controller is still
// being built (Kubernetes' constructors register handlers before they set the listers those handlers read),
// and every controller built runs once the informers have started.
func TestControllersBuiltBeforeInformersStart(t *testing.T) {
	kube := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}})
	c := &Clients{Kube: kube, Informers: informers.NewSharedInformerFactory(kube, 0), Logger: hclog.NewNullLogger()}
	// The manager asks for the pod informer before any controller is built (addSharedIndexers).
	c.Informers.Core().V1().Pods().Informer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var adds, ran atomic.Int32
	var addsDuringBuild int32 = -1
	table := []controllerEntry{
		{"first", "first", func(ctx context.Context, c *Clients) (func(), error) {
			pods := c.Informers.Core().V1().Pods().Informer()
			if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) { adds.Add(1) }}); err != nil {
				return nil, err
			}
			return func() { ran.Add(1) }, nil
		}},
		{"off", "off", func(context.Context, *Clients) (func(), error) { return nil, nil }},
		{"second", "second", func(ctx context.Context, c *Clients) (func(), error) {
			// A running informer would have delivered the pod to the first controller's handler by now.
			time.Sleep(200 * time.Millisecond)
			addsDuringBuild = adds.Load()
			return func() {
				if !cache.WaitForCacheSync(ctx.Done(), c.Informers.Core().V1().Pods().Informer().HasSynced) {
					return
				}
				ran.Add(1)
			}, nil
		}},
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runControllers(ctx, c, table)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for (ran.Load() != 2 || adds.Load() != 1) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if addsDuringBuild != 0 {
		t.Errorf("%d pod events reached a handler while controllers were still being built", addsDuringBuild)
	}
	if n := ran.Load(); n != 2 {
		t.Errorf("%d controllers ran; want the 2 built ones", n)
	}
	if n := adds.Load(); n != 1 {
		t.Errorf("%d pod adds after the informers started; want 1", n)
	}
}
