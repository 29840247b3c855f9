package controller

import (
	"sync"

	coreinformers "k8s.io/client-go/informers/core/v1"
	policyinformers "k8s.io/client-go/informers/policy/v1"
	"k8s.io/client-go/tools/cache"
)

// Kubernetes' controller constructors register their informers' event handlers before they set the listers
// those handlers use (the disruption controller's pod handler reads its PodDisruptionBudget lister, set a few
// lines later). kube-controller-manager builds every controller before it starts the informers, so no event
// arrives in between; here the manager starts the shared factory while the controllers are being built, and
// an informer already running delivers its objects to a new handler at once, on another goroutine: a nil
// lister, a panic. A deferredInformer holds the handlers a constructor registers until register, called once
// the constructor has returned.
type deferredInformer struct {
	cache.SharedIndexInformer
	mu      sync.Mutex
	pending []cache.ResourceEventHandler
}

func deferHandlers(inf cache.SharedIndexInformer) *deferredInformer {
	return &deferredInformer{SharedIndexInformer: inf}
}

// AddEventHandler keeps h for register. Its registration is nil: the constructors deferred this way ignore it.
func (d *deferredInformer) AddEventHandler(h cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pending = append(d.pending, h)
	return nil, nil
}

// register adds the kept handlers to the informer.
func (d *deferredInformer) register() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, h := range d.pending {
		if _, err := d.SharedIndexInformer.AddEventHandler(h); err != nil {
			return err
		}
	}
	d.pending = nil
	return nil
}

// deferredPods and deferredPDBs are typed informers whose Informer defers handlers (listers are the real ones).
type deferredPods struct {
	coreinformers.PodInformer
	inf *deferredInformer
}

func (p deferredPods) Informer() cache.SharedIndexInformer { return p.inf }

type deferredPDBs struct {
	policyinformers.PodDisruptionBudgetInformer
	inf *deferredInformer
}

func (p deferredPDBs) Informer() cache.SharedIndexInformer { return p.inf }
