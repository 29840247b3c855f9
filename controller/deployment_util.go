package controller

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/dump"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/rand"
)

// The Deployment controller's pure computations: template hashes, revisions, the annotations kubectl reads,
// the rolling-update fenceposts, proportional scaling and the status. Nothing here talks to the API.

// Annotations Kubernetes' Deployment controller sets, under the names kubectl reads them by.
const (
	revisionAnnotation        = "deployment.kubernetes.io/revision"
	revisionHistoryAnnotation = "deployment.kubernetes.io/revision-history"
	desiredReplicasAnnotation = "deployment.kubernetes.io/desired-replicas"
	maxReplicasAnnotation     = "deployment.kubernetes.io/max-replicas"
	// maxRevisionHistoryChars bounds revision-history, as Kubernetes does, so a ReplicaSet rolled back to
	// many times cannot outgrow the annotation size limit.
	maxRevisionHistoryChars = 2000
)

// Reasons of the Deployment's conditions, Kubernetes' strings (kubectl rollout status matches on
// ProgressDeadlineExceeded).
const (
	reasonNewRSCreated        = "NewReplicaSetCreated"
	reasonFoundNewRS          = "FoundNewReplicaSet"
	reasonRSUpdated           = "ReplicaSetUpdated"
	reasonNewRSAvailable      = "NewReplicaSetAvailable"
	reasonTimedOut            = "ProgressDeadlineExceeded"
	reasonFailedRSCreate      = "ReplicaSetCreateError"
	reasonPaused              = "DeploymentPaused"
	reasonResumed             = "DeploymentResumed"
	reasonMinimumAvailable    = "MinimumReplicasAvailable"
	reasonMinimumNotAvailable = "MinimumReplicasUnavailable"
)

// annotationsNotCopied are the Deployment annotations a new ReplicaSet does not inherit: the controller's
// own (each ReplicaSet has its revision and sizes), and kubectl's record of the Deployment's last apply,
// which describes the Deployment, not the ReplicaSet.
var annotationsNotCopied = map[string]bool{
	corev1.LastAppliedConfigAnnotation:  true,
	revisionAnnotation:                  true,
	revisionHistoryAnnotation:           true,
	desiredReplicasAnnotation:           true,
	maxReplicasAnnotation:               true,
	"deprecated.deployment.rollback.to": true,
}

// templateHash is Kubernetes' pod-template-hash: fnv32a over a dump of the template, plus the collision
// count when there is one, written in the alphabet that keeps names free of vowels and look-alikes. The
// same template always gives the same hash, so the name of a Deployment's ReplicaSet for a template is
// predictable; bumping the collision count gives another name when that one is taken.
func templateHash(template *corev1.PodTemplateSpec, collisionCount *int32) string {
	hasher := fnv.New32a()
	fmt.Fprintf(hasher, "%v", dump.ForHash(*template))
	if collisionCount != nil {
		buf := make([]byte, 8)
		binary.LittleEndian.PutUint32(buf, uint32(*collisionCount))
		hasher.Write(buf)
	}
	return rand.SafeEncodeString(fmt.Sprint(hasher.Sum32()))
}

// equalIgnoreHash reports whether two templates are the same but for the pod-template-hash label, which
// the ReplicaSet's copy carries and the Deployment's does not.
func equalIgnoreHash(a, b *corev1.PodTemplateSpec) bool {
	a, b = a.DeepCopy(), b.DeepCopy()
	delete(a.Labels, appsv1.DefaultDeploymentUniqueLabelKey)
	delete(b.Labels, appsv1.DefaultDeploymentUniqueLabelKey)
	return apiequality.Semantic.DeepEqual(a, b)
}

// findNewReplicaSet is the ReplicaSet running the Deployment's current template; the oldest when several
// do (two can after a hash collision), so the choice is stable.
func findNewReplicaSet(d *appsv1.Deployment, rsList []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	sorted := oldestFirst(rsList)
	for _, rs := range sorted {
		if equalIgnoreHash(&rs.Spec.Template, &d.Spec.Template) {
			return rs
		}
	}
	return nil
}

