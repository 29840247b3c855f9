package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/endpointslice"
	endpointsliceutil "k8s.io/endpointslice/util"
	"k8s.io/klog/v2"
)

const (
	// endpointSliceControllerName is the managed-by label value of the slices this controller writes, the
	// value Kubernetes uses, so that kube-proxy-like consumers and kubectl treat them as controller-made.
	endpointSliceControllerName = "endpointslice-controller.k8s.io"
	// maxEndpointsPerSlice is Kubernetes' default: a change to one endpoint rewrites one slice of at most 100,
	// not the Service's whole list.
	maxEndpointsPerSlice = 100
	// endpointWorkers sync different Services in parallel (per controller); the queue never hands one key
	// to two.
	endpointWorkers = 5
	// serviceSyncInterval is the least time between two syncs of one Service caused by pod churn. A quiet
	// Service syncs at once; while its pods change quickly (a rollout, a scale-up), the changes that arrive
	// within a second of a sync are batched into the next one, a second after it. Changes that take an
	// endpoint out of service (deletion begun, readiness lost, pod gone) are never held back: traffic should
	// stop reaching a pod before its SIGTERM does.
	serviceSyncInterval = time.Second
	// endpointSliceChangeDelay is how long after a change to one of its slices by someone else (an edit, a
	// delete) the Service is synced, so that a burst of such changes costs one sync.
	endpointSliceChangeDelay = time.Second
)

// errStaleSlices means the informer has not yet seen the controller's own last writes to a Service's slices;
// reconciling from that cache would undo or duplicate them, so the sync is retried once it catches up.
var errStaleSlices = errors.New("EndpointSlice informer cache is out of date")

// endpointSliceController writes the EndpointSlices of every Service with a selector, as Kubernetes'
// EndpointSlice controller does. What goes into the slices (conditions, ports, topology, the split into
// slices of at most 100) is the k8s.io/endpointslice reconciler's; this file is the loop around it.
type endpointSliceController struct {
	kube         kubernetes.Interface
	services     corelisters.ServiceLister
	pods         corelisters.PodLister
	slices       discoverylisters.EndpointSliceLister
	reconciler   *endpointslice.Reconciler
	tracker      *endpointsliceutil.EndpointSliceTracker
	triggerTimes *endpointsliceutil.TriggerTimeTracker
	queue        *serviceQueue
	recorder     record.EventRecorder
	logger       hclog.Logger
}

// buildEndpointSliceController builds the controller that reconciles the EndpointSlices of Services. Service events queue the Service
// at once; pod events queue the Services that select the pod (old labels and new), paced by
// serviceSyncInterval; changes to managed slices that the controller did not make itself queue their
// Service after endpointSliceChangeDelay. Each sync of a Service goes:
//  1. a Service that is gone, or has no selector, or is an ExternalName: delete the slices this controller
//     manages for it (a user's slices for a selectorless Service are never touched);
//  2. list the selected pods and the Service's managed slices from the informers; if the informer has not
//     seen this controller's own last writes (the tracker says so), retry later rather than act on it;
//  3. let the reconciler create, update and delete slices; on failure, record FailedToUpdateEndpointSlices
//     on the Service and retry with backoff.
func buildEndpointSliceController(ctx context.Context, c *Clients) (func(), error) {
	e, synced := newEndpointSliceController(c)
	return func() { e.queue.runWhenSynced(ctx, c, synced, e.logger, e.sync) }, nil
}

