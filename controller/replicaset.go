package controller

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	kubecontroller "k8s.io/kubernetes/pkg/controller"
)

const (
	// replicaSetWorkers sync different ReplicaSets in parallel; the queue never hands one key to two.
	replicaSetWorkers = 5
	// burstReplicas caps the pods one sync creates or deletes, so a ReplicaSet scaled to 10,000 cannot
	// monopolise the API; the next sync continues once the informer has seen these.
	burstReplicas = 500
	// podDeletionCostAnnotation lets users say which pods to remove first on scale-down (lower goes first).
	podDeletionCostAnnotation = "controller.kubernetes.io/pod-deletion-cost"
	// statusUpdateRetries is how many times a status write is retried, after re-reading the ReplicaSet,
	// before the sync fails and the key goes back to the queue with back-off.
	statusUpdateRetries = 1
)

// replicaSetKind is what the controller writes in the ownerReferences of its pods.
var replicaSetKind = appsv1.SchemeGroupVersion.WithKind("ReplicaSet")

// replicaSetController keeps spec.replicas pods running for every ReplicaSet.
type replicaSetController struct {
	kube         kubernetes.Interface
	replicaSets  appslisters.ReplicaSetLister
	pods         corelisters.PodLister
	podIndex     cache.Indexer // with kube's pods-by-controller index (addSharedIndexers)
	queue        *keyQueue
	expectations *expectations
	recorder     record.EventRecorder
	logger       hclog.Logger
}

// buildReplicaSetController builds the controller that reconciles ReplicaSets as Kubernetes' ReplicaSet controller does. Informer events
// for ReplicaSets and their pods queue the ReplicaSet's key; replicaSetWorkers workers take keys from the
// queue (never one key to two workers at once), and each sync goes:
//  1. a ReplicaSet that is gone: forget what was expected of it (the garbage collector removes its pods);
//  2. claim pods: release owned pods the selector no longer matches, adopt matching orphans;
//  3. unless the informer has yet to report the creates and deletes of the last sync (expectations), or the
//     ReplicaSet is being deleted: create missing pods from the template in slow-start batches, or delete
//     the surplus, the pods least worth keeping first;
//  4. write the status (replicas, ready, available, ReplicaFailure) when it changed, and look again when a
//     ready pod will have been ready for minReadySeconds.
func buildReplicaSetController(ctx context.Context, c *Clients) (func(), error) {
	replicaSets := c.Informers.Apps().V1().ReplicaSets()
	pods := c.Informers.Core().V1().Pods()
	recorder := c.recorderFor("replicaset-controller")
	r := &replicaSetController{
		kube:         c.Kube,
		replicaSets:  replicaSets.Lister(),
		pods:         pods.Lister(),
		podIndex:     pods.Informer().GetIndexer(),
		expectations: newExpectations(),
		recorder:     recorder,
		logger:       c.Logger.Named("replicaset"),
	}
	r.queue = newKeyQueue(queueConfig{what: "replicaset", workers: replicaSetWorkers, logger: r.logger, sync: r.sync})
	replicaSets.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.enqueue(obj.(*appsv1.ReplicaSet)) },
		UpdateFunc: r.replicaSetUpdated,
		DeleteFunc: r.replicaSetDeleted,
	})
	pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    r.podAdded,
		UpdateFunc: r.podUpdated,
		DeleteFunc: r.podDeleted,
	})
	return func() { r.queue.run(ctx, c, replicaSets.Informer().HasSynced, pods.Informer().HasSynced) }, nil
}

func (r *replicaSetController) enqueue(rs *appsv1.ReplicaSet) { r.queue.add(replicaSetKey(rs)) }

// Event handlers. Their job is to queue the right ReplicaSets and to count the pod adds and deletes that
// expectations wait for.