// oldReplicaSets are all of rsList but the new ReplicaSet.
func oldReplicaSets(rsList []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) []*appsv1.ReplicaSet {
	var out []*appsv1.ReplicaSet
	for _, rs := range rsList {
		if newRS == nil || rs.UID != newRS.UID {
			out = append(out, rs)
		}
	}
	return out
}

// oldestFirst returns a copy of the ReplicaSets sorted oldest first.
func oldestFirst(rss []*appsv1.ReplicaSet) []*appsv1.ReplicaSet {
	sorted := append([]*appsv1.ReplicaSet(nil), rss...)
	sort.SliceStable(sorted, func(i, j int) bool { return olderReplicaSet(sorted[i], sorted[j]) })
	return sorted
}

func olderReplicaSet(a, b *appsv1.ReplicaSet) bool {
	if a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.Name < b.Name
	}
	return a.CreationTimestamp.Before(&b.CreationTimestamp)
}

// revision reads the ReplicaSet's revision annotation; 0 when missing or malformed.
func revision(rs *appsv1.ReplicaSet) int64 {
	v, err := strconv.ParseInt(rs.Annotations[revisionAnnotation], 10, 64)
	if err != nil {
		return 0
	}
	return v
}

func maxRevision(rsList []*appsv1.ReplicaSet) int64 {
	var out int64
	for _, rs := range rsList {
		out = max(out, revision(rs))
	}
	return out
}

// setNewReplicaSetAnnotations brings the new ReplicaSet's annotations up to date: the Deployment's own
// (copied), the revision (raised to newRevision, never lowered), the revisions it had before when it is
// rolled back to, and, for a ReplicaSet about to be created, the sizes it is created for. It reports a
// change.
func setNewReplicaSetAnnotations(d *appsv1.Deployment, rs *appsv1.ReplicaSet, newRevision int64, exists bool) bool {
	changed := false
	if rs.Annotations == nil {
		rs.Annotations = map[string]string{}
	}
	for k, v := range d.Annotations {
		if annotationsNotCopied[k] {
			continue
		}
		if cur, ok := rs.Annotations[k]; ok && cur == v {
			continue
		}
		rs.Annotations[k] = v
		changed = true
	}
	oldText, had := rs.Annotations[revisionAnnotation]
	old, err := strconv.ParseInt(oldText, 10, 64)
	if err != nil {
		if oldText != "" {
			return changed // not ours to overwrite; Kubernetes leaves a malformed revision alone too
		}
		old = 0
	}
	if old < newRevision {
		rs.Annotations[revisionAnnotation] = strconv.FormatInt(newRevision, 10)
		changed = true
		if had {
			// Rolled back to: remember the revisions it had, for the history.
			rs.Annotations[revisionHistoryAnnotation] = appendRevisionHistory(rs.Annotations[revisionHistoryAnnotation], oldText)
		}
	}
	if !exists && setReplicasAnnotations(rs, *d.Spec.Replicas, *d.Spec.Replicas+maxSurge(d)) {
		changed = true
	}
	return changed
}

// appendRevisionHistory adds a revision to a comma-separated history, dropping the oldest entries to stay
// within maxRevisionHistoryChars.
func appendRevisionHistory(history, rev string) string {
	if history == "" {
		return rev
	}
	entries := append(strings.Split(history, ","), rev)
	for len(entries) > 1 && len(strings.Join(entries, ",")) > maxRevisionHistoryChars {
		entries = entries[1:]
	}
	return strings.Join(entries, ",")
}

// setReplicasAnnotations records the Deployment size (and size plus surge) the ReplicaSet was last sized
// for: proportional scaling needs to know how big the Deployment was, and isScalingEvent whether it has
// changed since.
func setReplicasAnnotations(rs *appsv1.ReplicaSet, desired, maxReplicas int32) bool {
	if rs.Annotations == nil {
		rs.Annotations = map[string]string{}
	}
	d, m := strconv.Itoa(int(desired)), strconv.Itoa(int(maxReplicas))
	if rs.Annotations[desiredReplicasAnnotation] == d && rs.Annotations[maxReplicasAnnotation] == m {
		return false
	}
	rs.Annotations[desiredReplicasAnnotation] = d
	rs.Annotations[maxReplicasAnnotation] = m
	return true
}