// newEndpointSliceController builds the controller and registers its informer handlers; it returns what
// must have synced before the first sync.
func newEndpointSliceController(c *Clients) (*endpointSliceController, []cache.InformerSynced) {
	services := c.Informers.Core().V1().Services()
	pods := c.Informers.Core().V1().Pods()
	nodes := c.Informers.Core().V1().Nodes()
	slices := c.Informers.Discovery().V1().EndpointSlices()
	recorder := c.recorderFor("endpointslice-controller")
	tracker := endpointsliceutil.NewEndpointSliceTracker()
	e := &endpointSliceController{
		kube:     c.Kube,
		services: services.Lister(),
		pods:     pods.Lister(),
		slices:   slices.Lister(),
		// No topology cache: hints from the deprecated topology-aware-hints annotation are not offered;
		// trafficDistribution (PreferClose) hints are, since the reconciler handles those without it.
		reconciler:   endpointslice.NewReconciler(c.Kube, nodes.Lister(), maxEndpointsPerSlice, tracker, nil, recorder, endpointSliceControllerName),
		tracker:      tracker,
		triggerTimes: endpointsliceutil.NewTriggerTimeTracker(),
		queue:        newServiceQueue(serviceSyncInterval),
		recorder:     recorder,
		logger:       c.Logger.Named("endpointslice"),
	}
	services.Informer().AddEventHandler(serviceEventHandler(e.queue))
	pods.Informer().AddEventHandler(podEventHandler(e.services, e.queue))
	slices.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    e.sliceAdded,
		UpdateFunc: e.sliceUpdated,
		DeleteFunc: e.sliceDeleted,
	})
	return e, []cache.InformerSynced{services.Informer().HasSynced, pods.Informer().HasSynced,
		nodes.Informer().HasSynced, slices.Informer().HasSynced}
}

func (e *endpointSliceController) sliceAdded(obj any) {
	slice := obj.(*discoveryv1.EndpointSlice)
	if e.reconciler.ManagedByController(slice) && e.tracker.ShouldSync(slice) {
		e.queueForSlice(slice)
	}
}

func (e *endpointSliceController) sliceUpdated(oldObj, newObj any) {
	old, cur := oldObj.(*discoveryv1.EndpointSlice), newObj.(*discoveryv1.EndpointSlice)
	// A label change does not bump the generation, so the tracker cannot see it; a slice moved to another
	// Service concerns both.
	if old.Labels[discoveryv1.LabelServiceName] != cur.Labels[discoveryv1.LabelServiceName] {
		e.queueForSlice(old)
		e.queueForSlice(cur)
		return
	}
	if e.reconciler.ManagedByChanged(old, cur) || (e.reconciler.ManagedByController(cur) && e.tracker.ShouldSync(cur)) {
		e.queueForSlice(cur)
	}
}

func (e *endpointSliceController) sliceDeleted(obj any) {
	slice, ok := fromTombstone[*discoveryv1.EndpointSlice](obj)
	if !ok {
		return
	}
	// A delete the controller made itself was expected; any other one (a user's) must be repaired.
	if e.reconciler.ManagedByController(slice) && e.tracker.Has(slice) && !e.tracker.HandleDeletion(slice) {
		e.queueForSlice(slice)
	}
}

func (e *endpointSliceController) queueForSlice(slice *discoveryv1.EndpointSlice) {
	key, err := endpointslice.ServiceControllerKey(slice)
	if err != nil {
		return // no service-name label: not a Service's slice
	}
	e.queue.addAfter(key, endpointSliceChangeDelay)
}

// sync reconciles one Service's slices (the steps are in runEndpointSliceController's comment).
func (e *endpointSliceController) sync(ctx context.Context, key string) error {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil // not a key this controller made: nothing to retry
	}
	svc, err := e.services.Services(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		e.reconciler.DeleteService(namespace, name)
		e.triggerTimes.DeleteService(namespace, name)
		if err := e.deleteManagedSlices(ctx, namespace, name, nil); err != nil {
			return err
		}
		e.tracker.DeleteService(namespace, name)
		e.queue.forget(key)
		return nil
	}
	if err != nil {
		return err
	}
	if !selectsPods(svc) {
		return e.deleteManagedSlices(ctx, namespace, name, svc)
	}
	pods, err := e.pods.Pods(namespace).List(labels.Set(svc.Spec.Selector).AsSelectorPreValidated())
	if err != nil {
		return err
	}
	all, err := e.slices.EndpointSlices(namespace).List(managedSliceSelector(name))
	if err != nil {
		return err
	}
	var slices []*discoveryv1.EndpointSlice
	for _, slice := range all {
		if slice.DeletionTimestamp == nil { // on its way out: nothing to reconcile into it
			slices = append(slices, slice)
		}
	}
	if e.tracker.StaleSlices(svc, slices) {
		return errStaleSlices
	}
	trigger := e.triggerTimes.ComputeEndpointLastChangeTriggerTime(namespace, svc, pods)
	logger := klog.Background().WithName("endpointslice")
	if err := e.reconciler.Reconcile(logger, svc, pods, slices, trigger); err != nil {
		e.recorder.Eventf(svc, corev1.EventTypeWarning, "FailedToUpdateEndpointSlices",
			"Error updating Endpoint Slices for Service %s/%s: %v", namespace, name, err)
		return err
	}
	return nil
}

