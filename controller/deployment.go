package controller

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/hashicorp/go-hclog"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// deploymentWorkers sync different Deployments in parallel; the queue never hands one key to two.
const deploymentWorkers = 5

// deploymentKind is what the controller writes in the ownerReferences of its ReplicaSets.
var deploymentKind = appsv1.SchemeGroupVersion.WithKind("Deployment")

// deploymentController rolls Deployments out through ReplicaSets, one per pod template.
type deploymentController struct {
	kube        kubernetes.Interface
	deployments appslisters.DeploymentLister
	replicaSets appslisters.ReplicaSetLister
	pods        corelisters.PodLister
	queue       *keyQueue
	recorder    record.EventRecorder
	logger      hclog.Logger
	now         func() time.Time
}

// buildDeploymentController builds the controller that reconciles Deployments as Kubernetes' Deployment controller does. Informer events
// for Deployments, their ReplicaSets, and (for Recreate) pod deletes queue the Deployment's key;
// deploymentWorkers workers take keys from the queue, and each sync goes:
//  1. a Deployment that is gone: nothing to do (the garbage collector removes its ReplicaSets); one that
//     selects every pod is refused with an event;
//  2. claim ReplicaSets: release owned ones the selector no longer matches, adopt matching orphans;
//  3. a Deployment being deleted only has its status written;
//  4. record pausing and resuming in the Progressing condition;
//  5. paused, or spec.replicas changed (a ReplicaSet's desired-replicas annotation differs): resize the
//     ReplicaSets (proportionally when several are active), keep the revision history within its limit
//     while paused, and write the status; no rollout progress is made;
//  6. otherwise roll out by the strategy: find or create the new ReplicaSet (named after the template's
//     hash, revision one above the old ones'), then
//     - RollingUpdate: scale the new ReplicaSet up within maxSurge, then the old ones down within
//     maxUnavailable, the unhealthy replicas first;
//     - Recreate: scale the old ReplicaSets to zero, wait until none of their pods is left, then scale the
//     new one up;
//  7. once complete, delete the oldest zero-sized ReplicaSets beyond revisionHistoryLimit, and write the
//     status and conditions, looking again at the progress deadline when no progress shows.
func buildDeploymentController(ctx context.Context, c *Clients) (func(), error) {
	deployments := c.Informers.Apps().V1().Deployments()
	replicaSets := c.Informers.Apps().V1().ReplicaSets()
	pods := c.Informers.Core().V1().Pods()
	recorder := c.recorderFor("deployment-controller")
	dc := &deploymentController{
		kube:        c.Kube,
		deployments: deployments.Lister(),
		replicaSets: replicaSets.Lister(),
		pods:        pods.Lister(),
		recorder:    recorder,
		logger:      c.Logger.Named("deployment"),
		now:         time.Now,
	}
	dc.queue = newKeyQueue(queueConfig{what: "deployment", workers: deploymentWorkers, logger: dc.logger, sync: dc.sync})
	deployments.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    dc.enqueueObject,
		UpdateFunc: func(_, cur any) { dc.enqueueObject(cur) },
		DeleteFunc: dc.enqueueObject,
	})
	replicaSets.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    dc.replicaSetAdded,
		UpdateFunc: dc.replicaSetUpdated,
		DeleteFunc: dc.replicaSetDeleted,
	})
	pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: dc.podDeleted})
	return func() {
		dc.queue.run(ctx, c, deployments.Informer().HasSynced, replicaSets.Informer().HasSynced, pods.Informer().HasSynced)
	}, nil
}

// Event handlers. Their job is to queue the Deployments whose ReplicaSets (or, for Recreate, pods) changed.

func (dc *deploymentController) enqueueObject(obj any) { dc.queue.addObject(obj) }

func (dc *deploymentController) enqueue(d *appsv1.Deployment) {
	dc.queue.add(d.Namespace + "/" + d.Name)
}