func intAnnotation(rs *appsv1.ReplicaSet, key string) (int32, bool) {
	v, ok := rs.Annotations[key]
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil {
		return 0, false
	}
	return int32(n), true
}

func isRollingUpdate(d *appsv1.Deployment) bool {
	return d.Spec.Strategy.Type == appsv1.RollingUpdateDeploymentStrategyType
}

// resolveFenceposts turns maxSurge and maxUnavailable into pod counts for desired replicas: a percentage of
// surge rounds up, of unavailability down, so that a rollout of few pods can still move. Both resolving to
// zero (the API refuses both set to zero, but 25% of 3 rounds down to 0) would leave a rollout unable to
// move; then one pod may be unavailable, since surging may be what quota forbids.
func resolveFenceposts(surge, unavailable *intstr.IntOrString, desired int32) (int32, int32, error) {
	zero := intstr.FromInt32(0)
	s, err := intstr.GetScaledValueFromIntOrPercent(intstr.ValueOrDefault(surge, zero), int(desired), true)
	if err != nil {
		return 0, 0, err
	}
	u, err := intstr.GetScaledValueFromIntOrPercent(intstr.ValueOrDefault(unavailable, zero), int(desired), false)
	if err != nil {
		return 0, 0, err
	}
	if s == 0 && u == 0 {
		u = 1
	}
	return int32(s), int32(u), nil
}

// maxSurge is how many pods above spec.replicas a rolling update may run; 0 for Recreate. A value the API
// should have refused counts as 0.
func maxSurge(d *appsv1.Deployment) int32 {
	if !isRollingUpdate(d) || d.Spec.Strategy.RollingUpdate == nil {
		return 0
	}
	s, _, _ := resolveFenceposts(d.Spec.Strategy.RollingUpdate.MaxSurge, d.Spec.Strategy.RollingUpdate.MaxUnavailable, *d.Spec.Replicas)
	return s
}

// maxUnavailable is how many of spec.replicas may be unavailable during a rolling update, at most all of
// them; 0 for Recreate (which makes them all unavailable anyway) and for a Deployment scaled to zero.
func maxUnavailable(d *appsv1.Deployment) int32 {
	if !isRollingUpdate(d) || *d.Spec.Replicas == 0 {
		return 0
	}
	var surge, unavailable *intstr.IntOrString
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil {
		surge, unavailable = ru.MaxSurge, ru.MaxUnavailable
	}
	_, u, err := resolveFenceposts(surge, unavailable, *d.Spec.Replicas)
	if err != nil {
		u = 1
	}
	return min(u, *d.Spec.Replicas)
}

func replicasOf(rs *appsv1.ReplicaSet) int32 {
	if rs == nil || rs.Spec.Replicas == nil {
		return 0
	}
	return *rs.Spec.Replicas
}

// activeReplicaSets are those with pods wanted (spec.replicas above zero); nils are dropped.
func activeReplicaSets(rsList []*appsv1.ReplicaSet) []*appsv1.ReplicaSet {
	var out []*appsv1.ReplicaSet
	for _, rs := range rsList {
		if replicasOf(rs) > 0 {
			out = append(out, rs)
		}
	}
	return out
}

// sumReplicaSets adds up one count over the ReplicaSets, skipping nils (the new ReplicaSet before it exists).
func sumReplicaSets(rsList []*appsv1.ReplicaSet, count func(*appsv1.ReplicaSet) int32) int32 {
	var n int32
	for _, rs := range rsList {
		if rs != nil {
			n += count(rs)
		}
	}
	return n
}

func specReplicas(rs *appsv1.ReplicaSet) int32      { return replicasOf(rs) }
func statusReplicas(rs *appsv1.ReplicaSet) int32    { return rs.Status.Replicas }
func readyReplicas(rs *appsv1.ReplicaSet) int32     { return rs.Status.ReadyReplicas }
func availableReplicas(rs *appsv1.ReplicaSet) int32 { return rs.Status.AvailableReplicas }