func (r *replicaSetController) replicaSetUpdated(oldObj, newObj any) {
	old, cur := oldObj.(*appsv1.ReplicaSet), newObj.(*appsv1.ReplicaSet)
	if old.UID != cur.UID {
		// Deleted and recreated under the same name between two events: what was expected of the old one
		// must not hold the new one back.
		key, err := cache.MetaNamespaceKeyFunc(old)
		if err == nil {
			r.replicaSetDeleted(cache.DeletedFinalStateUnknown{Key: key, Obj: old})
		}
	}
	r.enqueue(cur)
}

func (r *replicaSetController) replicaSetDeleted(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	r.expectations.forget(key)
	r.queue.add(key)
}

func (r *replicaSetController) podAdded(obj any) {
	pod := obj.(*corev1.Pod)
	if pod.DeletionTimestamp != nil {
		// Seen for the first time already terminating (the informer relisted): for the owner it is gone.
		r.podDeleted(pod)
		return
	}
	if ref := metav1.GetControllerOf(pod); ref != nil {
		rs := r.owner(pod.Namespace, ref)
		if rs == nil {
			return
		}
		r.expectations.creationObserved(replicaSetKey(rs))
		r.enqueue(rs)
		return
	}
	// An orphan: every ReplicaSet that selects it may adopt it.
	for _, rs := range r.selecting(pod) {
		r.enqueue(rs)
	}
}

func (r *replicaSetController) podUpdated(oldObj, newObj any) {
	old, cur := oldObj.(*corev1.Pod), newObj.(*corev1.Pod)
	if old.ResourceVersion == cur.ResourceVersion {
		return // a resync: nothing changed
	}
	labelsChanged := !reflect.DeepEqual(old.Labels, cur.Labels)
	if cur.DeletionTimestamp != nil {
		// A graceful delete: the pod will go when its grace period ends, but it is no longer active, so its
		// owner may replace it now rather than after the grace period.
		r.podDeleted(cur)
		if labelsChanged {
			r.podDeleted(old)
		}
		return
	}
	oldRef, curRef := metav1.GetControllerOf(old), metav1.GetControllerOf(cur)
	refChanged := !reflect.DeepEqual(oldRef, curRef)
	if refChanged && oldRef != nil {
		if rs := r.owner(old.Namespace, oldRef); rs != nil {
			r.enqueue(rs) // it lost a pod
		}
	}
	if curRef != nil {
		if rs := r.owner(cur.Namespace, curRef); rs != nil {
			r.enqueue(rs)
		}
		return
	}
	if labelsChanged || refChanged {
		for _, rs := range r.selecting(cur) {
			r.enqueue(rs)
		}
	}
}

func (r *replicaSetController) podDeleted(obj any) {
	pod, ok := fromTombstone[*corev1.Pod](obj)
	if !ok {
		return
	}
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return // an orphan's delete changes no ReplicaSet
	}
	rs := r.owner(pod.Namespace, ref)
	if rs == nil {
		return
	}
	r.expectations.deletionObserved(replicaSetKey(rs), podKey(pod))
	r.enqueue(rs)
}

// owner returns the cached ReplicaSet a controller reference names, or nil when it names another kind, or a
// ReplicaSet that no longer exists or was recreated under the same name (another UID).
func (r *replicaSetController) owner(namespace string, ref *metav1.OwnerReference) *appsv1.ReplicaSet {
	rs, _ := ownerByRef(ref, replicaSetKind.Kind, r.replicaSets.ReplicaSets(namespace).Get)
	return rs
}

// selecting lists the ReplicaSets in the pod's namespace whose selector matches its labels.
func (r *replicaSetController) selecting(pod *corev1.Pod) []*appsv1.ReplicaSet {
	all, err := r.replicaSets.ReplicaSets(pod.Namespace).List(labels.Everything())
	if err != nil {
		return nil
	}
	return selectingLabels(all, func(rs *appsv1.ReplicaSet) *metav1.LabelSelector { return rs.Spec.Selector }, pod.Labels)
}