// selectsPods reports whether the controllers derive the Service's endpoints from pods. A Service without a
// selector (its endpoints are written by hand) or with an empty one, and an ExternalName Service (a DNS
// alias, with no endpoints), get none. An empty selector is treated as none, as Kubernetes ends up treating
// it: rather than every pod of the namespace.
func selectsPods(svc *corev1.Service) bool {
	return len(svc.Spec.Selector) > 0 && svc.Spec.Type != corev1.ServiceTypeExternalName
}

// managedSliceSelector selects the slices this controller manages for the named Service.
func managedSliceSelector(service string) labels.Selector {
	return labels.Set{discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: endpointSliceControllerName}.AsSelectorPreValidated()
}

// deleteManagedSlices deletes the slices this controller wrote for a Service that is gone (svc nil) or no
// longer selects pods. For a deleted Service the garbage collector would remove them too (they are owned by
// it), but only after its own informers catch up; doing it here stops stale endpoints from being served
// meanwhile. Each delete carries the slice's UID, so a slice recreated under the same name is not removed.
func (e *endpointSliceController) deleteManagedSlices(ctx context.Context, namespace, name string, svc *corev1.Service) error {
	slices, err := e.slices.EndpointSlices(namespace).List(managedSliceSelector(name))
	if err != nil {
		return err
	}
	var errs []error
	for _, slice := range slices {
		if slice.DeletionTimestamp != nil {
			continue
		}
		err := e.kube.DiscoveryV1().EndpointSlices(namespace).Delete(ctx, slice.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &slice.UID},
		})
		switch {
		case err == nil:
			e.tracker.ExpectDeletion(slice)
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			// already gone, or replaced: the informer will tell
		default:
			errs = append(errs, fmt.Errorf("deleting EndpointSlice %s: %w", slice.Name, err))
		}
	}
	if len(errs) > 0 {
		err := errors.Join(errs...)
		if svc != nil {
			e.recorder.Eventf(svc, corev1.EventTypeWarning, "FailedToUpdateEndpointSlices",
				"Error updating Endpoint Slices for Service %s/%s: %v", namespace, name, err)
		}
		return err
	}
	return nil
}

// Event handlers that both endpoint controllers (EndpointSlices and Endpoints) share: both are keyed by
// Service and derive their objects from the same pods.

// serviceEventHandler queues a Service at once on any change: its selector, ports or type may have changed,
// and a deleted Service's objects must go.
func serviceEventHandler(q *serviceQueue) cache.ResourceEventHandler {
	add := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			q.add(key)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    add,
		UpdateFunc: func(_, obj any) { add(obj) },
		DeleteFunc: add,
	}
}

// podEventHandler queues the Services a pod change concerns: those selecting the pod, before and after a
// label change. Which changes matter (readiness, IPs, deletion, labels, hostname) is the endpointslice
// library's judgement, the one Kubernetes' controllers use. A change of who serves (an endpoint leaving
// service, or a pod turning Ready) is queued at once; any other (a new pod that is not ready yet, its IP, a
// label) is paced by the queue's interval.
func podEventHandler(services corelisters.ServiceLister, q *serviceQueue) cache.ResourceEventHandler {
	queue := func(oldObj, newObj any, urgent bool) {
		keys, err := endpointsliceutil.GetServicesToUpdate(services, endpointsliceutil.GetPodUpdateProjectionKey(oldObj, newObj))
		if err != nil {
			return // the lister cannot fail; nothing better to do
		}
		for key := range keys {
			if urgent {
				q.add(key)
			} else {
				q.addPaced(key)
			}
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			// A pod first seen already terminating (a relist) takes its endpoint out of service.
			pod, ok := obj.(*corev1.Pod)
			queue(nil, obj, ok && pod.DeletionTimestamp != nil)
		},
		UpdateFunc: func(oldObj, newObj any) { queue(oldObj, newObj, changesServing(oldObj, newObj)) },
		DeleteFunc: func(obj any) { queue(obj, nil, true) },
	}
}