// podsRunningOrWanted counts, for the surge limit, the pods a ReplicaSet may be running: spec.replicas, or
// more while its surplus is still being deleted. Kubernetes counts spec.replicas only, so right after an old
// ReplicaSet is scaled down the new one could surge before the old pods are gone; counting the status too
// keeps maxSurge true of the pods that actually exist.
func podsRunningOrWanted(rs *appsv1.ReplicaSet) int32 { return max(replicasOf(rs), rs.Status.Replicas) }

// availableAndKept counts, for the availability floor, the available pods a ReplicaSet will keep: the status
// may still count pods a scale-down is about to delete. Kubernetes counts status.availableReplicas; a
// second scale-down acting on that stale count could take availability below the floor.
func availableAndKept(rs *appsv1.ReplicaSet) int32 {
	return min(rs.Status.AvailableReplicas, replicasOf(rs))
}

// newRSReplicas is the size the new ReplicaSet should have now: all of spec.replicas for Recreate (called
// once the old pods are gone); for a rolling update, as many more as the surge leaves room for.
func newRSReplicas(d *appsv1.Deployment, allRSs []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) int32 {
	if !isRollingUpdate(d) {
		return *d.Spec.Replicas
	}
	current := sumReplicaSets(allRSs, podsRunningOrWanted)
	maxTotal := *d.Spec.Replicas + maxSurge(d)
	if current >= maxTotal {
		return replicasOf(newRS)
	}
	return replicasOf(newRS) + min(maxTotal-current, *d.Spec.Replicas-replicasOf(newRS))
}

// isSaturated: the new ReplicaSet has, and was sized for, all of spec.replicas, and all are available.
func isSaturated(d *appsv1.Deployment, rs *appsv1.ReplicaSet) bool {
	if rs == nil {
		return false
	}
	desired, ok := intAnnotation(rs, desiredReplicasAnnotation)
	return ok && replicasOf(rs) == *d.Spec.Replicas && desired == *d.Spec.Replicas && rs.Status.AvailableReplicas == *d.Spec.Replicas
}

// findActiveOrLatest is the one ReplicaSet a resize applies to in full: the only active one, or when none
// is active the new one (else the newest old one). nil when several are active: they are resized in
// proportion.
func findActiveOrLatest(newRS *appsv1.ReplicaSet, oldRSs []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	if newRS == nil && len(oldRSs) == 0 {
		return nil
	}
	active := activeReplicaSets(append(append([]*appsv1.ReplicaSet(nil), oldRSs...), newRS))
	switch len(active) {
	case 0:
		if newRS != nil {
			return newRS
		}
		newest := oldRSs[0]
		for _, rs := range oldRSs[1:] {
			if olderReplicaSet(newest, rs) {
				newest = rs
			}
		}
		return newest
	case 1:
		return active[0]
	}
	return nil
}

// proportionalSizes computes Kubernetes' proportional scaling: when spec.replicas changes in the middle of a
// rollout, the replicas to add (or remove) to reach spec.replicas plus surge are shared among the active
// ReplicaSets in proportion to their sizes, each measured against the Deployment size it was last sized
// for (max-replicas); the rounding leftover goes to the largest ReplicaSet (newest first when scaling up,
// oldest first when scaling down). It returns the new size of each ReplicaSet, by name, and "up" or
// "down" ("" when no change is due).
func proportionalSizes(d *appsv1.Deployment, active []*appsv1.ReplicaSet) (map[string]int32, string) {
	total := sumReplicaSets(active, specReplicas)
	var allowed int32
	if *d.Spec.Replicas > 0 {
		allowed = *d.Spec.Replicas + maxSurge(d)
	}
	toAdd := allowed - total
	sorted := append([]*appsv1.ReplicaSet(nil), active...)
	operation := ""
	switch {
	case toAdd > 0:
		operation = "up"
		sort.SliceStable(sorted, func(i, j int) bool {
			if replicasOf(sorted[i]) != replicasOf(sorted[j]) {
				return replicasOf(sorted[i]) > replicasOf(sorted[j])
			}
			return olderReplicaSet(sorted[j], sorted[i])
		})
	case toAdd < 0:
		operation = "down"
		sort.SliceStable(sorted, func(i, j int) bool {
			if replicasOf(sorted[i]) != replicasOf(sorted[j]) {
				return replicasOf(sorted[i]) > replicasOf(sorted[j])
			}
			return olderReplicaSet(sorted[i], sorted[j])
		})
	}
	sizes := map[string]int32{}
	var added int32
	for _, rs := range sorted {
		share := int32(0)
		if toAdd != 0 {
			share = proportion(rs, d, toAdd, added)
		}
		sizes[rs.Name] = replicasOf(rs) + share
		added += share
	}
	if toAdd != 0 && len(sorted) > 0 {
		first := sorted[0].Name
		sizes[first] = max(sizes[first]+toAdd-added, 0)
	}
	return sizes, operation
}

