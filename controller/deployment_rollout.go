package controller

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// deploymentSync is one sync of one Deployment: its (deep-copied) object, kept up to date with what the
// sync writes, and the ReplicaSets it claimed.
type deploymentSync struct {
	dc     *deploymentController
	d      *appsv1.Deployment
	rsList []*appsv1.ReplicaSet
}

// writeStatus writes s.d's status as it is now, and takes the stored object back (its resourceVersion is
// what the next write needs).
func (s *deploymentSync) writeStatus(ctx context.Context) error {
	updated, err := s.dc.kube.AppsV1().Deployments(s.d.Namespace).UpdateStatus(ctx, s.d, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	s.d = updated
	return nil
}

// setRevision copies the new ReplicaSet's revision to the Deployment's annotation, where kubectl reads it.
// It is a metadata change, which the status subresource does not take, so it goes by an update of the
// Deployment (the verb Kubernetes' deployment-controller role grants); the status the sync has computed so
// far is kept.
func (s *deploymentSync) setRevision(ctx context.Context, rev string) error {
	if rev == "" || s.d.Annotations[revisionAnnotation] == rev {
		return nil
	}
	d := s.d.DeepCopy()
	if d.Annotations == nil {
		d.Annotations = map[string]string{}
	}
	d.Annotations[revisionAnnotation] = rev
	updated, err := s.dc.kube.AppsV1().Deployments(d.Namespace).Update(ctx, d, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	status := s.d.Status
	s.d = updated
	s.d.Status = status
	return nil
}

// replicaSets finds the new ReplicaSet (creating it when create is set and it is missing) and the old
// ones, and brings the revisions up to date on the way.
func (s *deploymentSync) replicaSets(ctx context.Context, create bool) (*appsv1.ReplicaSet, []*appsv1.ReplicaSet, error) {
	oldRSs := oldReplicaSets(s.rsList, findNewReplicaSet(s.d, s.rsList))
	newRS, err := s.newReplicaSet(ctx, oldRSs, create)
	if err != nil {
		return nil, nil, err
	}
	return newRS, oldRSs, nil
}

// newReplicaSet returns the ReplicaSet for the Deployment's template, up to date (annotations,
// minReadySeconds), with its revision copied to the Deployment; or, when there is none and create is set,
// creates it at revision max(old)+1, sized as the strategy allows.
func (s *deploymentSync) newReplicaSet(ctx context.Context, oldRSs []*appsv1.ReplicaSet, create bool) (*appsv1.ReplicaSet, error) {
	d := s.d
	newRevision := maxRevision(oldRSs) + 1
	if existing := findNewReplicaSet(d, s.rsList); existing != nil {
		rs := existing.DeepCopy()
		annotationsChanged := setNewReplicaSetAnnotations(d, rs, newRevision, true)
		if annotationsChanged || rs.Spec.MinReadySeconds != d.Spec.MinReadySeconds {
			rs.Spec.MinReadySeconds = d.Spec.MinReadySeconds
			// The Deployment's revision is brought up to date by the next sync, which the update queues.
			return s.dc.kube.AppsV1().ReplicaSets(rs.Namespace).Update(ctx, rs, metav1.UpdateOptions{})
		}
		if err := s.setRevision(ctx, rs.Annotations[revisionAnnotation]); err != nil {
			return nil, err
		}
		if hasProgressDeadline(d) && deploymentCondition(s.d.Status, appsv1.DeploymentProgressing) == nil {
			setDeploymentCondition(&s.d.Status, newDeploymentCondition(appsv1.DeploymentProgressing, corev1.ConditionTrue,
				reasonFoundNewRS, fmt.Sprintf("Found new replica set %q", rs.Name), s.dc.now()))
			if err := s.writeStatus(ctx); err != nil {
				return nil, err
			}
		}
		return rs, nil
	}
	if !create {
		return nil, nil
	}

	template := *d.Spec.Template.DeepCopy()
	hash := templateHash(&template, d.Status.CollisionCount)
	template.Labels = withLabel(d.Spec.Template.Labels, appsv1.DefaultDeploymentUniqueLabelKey, hash)
	selector := d.Spec.Selector.DeepCopy()
	selector.MatchLabels = withLabel(selector.MatchLabels, appsv1.DefaultDeploymentUniqueLabelKey, hash)
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Name:            d.Name + "-" + hash,
			Namespace:       d.Namespace,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(d, deploymentKind)},
			Labels:          template.Labels,
		},
		Spec: appsv1.ReplicaSetSpec{Replicas: new(int32), MinReadySeconds: d.Spec.MinReadySeconds, Selector: selector, Template: template},
	}
	replicas := newRSReplicas(d, append(append([]*appsv1.ReplicaSet(nil), oldRSs...), rs), rs)
	*rs.Spec.Replicas = replicas
	setNewReplicaSetAnnotations(d, rs, newRevision, false)

	created, err := s.dc.kube.AppsV1().ReplicaSets(d.Namespace).Create(ctx, rs, metav1.CreateOptions{})
	alreadyExists := false
	switch {
	case apierrors.IsAlreadyExists(err):
		alreadyExists = true
		existing, getErr := s.dc.replicaSets.ReplicaSets(rs.Namespace).Get(rs.Name)
		if getErr != nil {
			return nil, getErr
		}
		// Ours, for this template, and the cache had not shown it yet: it is the new ReplicaSet.
		if ref := metav1.GetControllerOfNoCopy(existing); ref != nil && ref.UID == d.UID && equalIgnoreHash(&d.Spec.Template, &existing.Spec.Template) {
			created, err = existing, nil
			break
		}
		// Another ReplicaSet has the name (a hash collision, or a user's): count the collision, which
		// changes the hash, and try again with the next sync.
		if s.d.Status.CollisionCount == nil {
			s.d.Status.CollisionCount = new(int32)
		}
		*s.d.Status.CollisionCount++
		if werr := s.writeStatus(ctx); werr != nil {
			return nil, werr
		}
		return nil, err
	case apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
		return nil, err
	case err != nil:
		msg := fmt.Sprintf("Failed to create new replica set %q: %v", rs.Name, err)
		if hasProgressDeadline(d) {
			setDeploymentCondition(&s.d.Status, newDeploymentCondition(appsv1.DeploymentProgressing, corev1.ConditionFalse,
				reasonFailedRSCreate, msg, s.dc.now()))
			_ = s.writeStatus(ctx) // best effort: the create's error is the one to report
		}
		s.dc.recorder.Event(d, corev1.EventTypeWarning, reasonFailedRSCreate, msg)
		return nil, err
	}
	if !alreadyExists && replicas > 0 {
		s.dc.recorder.Eventf(d, corev1.EventTypeNormal, "ScalingReplicaSet", "Scaled up replica set %s from 0 to %d", created.Name, replicas)
	}
	if err := s.setRevision(ctx, strconv.FormatInt(newRevision, 10)); err != nil {
		return nil, err
	}
	if !alreadyExists && hasProgressDeadline(d) {
		setDeploymentCondition(&s.d.Status, newDeploymentCondition(appsv1.DeploymentProgressing, corev1.ConditionTrue,
			reasonNewRSCreated, fmt.Sprintf("Created new replica set %q", created.Name), s.dc.now()))
		if err := s.writeStatus(ctx); err != nil {
			return nil, err
		}
	}
	return created, nil
}