func replicaSetKey(rs *appsv1.ReplicaSet) string { return rs.Namespace + "/" + rs.Name }

func podKey(pod *corev1.Pod) string { return pod.Namespace + "/" + pod.Name }

// sync reconciles one ReplicaSet (the steps are in runReplicaSetController's comment). It returns how soon
// to look again when a pod is about to become available, or 0.
func (r *replicaSetController) sync(ctx context.Context, key string) (time.Duration, error) {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return 0, nil // not a key this controller made: nothing to retry
	}
	rs, err := r.replicaSets.ReplicaSets(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		r.expectations.forget(key)
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	// Read before the pods are listed: read after, it could count informer events that came after the
	// listing, and the sync would act on a listing that misses the pods they report.
	mayManage := r.expectations.satisfied(key, time.Now())
	selector, err := replicaSetSelector(rs)
	if err != nil {
		r.logger.Warn("replicaset not synced", "replicaset", key, "error", err)
		return 0, nil // retrying cannot help; an update of the ReplicaSet queues it again
	}
	// Its own pods and the namespace's orphans, which it may adopt, through the pods-by-controller index, as
	// Kubernetes' ReplicaSet controller reads them: a listing of the whole namespace at each sync cost a copy
	// of 3,000 pointers per sync at 30 pods per node, most of the leader's short-lived garbage at 500 nodes.
	all, err := kubecontroller.FilterPodsByOwner(r.podIndex, &rs.ObjectMeta, replicaSetKind.Kind, true)
	if err != nil {
		return 0, err
	}
	active, err := r.claimPods(ctx, rs, selector, activePods(all))
	if err != nil {
		return 0, err
	}
	terminating := ownedTerminatingPods(rs, selector, all)

	var manageErr error
	if mayManage && rs.DeletionTimestamp == nil {
		manageErr = r.manageReplicas(ctx, rs, active)
	}

	now := time.Now()
	status := replicaSetStatus(rs, active, terminating, manageErr, now)
	updated, err := r.writeStatus(ctx, rs, status)
	if err != nil {
		return 0, err
	}
	if manageErr != nil {
		return 0, manageErr
	}
	recheck := untilNextAvailable(active, updated.Spec.MinReadySeconds, now)
	if wait := r.expectations.expiresIn(key, now); !mayManage && wait > 0 && (recheck == 0 || wait < recheck) {
		recheck = wait
	}
	return recheck, nil
}

// replicaSetSelector parses the selector, and refuses one that is empty or does not match the template's
// labels. Kubernetes' API validation refuses such a ReplicaSet; acting on one would adopt every pod in the
// namespace, or create pods that the ReplicaSet releases as soon as it sees them, without end.
func replicaSetSelector(rs *appsv1.ReplicaSet) (labels.Selector, error) {
	if rs.Spec.Selector == nil {
		return nil, errors.New("spec.selector is required")
	}
	selector, err := metav1.LabelSelectorAsSelector(rs.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("invalid spec.selector: %w", err)
	}
	if selector.Empty() {
		return nil, errors.New("spec.selector is empty: it would select every pod")
	}
	if !selector.Matches(labels.Set(rs.Spec.Template.Labels)) {
		return nil, errors.New("spec.selector does not match the template's labels")
	}
	return selector, nil
}

// activePods drops pods that have finished or are being deleted: they do not count towards replicas.
func activePods(pods []*corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, pod := range pods {
		if isPodActive(pod) {
			out = append(out, pod)
		}
	}
	return out
}

func isPodActive(pod *corev1.Pod) bool {
	return pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed && pod.DeletionTimestamp == nil
}