// proportion is the ReplicaSet's share of toAdd, never more than what is left to add (or remove).
func proportion(rs *appsv1.ReplicaSet, d *appsv1.Deployment, toAdd, added int32) int32 {
	if replicasOf(rs) == 0 || toAdd == 0 || toAdd == added {
		return 0
	}
	fraction := replicaSetFraction(rs, d)
	left := toAdd - added
	if toAdd > 0 {
		return min(fraction, left)
	}
	return max(fraction, left)
}

// replicaSetFraction is how much the ReplicaSet should grow (or shrink) for the Deployment's new size:
// its size scaled by new max size over the max size it was sized for.
func replicaSetFraction(rs *appsv1.ReplicaSet, d *appsv1.Deployment) int32 {
	if *d.Spec.Replicas == 0 {
		return -replicasOf(rs)
	}
	newMax := *d.Spec.Replicas + maxSurge(d)
	oldMax, ok := intAnnotation(rs, maxReplicasAnnotation)
	if !ok || oldMax == 0 {
		// Annotation edited away: fall back on the Deployment's current size.
		oldMax = d.Status.Replicas
		if oldMax == 0 {
			return 0
		}
	}
	size := float64(replicasOf(rs)*newMax) / float64(oldMax)
	return int32(math.Round(size)) - replicasOf(rs)
}

// replicaSetsToCleanUp picks the old ReplicaSets to delete so that at most limit remain: the lowest
// revisions first, and only those scaled to zero, with no pods, whose controller has seen that (a
// ReplicaSet still scaling down is kept, and looked at again on a later sync), and not already going.
func replicaSetsToCleanUp(oldRSs []*appsv1.ReplicaSet, limit int32) []*appsv1.ReplicaSet {
	var alive []*appsv1.ReplicaSet
	for _, rs := range oldRSs {
		if rs != nil && rs.DeletionTimestamp == nil {
			alive = append(alive, rs)
		}
	}
	diff := len(alive) - int(limit)
	if diff <= 0 {
		return nil
	}
	sort.SliceStable(alive, func(i, j int) bool {
		ri, rj := revision(alive[i]), revision(alive[j])
		if ri != rj {
			return ri < rj
		}
		return olderReplicaSet(alive[i], alive[j])
	})
	var out []*appsv1.ReplicaSet
	for _, rs := range alive[:diff] {
		if rs.Status.Replicas != 0 || replicasOf(rs) != 0 || rs.Generation > rs.Status.ObservedGeneration {
			continue
		}
		out = append(out, rs)
	}
	return out
}

// Status and conditions.

func deploymentCondition(status appsv1.DeploymentStatus, t appsv1.DeploymentConditionType) *appsv1.DeploymentCondition {
	for i := range status.Conditions {
		if status.Conditions[i].Type == t {
			return &status.Conditions[i]
		}
	}
	return nil
}

func newDeploymentCondition(t appsv1.DeploymentConditionType, status corev1.ConditionStatus, reason, message string, now time.Time) appsv1.DeploymentCondition {
	return appsv1.DeploymentCondition{Type: t, Status: status, Reason: reason, Message: message,
		LastUpdateTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)}
}