// withLabel returns a copy of m with one more label.
func withLabel(m map[string]string, key, value string) map[string]string {
	out := make(map[string]string, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	out[key] = value
	return out
}

// scaleReplicaSet sets the ReplicaSet's size, and the Deployment sizes it was sized for, and records a
// ScalingReplicaSet event on the Deployment when the size changed. It returns whether it did, and the
// ReplicaSet as stored.
func (s *deploymentSync) scaleReplicaSet(ctx context.Context, rs *appsv1.ReplicaSet, size int32, operation string) (bool, *appsv1.ReplicaSet, error) {
	d := s.d
	sizeChanged := replicasOf(rs) != size
	copied := rs.DeepCopy()
	annotationsChanged := setReplicasAnnotations(copied, *d.Spec.Replicas, *d.Spec.Replicas+maxSurge(d))
	if !sizeChanged && !annotationsChanged {
		return false, rs, nil
	}
	from := replicasOf(rs)
	copied.Spec.Replicas = &size
	updated, err := s.dc.kube.AppsV1().ReplicaSets(copied.Namespace).Update(ctx, copied, metav1.UpdateOptions{})
	if err != nil {
		return false, rs, err
	}
	if sizeChanged {
		s.dc.recorder.Eventf(d, corev1.EventTypeNormal, "ScalingReplicaSet", "Scaled %s replica set %s from %d to %d", operation, rs.Name, from, size)
	}
	return sizeChanged, updated, nil
}

// scaleTo is scaleReplicaSet with the direction worked out; nothing is written when the size is right.
func (s *deploymentSync) scaleTo(ctx context.Context, rs *appsv1.ReplicaSet, size int32) (bool, *appsv1.ReplicaSet, error) {
	if replicasOf(rs) == size {
		return false, rs, nil
	}
	operation := "up"
	if replicasOf(rs) > size {
		operation = "down"
	}
	return s.scaleReplicaSet(ctx, rs, size, operation)
}

// isScalingEvent: spec.replicas differs from what an active ReplicaSet was last sized for. Such a change
// is applied at once, proportionally, rather than by rolling.
func (s *deploymentSync) isScalingEvent(ctx context.Context) (bool, error) {
	newRS, oldRSs, err := s.replicaSets(ctx, false)
	if err != nil {
		return false, err
	}
	for _, rs := range activeReplicaSets(append(oldRSs, newRS)) {
		if desired, ok := intAnnotation(rs, desiredReplicasAnnotation); ok && desired != *s.d.Spec.Replicas {
			return true, nil
		}
	}
	return false, nil
}

// scaleOnly resizes without rolling out (paused, or spec.replicas changed), trims the history of a paused
// Deployment (a running rollout does that once complete), and writes the status.
func (s *deploymentSync) scaleOnly(ctx context.Context) error {
	newRS, oldRSs, err := s.replicaSets(ctx, false)
	if err != nil {
		return err
	}
	if err := s.scale(ctx, newRS, oldRSs); err != nil {
		return err
	}
	if s.d.Spec.Paused {
		if err := s.cleanup(ctx, oldRSs); err != nil {
			return err
		}
	}
	return s.syncStatus(ctx, append(oldRSs, newRS), newRS)
}

func (s *deploymentSync) syncStatusOnly(ctx context.Context) error {
	newRS, oldRSs, err := s.replicaSets(ctx, false)
	if err != nil {
		return err
	}
	return s.syncStatus(ctx, append(oldRSs, newRS), newRS)
}

// scale brings the ReplicaSets to spec.replicas: the only active one (or, with none active, the newest)
// takes all of it; with the new one saturated, the old ones go to zero; otherwise, in a rolling update,
// every active one is resized in proportion (see proportionalSizes).
func (s *deploymentSync) scale(ctx context.Context, newRS *appsv1.ReplicaSet, oldRSs []*appsv1.ReplicaSet) error {
	d := s.d
	if target := findActiveOrLatest(newRS, oldRSs); target != nil {
		_, _, err := s.scaleTo(ctx, target, *d.Spec.Replicas)
		return err
	}
	if isSaturated(d, newRS) {
		for _, old := range activeReplicaSets(oldRSs) {
			if _, _, err := s.scaleTo(ctx, old, 0); err != nil {
				return err
			}
		}
		return nil
	}
	if !isRollingUpdate(d) {
		return nil
	}
	active := activeReplicaSets(append(append([]*appsv1.ReplicaSet(nil), oldRSs...), newRS))
	sizes, operation := proportionalSizes(d, active)
	for _, rs := range active {
		if _, _, err := s.scaleReplicaSet(ctx, rs, sizes[rs.Name], operation); err != nil {
			return err
		}
	}
	return nil
}

// rolloutRolling makes one step of a rolling update: scale the new ReplicaSet up, or else the old ones
// down, and write the status; once complete, trim the history.
func (s *deploymentSync) rolloutRolling(ctx context.Context) (time.Duration, error) {
	newRS, oldRSs, err := s.replicaSets(ctx, true)
	if err != nil {
		return 0, err
	}
	allRSs := append(append([]*appsv1.ReplicaSet(nil), oldRSs...), newRS)
	scaledUp, err := s.reconcileNewReplicaSet(ctx, allRSs, newRS)
	if err != nil {
		return 0, err
	}
	if scaledUp {
		return s.syncRolloutStatus(ctx, allRSs, newRS)
	}
	scaledDown, err := s.reconcileOldReplicaSets(ctx, allRSs, activeReplicaSets(oldRSs), newRS)
	if err != nil {
		return 0, err
	}
	if scaledDown {
		return s.syncRolloutStatus(ctx, allRSs, newRS)
	}
	if deploymentComplete(s.d, &s.d.Status) {
		if err := s.cleanup(ctx, oldRSs); err != nil {
			return 0, err
		}
	}
	return s.syncRolloutStatus(ctx, allRSs, newRS)
}

// reconcileNewReplicaSet scales the new ReplicaSet towards spec.replicas, up as far as maxSurge allows.
func (s *deploymentSync) reconcileNewReplicaSet(ctx context.Context, allRSs []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) (bool, error) {
	want := *s.d.Spec.Replicas
	if replicasOf(newRS) == want {
		return false, nil
	}
	if replicasOf(newRS) > want {
		scaled, _, err := s.scaleTo(ctx, newRS, want)
		return scaled, err
	}
	scaled, _, err := s.scaleTo(ctx, newRS, newRSReplicas(s.d, allRSs, newRS))
	return scaled, err
}

// reconcileOldReplicaSets scales the old ReplicaSets down as far as the availability floor
// (spec.replicas - maxUnavailable) allows. Replicas that are not available are removed first, from the
// oldest ReplicaSets: they cost no availability, and removing them lets a rollout stuck on broken old
// pods move on.
func (s *deploymentSync) reconcileOldReplicaSets(ctx context.Context, allRSs, oldRSs []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) (bool, error) {
	if sumReplicaSets(oldRSs, specReplicas) == 0 {
		return false, nil
	}
	minAvailable := *s.d.Spec.Replicas - maxUnavailable(s.d)
	newUnavailable := replicasOf(newRS) - newRS.Status.AvailableReplicas
	maxScaledDown := sumReplicaSets(allRSs, specReplicas) - minAvailable - newUnavailable
	if maxScaledDown <= 0 {
		return false, nil
	}
	oldRSs, cleaned, err := s.cleanupUnhealthyReplicas(ctx, oldRSs, maxScaledDown)
	if err != nil {
		return false, err
	}
	scaledDown, err := s.scaleDownOldForRollingUpdate(ctx, append(append([]*appsv1.ReplicaSet(nil), oldRSs...), newRS), oldRSs)
	if err != nil {
		return false, err
	}
	return cleaned+scaledDown > 0, nil
}

// cleanupUnhealthyReplicas removes up to maxCleanup of the old ReplicaSets' unavailable replicas, oldest
// ReplicaSet first, and returns the ReplicaSets as now stored.
func (s *deploymentSync) cleanupUnhealthyReplicas(ctx context.Context, oldRSs []*appsv1.ReplicaSet, maxCleanup int32) ([]*appsv1.ReplicaSet, int32, error) {
	sorted := oldestFirst(oldRSs)
	var total int32
	for i, rs := range sorted {
		if total >= maxCleanup {
			break
		}
		unhealthy := replicasOf(rs) - availableAndKept(rs)
		if replicasOf(rs) == 0 || unhealthy <= 0 {
			continue
		}
		n := min(maxCleanup-total, unhealthy)
		_, updated, err := s.scaleTo(ctx, rs, replicasOf(rs)-n)
		if err != nil {
			return nil, 0, err
		}
		total += n
		sorted[i] = updated
	}
	return sorted, total, nil
}

// scaleDownOldForRollingUpdate scales old ReplicaSets down, oldest first, by as many available pods as
// exceed the floor.
func (s *deploymentSync) scaleDownOldForRollingUpdate(ctx context.Context, allRSs, oldRSs []*appsv1.ReplicaSet) (int32, error) {
	minAvailable := *s.d.Spec.Replicas - maxUnavailable(s.d)
	available := sumReplicaSets(allRSs, availableAndKept)
	if available <= minAvailable {
		return 0, nil
	}
	toScaleDown := available - minAvailable
	sorted := oldestFirst(oldRSs)
	var total int32
	for _, rs := range sorted {
		if total >= toScaleDown {
			break
		}
		if replicasOf(rs) == 0 {
			continue
		}
		n := min(replicasOf(rs), toScaleDown-total)
		if _, _, err := s.scaleTo(ctx, rs, replicasOf(rs)-n); err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

// rolloutRecreate makes one step of a Recreate rollout: scale every old ReplicaSet to zero; once no old pod
// is left, create the new ReplicaSet (if needed) and scale it to spec.replicas; once complete, trim the
// history.
func (s *deploymentSync) rolloutRecreate(ctx context.Context, podMap map[types.UID][]*corev1.Pod) (time.Duration, error) {
	// The new ReplicaSet is not created yet: it would start pods alongside the old ones.
	newRS, oldRSs, err := s.replicaSets(ctx, false)
	if err != nil {
		return 0, err
	}
	allRSs := append(append([]*appsv1.ReplicaSet(nil), oldRSs...), newRS)
	scaledDown := false
	for _, rs := range activeReplicaSets(oldRSs) {
		scaled, _, err := s.scaleTo(ctx, rs, 0)
		if err != nil {
			return 0, err
		}
		scaledDown = scaledDown || scaled
	}
	if scaledDown || oldPodsRunning(newRS, oldRSs, podMap) {
		return s.syncRolloutStatus(ctx, allRSs, newRS)
	}
	if newRS == nil {
		if newRS, oldRSs, err = s.replicaSets(ctx, true); err != nil {
			return 0, err
		}
		allRSs = append(append([]*appsv1.ReplicaSet(nil), oldRSs...), newRS)
	}
	if _, _, err := s.scaleTo(ctx, newRS, *s.d.Spec.Replicas); err != nil {
		return 0, err
	}
	if deploymentComplete(s.d, &s.d.Status) {
		if err := s.cleanup(ctx, oldRSs); err != nil {
			return 0, err
		}
	}
	return s.syncRolloutStatus(ctx, allRSs, newRS)
}

// oldPodsRunning: an old ReplicaSet still reports pods, or a pod of one has not finished (pods being deleted
// included: they may still run).
func oldPodsRunning(newRS *appsv1.ReplicaSet, oldRSs []*appsv1.ReplicaSet, podMap map[types.UID][]*corev1.Pod) bool {
	if sumReplicaSets(oldRSs, statusReplicas) > 0 {
		return true
	}
	for uid, pods := range podMap {
		if newRS != nil && newRS.UID == uid {
			continue
		}
		for _, pod := range pods {
			if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
				return true
			}
		}
	}
	return false
}

// cleanup deletes the old ReplicaSets beyond revisionHistoryLimit (see replicaSetsToCleanUp).
func (s *deploymentSync) cleanup(ctx context.Context, oldRSs []*appsv1.ReplicaSet) error {
	if s.d.Spec.RevisionHistoryLimit == nil {
		return nil
	}
	for _, rs := range replicaSetsToCleanUp(oldRSs, *s.d.Spec.RevisionHistoryLimit) {
		// Preconditioned on the UID: a ReplicaSet recreated under the name since is not the one judged.
		err := s.dc.kube.AppsV1().ReplicaSets(rs.Namespace).Delete(ctx, rs.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &rs.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
	}
	return nil
}

// syncStatus writes the counts and Available condition, leaving Progressing as it is (no rollout runs).
func (s *deploymentSync) syncStatus(ctx context.Context, allRSs []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) error {
	status := calculateStatus(allRSs, newRS, s.d, s.dc.now())
	if reflect.DeepEqual(s.d.Status, status) {
		return nil
	}
	s.d.Status = status
	return s.writeStatus(ctx)
}

// syncRolloutStatus writes the status of a rollout under way (see rolloutStatus). With nothing new to write,
// it returns how soon the progress deadline may pass: no event marks that moment.
func (s *deploymentSync) syncRolloutStatus(ctx context.Context, allRSs []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) (time.Duration, error) {
	now := s.dc.now()
	status := rolloutStatus(allRSs, newRS, s.d, now)
	if reflect.DeepEqual(s.d.Status, status) {
		return untilDeadline(s.d, &status, now), nil
	}
	s.d.Status = status
	return 0, s.writeStatus(ctx)
}

// checkPausedConditions records in the Progressing condition that the Deployment was paused (reason
// DeploymentPaused, status Unknown, so the deadline does not run) or resumed. A timed-out rollout keeps
// its ProgressDeadlineExceeded.
func (s *deploymentSync) checkPausedConditions(ctx context.Context) error {
	if !hasProgressDeadline(s.d) {
		return nil
	}
	cond := deploymentCondition(s.d.Status, appsv1.DeploymentProgressing)
	if cond != nil && cond.Reason == reasonTimedOut {
		return nil
	}
	pausedCond := cond != nil && cond.Reason == reasonPaused
	switch {
	case s.d.Spec.Paused && !pausedCond:
		setDeploymentCondition(&s.d.Status, newDeploymentCondition(appsv1.DeploymentProgressing, corev1.ConditionUnknown,
			reasonPaused, "Deployment is paused", s.dc.now()))
	case !s.d.Spec.Paused && pausedCond:
		setDeploymentCondition(&s.d.Status, newDeploymentCondition(appsv1.DeploymentProgressing, corev1.ConditionUnknown,
			reasonResumed, "Deployment is resumed", s.dc.now()))
	default:
		return nil
	}
	return s.writeStatus(ctx)
}