func (dc *deploymentController) replicaSetAdded(obj any) {
	rs := obj.(*appsv1.ReplicaSet)
	if rs.DeletionTimestamp != nil {
		// Seen for the first time already going (the informer relisted): for its owner it is gone.
		dc.replicaSetDeleted(rs)
		return
	}
	if ref := metav1.GetControllerOfNoCopy(rs); ref != nil {
		if d := dc.owner(rs.Namespace, ref); d != nil {
			dc.enqueue(d)
		}
		return
	}
	// An orphan: every Deployment that selects it may adopt it.
	for _, d := range dc.selecting(rs) {
		dc.enqueue(d)
	}
}

func (dc *deploymentController) replicaSetUpdated(oldObj, newObj any) {
	old, cur := oldObj.(*appsv1.ReplicaSet), newObj.(*appsv1.ReplicaSet)
	if old.ResourceVersion == cur.ResourceVersion {
		return // a resync: nothing changed
	}
	oldRef, curRef := metav1.GetControllerOf(old), metav1.GetControllerOf(cur)
	refChanged := !reflect.DeepEqual(oldRef, curRef)
	if refChanged && oldRef != nil {
		if d := dc.owner(old.Namespace, oldRef); d != nil {
			dc.enqueue(d) // it lost a ReplicaSet
		}
	}
	if curRef != nil {
		if d := dc.owner(cur.Namespace, curRef); d != nil {
			dc.enqueue(d)
		}
		return
	}
	if refChanged || !reflect.DeepEqual(old.Labels, cur.Labels) {
		for _, d := range dc.selecting(cur) {
			dc.enqueue(d)
		}
	}
}

func (dc *deploymentController) replicaSetDeleted(obj any) {
	rs, ok := fromTombstone[*appsv1.ReplicaSet](obj)
	if !ok {
		return
	}
	if ref := metav1.GetControllerOfNoCopy(rs); ref != nil {
		if d := dc.owner(rs.Namespace, ref); d != nil {
			dc.enqueue(d)
		}
	}
}

// podDeleted wakes a Recreate Deployment, which waits for its old pods to be gone before it creates new
// ones: no ReplicaSet event need come when the last one goes.
func (dc *deploymentController) podDeleted(obj any) {
	pod, ok := fromTombstone[*corev1.Pod](obj)
	if !ok {
		return
	}
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil || ref.Kind != replicaSetKind.Kind {
		return
	}
	rs, err := dc.replicaSets.ReplicaSets(pod.Namespace).Get(ref.Name)
	if err != nil || rs.UID != ref.UID {
		return
	}
	rsRef := metav1.GetControllerOfNoCopy(rs)
	if rsRef == nil {
		return
	}
	if d := dc.owner(rs.Namespace, rsRef); d != nil && d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
		dc.enqueue(d)
	}
}

// owner returns the cached Deployment a controller reference names, or nil when it names another kind, or
// a Deployment that no longer exists or was recreated under the same name.
func (dc *deploymentController) owner(namespace string, ref *metav1.OwnerReference) *appsv1.Deployment {
	d, _ := ownerByRef(ref, deploymentKind.Kind, dc.deployments.Deployments(namespace).Get)
	return d
}

// selecting lists the Deployments in the ReplicaSet's namespace whose selector matches its labels.
func (dc *deploymentController) selecting(rs *appsv1.ReplicaSet) []*appsv1.Deployment {
	all, err := dc.deployments.Deployments(rs.Namespace).List(labels.Everything())
	if err != nil {
		return nil
	}
	return selectingLabels(all, func(d *appsv1.Deployment) *metav1.LabelSelector { return d.Spec.Selector }, rs.Labels)
}