// setDeploymentCondition sets a condition as Kubernetes does: one with the same status and reason is left
// as it is (times included); one with the same status keeps its transition time.
func setDeploymentCondition(status *appsv1.DeploymentStatus, c appsv1.DeploymentCondition) {
	cur := deploymentCondition(*status, c.Type)
	if cur != nil && cur.Status == c.Status && cur.Reason == c.Reason {
		return
	}
	if cur != nil && cur.Status == c.Status {
		c.LastTransitionTime = cur.LastTransitionTime
	}
	removeDeploymentCondition(status, c.Type)
	status.Conditions = append(status.Conditions, c)
}

func removeDeploymentCondition(status *appsv1.DeploymentStatus, t appsv1.DeploymentConditionType) {
	var kept []appsv1.DeploymentCondition
	for _, c := range status.Conditions {
		if c.Type != t {
			kept = append(kept, c)
		}
	}
	status.Conditions = kept
}

func hasProgressDeadline(d *appsv1.Deployment) bool {
	return d.Spec.ProgressDeadlineSeconds != nil && *d.Spec.ProgressDeadlineSeconds != math.MaxInt32
}

// calculateStatus is the Deployment's status from its ReplicaSets' (newRS may be nil): the counts, and the
// Available condition, true while no more than maxUnavailable pods are unavailable. Other conditions are
// carried over.
func calculateStatus(allRSs []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet, d *appsv1.Deployment, now time.Time) appsv1.DeploymentStatus {
	available := sumReplicaSets(allRSs, availableReplicas)
	status := appsv1.DeploymentStatus{
		ObservedGeneration:  d.Generation,
		Replicas:            sumReplicaSets(allRSs, statusReplicas),
		UpdatedReplicas:     sumReplicaSets([]*appsv1.ReplicaSet{newRS}, statusReplicas),
		ReadyReplicas:       sumReplicaSets(allRSs, readyReplicas),
		AvailableReplicas:   available,
		UnavailableReplicas: max(sumReplicaSets(allRSs, specReplicas)-available, 0),
		CollisionCount:      d.Status.CollisionCount,
	}
	status.Conditions = append(status.Conditions, d.Status.Conditions...)
	if available >= *d.Spec.Replicas-maxUnavailable(d) {
		setDeploymentCondition(&status, newDeploymentCondition(appsv1.DeploymentAvailable, corev1.ConditionTrue,
			reasonMinimumAvailable, "Deployment has minimum availability.", now))
	} else {
		setDeploymentCondition(&status, newDeploymentCondition(appsv1.DeploymentAvailable, corev1.ConditionFalse,
			reasonMinimumNotAvailable, "Deployment does not have minimum availability.", now))
	}
	return status
}

// deploymentComplete: every replica is updated and available, none old is left, and the status is of the
// current generation. It is what kubectl rollout status waits for.
func deploymentComplete(d *appsv1.Deployment, s *appsv1.DeploymentStatus) bool {
	return s.UpdatedReplicas == *d.Spec.Replicas && s.Replicas == *d.Spec.Replicas &&
		s.AvailableReplicas == *d.Spec.Replicas && s.ObservedGeneration >= d.Generation
}

// deploymentProgressing: the new status shows progress over the stored one.
func deploymentProgressing(d *appsv1.Deployment, s *appsv1.DeploymentStatus) bool {
	old := d.Status
	return s.UpdatedReplicas > old.UpdatedReplicas || s.Replicas-s.UpdatedReplicas < old.Replicas-old.UpdatedReplicas ||
		s.ReadyReplicas > old.ReadyReplicas || s.AvailableReplicas > old.AvailableReplicas
}

// deploymentTimedOut: no progress reported for progressDeadlineSeconds since the Progressing condition was
// last updated. A completed rollout never times out.
func deploymentTimedOut(d *appsv1.Deployment, s *appsv1.DeploymentStatus, now time.Time) bool {
	if !hasProgressDeadline(d) {
		return false
	}
	c := deploymentCondition(*s, appsv1.DeploymentProgressing)
	if c == nil || c.Reason == reasonNewRSAvailable {
		return false
	}
	if c.Reason == reasonTimedOut {
		return true
	}
	return c.LastUpdateTime.Add(time.Duration(*d.Spec.ProgressDeadlineSeconds) * time.Second).Before(now)
}