// ownedTerminatingPods are the ReplicaSet's pods that are being deleted but still run, for
// status.terminatingReplicas.
func ownedTerminatingPods(rs *appsv1.ReplicaSet, selector labels.Selector, pods []*corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, pod := range pods {
		if pod.DeletionTimestamp == nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		if ref := metav1.GetControllerOfNoCopy(pod); ref != nil && ref.UID == rs.UID && selector.Matches(labels.Set(pod.Labels)) {
			out = append(out, pod)
		}
	}
	return out
}

// claimPods returns the pods that belong to the ReplicaSet, adopting and releasing on the way (see claim).
func (r *replicaSetController) claimPods(ctx context.Context, rs *appsv1.ReplicaSet, selector labels.Selector, pods []*corev1.Pod) ([]*corev1.Pod, error) {
	return claim(ctx, &claimer{
		owner: rs, ownerKind: replicaSetKind, selector: selector, dependentKind: "Pod",
		liveOwner: func(ctx context.Context) (metav1.Object, error) {
			return r.kube.AppsV1().ReplicaSets(rs.Namespace).Get(ctx, rs.Name, metav1.GetOptions{})
		},
		patch: func(ctx context.Context, namespace, name string, patch []byte) error {
			_, err := r.kube.CoreV1().Pods(namespace).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
			return err
		},
	}, pods)
}

// manageReplicas creates or deletes pods to bring the active ones to spec.replicas, at most burstReplicas
// at a time, and raises expectations first so that no sync acts again before the informer has seen the
// result: acting on a cache that lags would create (or delete) the same pods twice.
func (r *replicaSetController) manageReplicas(ctx context.Context, rs *appsv1.ReplicaSet, active []*corev1.Pod) error {
	key := replicaSetKey(rs)
	diff := len(active) - int(desiredReplicas(rs))
	switch {
	case diff < 0:
		want := min(-diff, burstReplicas)
		r.expectations.expectCreations(key, want)
		created, err := slowStartBatch(want, 1, func() error { return r.createPod(ctx, rs) })
		// Creates never attempted, or refused, will never be seen by the informer.
		for range want - created {
			r.expectations.creationObserved(key)
		}
		return err
	case diff > 0:
		surplus := min(diff, burstReplicas)
		victims := podsToDelete(active, r.relatedPods(rs), surplus, time.Now())
		keys := make([]string, len(victims))
		for i, pod := range victims {
			keys[i] = podKey(pod)
		}
		r.expectations.expectDeletions(key, keys)
		errs := make(chan error, len(victims))
		var wg sync.WaitGroup
		for _, pod := range victims {
			wg.Go(func() {
				err := r.deletePod(ctx, rs, pod)
				if err == nil {
					// The informer may have reported the pod terminating (or gone) before the expectation
					// was raised; then no further event of it need come.
					if cached, lerr := r.pods.Pods(pod.Namespace).Get(pod.Name); lerr != nil || cached.UID != pod.UID || cached.DeletionTimestamp != nil {
						r.expectations.deletionObserved(key, podKey(pod))
					}
					return
				}
				// The informer will not report this delete: it failed, or the pod was gone before it (and
				// its delete event may have come before the expectation was raised).
				r.expectations.deletionObserved(key, podKey(pod))
				if !apierrors.IsNotFound(err) {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		return <-errs // the first error, or nil
	}
	return nil
}

func desiredReplicas(rs *appsv1.ReplicaSet) int32 {
	if rs.Spec.Replicas == nil {
		return 1
	}
	return *rs.Spec.Replicas
}

// createPod creates one pod from the template and records the outcome as an event on the ReplicaSet.
func (r *replicaSetController) createPod(ctx context.Context, rs *appsv1.ReplicaSet) error {
	pod := podFromTemplate(rs)
	if len(pod.Labels) == 0 {
		return errors.New("unable to create pods, no labels")
	}
	created, err := r.kube.CoreV1().Pods(rs.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		// Every create will fail until the namespace is gone; that is no failure of the ReplicaSet's.
		r.expectations.creationObserved(replicaSetKey(rs))
		return nil
	}
	if err != nil {
		r.recorder.Eventf(rs, corev1.EventTypeWarning, "FailedCreate", "Error creating: %v", err)
		return err
	}
	r.recorder.Eventf(rs, corev1.EventTypeNormal, "SuccessfulCreate", "Created pod: %v", created.Name)
	return nil
}

// podFromTemplate is the pod the ReplicaSet creates: its template, named after it, controlled by it.
func podFromTemplate(rs *appsv1.ReplicaSet) *corev1.Pod {
	template := rs.Spec.Template.DeepCopy()
	// The dash makes the names readable ("web-7xk2p"). The API server shortens a long prefix to make room
	// for the random suffix; Kubernetes drops the dash only when the prefix would not be valid with it.
	prefix := rs.Name + "-"
	if len(apimachineryvalidation.NameIsDNSSubdomain(prefix, true)) != 0 {
		prefix = rs.Name
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName:    prefix,
			Namespace:       rs.Namespace,
			Labels:          template.Labels,
			Annotations:     template.Annotations,
			Finalizers:      template.Finalizers,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rs, replicaSetKind)},
		},
		Spec: template.Spec,
	}
}

// deletePod deletes one pod and records the outcome. A pod already gone (NotFound, returned as is) is no
// failure: it is what was wanted.
func (r *replicaSetController) deletePod(ctx context.Context, rs *appsv1.ReplicaSet, pod *corev1.Pod) error {
	err := r.kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return err
	}
	if err != nil {
		r.recorder.Eventf(rs, corev1.EventTypeWarning, "FailedDelete", "Error deleting: %v", err)
		return fmt.Errorf("unable to delete pods: %w", err)
	}
	r.recorder.Eventf(rs, corev1.EventTypeNormal, "SuccessfulDelete", "Deleted pod: %v", pod.Name)
	return nil
}