// changesServing reports whether a pod update changes whether its endpoint serves: its deletion began (the
// endpoint turns terminating and stops being ready), its readiness changed either way, or it finished.
// Traffic must stop at once in the first cases; a Ready pod is capacity a rollout waits for.
func changesServing(oldObj, newObj any) bool {
	old, ok := oldObj.(*corev1.Pod)
	if !ok {
		return false
	}
	cur, ok := newObj.(*corev1.Pod)
	if !ok {
		return false
	}
	finished := func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	}
	return (old.DeletionTimestamp == nil && cur.DeletionTimestamp != nil) ||
		endpointsliceutil.IsPodReady(old) != endpointsliceutil.IsPodReady(cur) ||
		(!finished(old) && finished(cur))
}

// serviceQueue is the work queue of both endpoint controllers: keys are Services ("namespace/name"), a
// failed sync is retried with per-Service exponential backoff (1 s doubling to 100 s, and 10 retries a
// second overall, as Kubernetes' endpoint controllers start from), a sync that failed only because an
// informer had not caught up with the controller's own writes (a stale cache, a conflict) from 50 ms, and
// addPaced keeps a Service from syncing more than once per interval because of pod churn.
type serviceQueue struct {
	*keyQueue
	now func() time.Time

	mu       sync.Mutex
	interval time.Duration
	lastSync map[string]time.Time // when each Service's latest sync began
}

func newServiceQueue(interval time.Duration) *serviceQueue {
	return &serviceQueue{
		keyQueue: newKeyQueue(queueConfig{
			what: "service", workers: endpointWorkers,
			failures: workqueue.NewTypedMaxOfRateLimiter(
				workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 100*time.Second),
				&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
			),
			behind:     func(err error) bool { return apierrors.IsAlreadyExists(err) || errors.Is(err, errStaleSlices) },
			behindBase: 50 * time.Millisecond,
		}),
		interval: interval,
		now:      time.Now,
		lastSync: map[string]time.Time{},
	}
}

// addPaced queues a Service to sync at once if its last sync began at least interval ago, or else when
// interval has passed since then; the delayed key is queued once however many changes ask for it.
func (q *serviceQueue) addPaced(key string) {
	q.mu.Lock()
	last, ok := q.lastSync[key]
	interval := q.interval
	q.mu.Unlock()
	if wait := last.Add(interval).Sub(q.now()); ok && wait > 0 {
		q.addAfter(key, wait)
		return
	}
	q.add(key)
}

// forget drops what the queue remembers of a Service that is gone.
func (q *serviceQueue) forget(key string) {
	q.mu.Lock()
	delete(q.lastSync, key)
	q.mu.Unlock()
	q.keyQueue.forget(key)
}

// setSync makes syncKey the queue's sync, noting when each Service's sync begins (for addPaced).
func (q *serviceQueue) setSync(logger hclog.Logger, syncKey func(context.Context, string) error) {
	q.cfg.logger = logger
	q.cfg.sync = func(ctx context.Context, key string) (time.Duration, error) {
		q.mu.Lock()
		q.lastSync[key] = q.now()
		q.mu.Unlock()
		return 0, syncKey(ctx, key)
	}
}

// runWhenSynced syncs the queue's Services with syncKey until ctx ends, once the informers in synced have
// synced; then it shuts the queue down.
func (q *serviceQueue) runWhenSynced(ctx context.Context, c *Clients, synced []cache.InformerSynced, logger hclog.Logger, syncKey func(context.Context, string) error) {
	q.setSync(logger, syncKey)
	q.run(ctx, c, synced...)
}