// rolloutStatus is calculateStatus plus the Progressing condition of a rollout under way: complete
// (NewReplicaSetAvailable), progressing (ReplicaSetUpdated, its update time moved on), or past its deadline
// (ProgressDeadlineExceeded); and the ReplicaFailure condition of the ReplicaSets, the new one's first.
func rolloutStatus(allRSs []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet, d *appsv1.Deployment, now time.Time) appsv1.DeploymentStatus {
	status := calculateStatus(allRSs, newRS, d, now)
	if !hasProgressDeadline(d) {
		removeDeploymentCondition(&status, appsv1.DeploymentProgressing)
	}
	cur := deploymentCondition(d.Status, appsv1.DeploymentProgressing)
	complete := status.Replicas == status.UpdatedReplicas && cur != nil && cur.Reason == reasonNewRSAvailable
	if hasProgressDeadline(d) && !complete {
		subject := fmt.Sprintf("Deployment %q", d.Name)
		if newRS != nil {
			subject = fmt.Sprintf("ReplicaSet %q", newRS.Name)
		}
		switch {
		case deploymentComplete(d, &status):
			setDeploymentCondition(&status, newDeploymentCondition(appsv1.DeploymentProgressing, corev1.ConditionTrue,
				reasonNewRSAvailable, subject+" has successfully progressed.", now))
		case deploymentProgressing(d, &status):
			// Progress moves lastUpdateTime on even with the same reason, which setDeploymentCondition
			// would not do: the deadline counts from the last progress.
			c := newDeploymentCondition(appsv1.DeploymentProgressing, corev1.ConditionTrue, reasonRSUpdated, subject+" is progressing.", now)
			if cur != nil {
				if cur.Status == corev1.ConditionTrue {
					c.LastTransitionTime = cur.LastTransitionTime
				}
				removeDeploymentCondition(&status, appsv1.DeploymentProgressing)
			}
			setDeploymentCondition(&status, c)
		case deploymentTimedOut(d, &status, now):
			setDeploymentCondition(&status, newDeploymentCondition(appsv1.DeploymentProgressing, corev1.ConditionFalse,
				reasonTimedOut, subject+" has timed out progressing.", now))
		}
	}
	if failure := replicaFailure(allRSs, newRS); failure != nil {
		setDeploymentCondition(&status, *failure)
	} else {
		removeDeploymentCondition(&status, appsv1.DeploymentReplicaFailure)
	}
	return status
}

// replicaFailure is a ReplicaSet's ReplicaFailure condition as the Deployment's, the new ReplicaSet's first.
func replicaFailure(allRSs []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) *appsv1.DeploymentCondition {
	for _, rs := range append([]*appsv1.ReplicaSet{newRS}, allRSs...) {
		if rs == nil {
			continue
		}
		for _, c := range rs.Status.Conditions {
			if c.Type == appsv1.ReplicaSetReplicaFailure {
				return &appsv1.DeploymentCondition{Type: appsv1.DeploymentReplicaFailure, Status: c.Status, Reason: c.Reason,
					Message: c.Message, LastUpdateTime: c.LastTransitionTime, LastTransitionTime: c.LastTransitionTime}
			}
		}
	}
	return nil
}

// untilDeadline is when to look again at a rollout that has shown no progress, to mark it timed out; 0
// when there is nothing to wait for (no deadline, no Progressing condition, complete, or already timed out).
func untilDeadline(d *appsv1.Deployment, s *appsv1.DeploymentStatus, now time.Time) time.Duration {
	c := deploymentCondition(d.Status, appsv1.DeploymentProgressing)
	if !hasProgressDeadline(d) || c == nil || deploymentComplete(d, s) || c.Reason == reasonTimedOut {
		return 0
	}
	after := c.LastUpdateTime.Add(time.Duration(*d.Spec.ProgressDeadlineSeconds) * time.Second).Sub(now)
	return max(after, 0) + time.Second
}