// relatedPods are the pods of every ReplicaSet that shares this one's controller (a Deployment's old and
// new ReplicaSets), so that scale-down can prefer nodes where that controller has doubled up.
func (r *replicaSetController) relatedPods(rs *appsv1.ReplicaSet) []*corev1.Pod {
	ref := metav1.GetControllerOfNoCopy(rs)
	if ref == nil {
		return nil
	}
	siblings, err := r.replicaSets.ReplicaSets(rs.Namespace).List(labels.Everything())
	if err != nil {
		return nil
	}
	seen := map[types.UID]bool{}
	var out []*corev1.Pod
	for _, sibling := range siblings {
		if sref := metav1.GetControllerOfNoCopy(sibling); sref == nil || sref.UID != ref.UID {
			continue
		}
		selector, err := metav1.LabelSelectorAsSelector(sibling.Spec.Selector)
		if err != nil {
			continue
		}
		pods, err := r.pods.Pods(sibling.Namespace).List(selector)
		if err != nil {
			continue
		}
		for _, pod := range pods {
			if !seen[pod.UID] {
				seen[pod.UID] = true
				out = append(out, pod)
			}
		}
	}
	return out
}

// slowStartBatch calls fn count times, in batches that start at initial and double while every call
// succeeds; it stops after the first batch with a failure and returns the successes and an error. A
// template the API refuses thus costs one failed request, not hundreds, while a good one is created
// quickly. Calls within a batch run concurrently.
func slowStartBatch(count, initial int, fn func() error) (int, error) {
	remaining, successes := count, 0
	for batch := min(remaining, initial); batch > 0; batch = min(2*batch, remaining) {
		errs := make(chan error, batch)
		var wg sync.WaitGroup
		for range batch {
			wg.Go(func() {
				if err := fn(); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		successes += batch - len(errs)
		if len(errs) > 0 {
			return successes, <-errs
		}
		remaining -= batch
	}
	return successes, nil
}

// untilNextAvailable is how long until the first ready pod that is not yet available becomes so; 0 when
// none is waiting. No event marks that moment, so the controller must look again by itself.
func untilNextAvailable(active []*corev1.Pod, minReadySeconds int32, now time.Time) time.Duration {
	if minReadySeconds == 0 {
		return 0
	}
	var next time.Duration
	for _, pod := range active {
		if !isPodReady(pod) || isPodAvailable(pod, minReadySeconds, now) {
			continue
		}
		since := readySince(pod)
		if since.IsZero() {
			continue // never becomes available by the clock
		}
		// Availability is "strictly after", so look a little past the instant.
		wait := since.Add(time.Duration(minReadySeconds)*time.Second).Sub(now) + 100*time.Millisecond
		if next == 0 || wait < next {
			next = wait
		}
	}
	return next
}

// replicaSetStatus computes the status from the active pods the ReplicaSet owned when the sync began (what
// it creates or deletes shows in the next sync) and the outcome of managing them.
func replicaSetStatus(rs *appsv1.ReplicaSet, active, terminating []*corev1.Pod, manageErr error, now time.Time) appsv1.ReplicaSetStatus {
	status := *rs.Status.DeepCopy()
	templateLabels := labels.SelectorFromSet(rs.Spec.Template.Labels)
	var fullyLabeled, ready, available int32
	for _, pod := range active {
		if templateLabels.Matches(labels.Set(pod.Labels)) {
			fullyLabeled++
		}
		if isPodReady(pod) {
			ready++
			if isPodAvailable(pod, rs.Spec.MinReadySeconds, now) {
				available++
			}
		}
	}
	failure := replicaFailureIndex(status.Conditions)
	switch {
	case manageErr != nil && failure < 0:
		reason := ""
		if diff := len(active) - int(desiredReplicas(rs)); diff < 0 {
			reason = "FailedCreate"
		} else if diff > 0 {
			reason = "FailedDelete"
		}
		status.Conditions = append(status.Conditions, appsv1.ReplicaSetCondition{
			Type: appsv1.ReplicaSetReplicaFailure, Status: corev1.ConditionTrue, Reason: reason,
			Message: manageErr.Error(), LastTransitionTime: metav1.NewTime(now),
		})
	case manageErr == nil && failure >= 0:
		status.Conditions = append(status.Conditions[:failure], status.Conditions[failure+1:]...)
		if len(status.Conditions) == 0 {
			status.Conditions = nil
		}
	}
	terminatingCount := int32(len(terminating))
	status.Replicas = int32(len(active))
	status.FullyLabeledReplicas = fullyLabeled
	status.ReadyReplicas = ready
	status.AvailableReplicas = available
	status.TerminatingReplicas = &terminatingCount
	return status
}

func replicaFailureIndex(conditions []appsv1.ReplicaSetCondition) int {
	for i, c := range conditions {
		if c.Type == appsv1.ReplicaSetReplicaFailure {
			return i
		}
	}
	return -1
}

// writeStatus writes the status when it differs from the stored one, with observedGeneration set to the
// generation it was computed for. A write that fails (a conflict, mostly) is retried once on a fresh read.
func (r *replicaSetController) writeStatus(ctx context.Context, rs *appsv1.ReplicaSet, status appsv1.ReplicaSetStatus) (*appsv1.ReplicaSet, error) {
	status.ObservedGeneration = rs.Generation
	if apiequality.Semantic.DeepEqual(rs.Status, status) {
		return rs, nil
	}
	client := r.kube.AppsV1().ReplicaSets(rs.Namespace)
	next := rs.DeepCopy()
	for attempt := 0; ; attempt++ {
		next.Status = status
		updated, err := client.UpdateStatus(ctx, next, metav1.UpdateOptions{})
		if err == nil {
			return updated, nil
		}
		if attempt >= statusUpdateRetries {
			return nil, err
		}
		if next, err = client.Get(ctx, rs.Name, metav1.GetOptions{}); err != nil {
			return nil, err
		}
	}
}