// sync reconciles one Deployment (the steps are in runDeploymentController's comment). It returns how soon
// to look again for the progress deadline, or 0.
func (dc *deploymentController) sync(ctx context.Context, key string) (time.Duration, error) {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return 0, nil // not a key this controller made
	}
	cached, err := dc.deployments.Deployments(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	d := cached.DeepCopy() // the cache's copy is shared; the sync changes its own
	selector, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || selector.Empty() {
		// The API refuses both; should one get through, adopting every ReplicaSet would be worse than
		// doing nothing.
		dc.recorder.Eventf(d, corev1.EventTypeWarning, "SelectingAll", "This deployment is selecting all pods. A non-empty selector is required.")
		if d.Status.ObservedGeneration < d.Generation {
			d.Status.ObservedGeneration = d.Generation
			_, err = dc.kube.AppsV1().Deployments(d.Namespace).UpdateStatus(ctx, d, metav1.UpdateOptions{})
		}
		return 0, err
	}
	if d.Spec.Replicas == nil {
		one := int32(1) // the API defaults it; be safe with a server that did not
		d.Spec.Replicas = &one
	}
	all, err := dc.replicaSets.ReplicaSets(namespace).List(labels.Everything())
	if err != nil {
		return 0, err
	}
	rsList, err := dc.claimReplicaSets(ctx, d, selector, all)
	if err != nil {
		return 0, err
	}
	s := &deploymentSync{dc: dc, d: d, rsList: rsList}
	if d.DeletionTimestamp != nil {
		return 0, s.syncStatusOnly(ctx)
	}
	if err := s.checkPausedConditions(ctx); err != nil {
		return 0, err
	}
	if d.Spec.Paused {
		return 0, s.scaleOnly(ctx)
	}
	scaling, err := s.isScalingEvent(ctx)
	if err != nil {
		return 0, err
	}
	if scaling {
		return 0, s.scaleOnly(ctx)
	}
	switch d.Spec.Strategy.Type {
	case appsv1.RecreateDeploymentStrategyType:
		podMap, err := dc.podsByReplicaSet(d, selector, rsList)
		if err != nil {
			return 0, err
		}
		return s.rolloutRecreate(ctx, podMap)
	case appsv1.RollingUpdateDeploymentStrategyType:
		return s.rolloutRolling(ctx)
	}
	return 0, fmt.Errorf("unexpected deployment strategy type %q", d.Spec.Strategy.Type)
}

// podsByReplicaSet groups the pods the Deployment selects by the UID of the ReplicaSet (of rsList) that
// controls them, for Recreate's wait for old pods to be gone. Pods being deleted are counted: they may
// still run.
func (dc *deploymentController) podsByReplicaSet(d *appsv1.Deployment, selector labels.Selector, rsList []*appsv1.ReplicaSet) (map[types.UID][]*corev1.Pod, error) {
	pods, err := dc.pods.Pods(d.Namespace).List(selector)
	if err != nil {
		return nil, err
	}
	out := make(map[types.UID][]*corev1.Pod, len(rsList))
	for _, rs := range rsList {
		out[rs.UID] = nil
	}
	for _, pod := range pods {
		ref := metav1.GetControllerOfNoCopy(pod)
		if ref == nil {
			continue
		}
		if _, ours := out[ref.UID]; ours {
			out[ref.UID] = append(out[ref.UID], pod)
		}
	}
	return out, nil
}

// claimReplicaSets returns the ReplicaSets that belong to the Deployment, adopting and releasing on the way
// (see claim).
func (dc *deploymentController) claimReplicaSets(ctx context.Context, d *appsv1.Deployment, selector labels.Selector, all []*appsv1.ReplicaSet) ([]*appsv1.ReplicaSet, error) {
	return claim(ctx, &claimer{
		owner: d, ownerKind: deploymentKind, selector: selector, dependentKind: "ReplicaSet",
		liveOwner: func(ctx context.Context) (metav1.Object, error) {
			return dc.kube.AppsV1().Deployments(d.Namespace).Get(ctx, d.Name, metav1.GetOptions{})
		},
		patch: func(ctx context.Context, namespace, name string, patch []byte) error {
			_, err := dc.kube.AppsV1().ReplicaSets(namespace).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
			return err
		},
	}, all)
}
