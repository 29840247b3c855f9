package controller

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var deployNow = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func testDeployment(replicas int32, surge, unavailable intstr.IntOrString) *appsv1.Deployment {
	limit, deadline := int32(10), int32(600)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "d-uid", Generation: 1},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx:1.27"}}},
			},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: &surge, MaxUnavailable: &unavailable}},
			RevisionHistoryLimit:    &limit,
			ProgressDeadlineSeconds: &deadline,
		},
	}
}

// deploymentRS builds one of the Deployment's ReplicaSets with spec.replicas and available pods (all
// reported in the status), created age ago; each option changes one more thing.
func deploymentRS(name string, replicas, available int32, age time.Duration, opts ...func(*appsv1.ReplicaSet)) *appsv1.ReplicaSet {
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(deployNow.Add(-age)), Annotations: map[string]string{}},
		Spec:   appsv1.ReplicaSetSpec{Replicas: &replicas},
		Status: appsv1.ReplicaSetStatus{Replicas: replicas, ReadyReplicas: available, AvailableReplicas: available},
	}
	for _, o := range opts {
		o(rs)
	}
	return rs
}

func annotated(kv ...string) func(*appsv1.ReplicaSet) {
	return func(rs *appsv1.ReplicaSet) {
		for i := 0; i < len(kv); i += 2 {
			rs.Annotations[kv[i]] = kv[i+1]
		}
	}
}

func TestDeploymentResolveFenceposts(t *testing.T) {
	cases := []struct {
		name                   string
		surge, unavailable     intstr.IntOrString
		desired                int32
		wantSurge, wantUnavail int32
	}{
		{"ints", intstr.FromInt32(2), intstr.FromInt32(1), 10, 2, 1},
		{"percentages of 10", intstr.FromString("25%"), intstr.FromString("25%"), 10, 3, 2},
		{"surge rounds up, unavailable down", intstr.FromString("25%"), intstr.FromString("25%"), 3, 1, 0},
		{"both round to zero: one may be unavailable", intstr.FromString("10%"), intstr.FromString("10%"), 1, 1, 0},
		{"both zero", intstr.FromInt32(0), intstr.FromString("0%"), 5, 0, 1},
		{"zero surge, unavailable rounds down to zero", intstr.FromInt32(0), intstr.FromString("20%"), 4, 0, 1},
		{"100%", intstr.FromString("100%"), intstr.FromString("100%"), 7, 7, 7},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, u, err := resolveFenceposts(&tc.surge, &tc.unavailable, tc.desired)
			if err != nil || s != tc.wantSurge || u != tc.wantUnavail {
				t.Errorf("got surge %d, unavailable %d, err %v; want %d, %d", s, u, err, tc.wantSurge, tc.wantUnavail)
			}
		})
	}
	bad := intstr.FromString("lots")
	if _, _, err := resolveFenceposts(&bad, nil, 3); err == nil {
		t.Error("a malformed percentage resolved")
	}
}

func TestDeploymentMaxSurgeAndUnavailable(t *testing.T) {
	quarter := intstr.FromString("25%")
	cases := []struct {
		name                 string
		d                    *appsv1.Deployment
		wantSurge, wantUnav  int32
		wantUnavailableFloor int32
	}{
		{"rolling 4", testDeployment(4, quarter, quarter), 1, 1, 3},
		{"rolling 0 replicas", testDeployment(0, quarter, quarter), 0, 0, 0},
		{"unavailable capped at replicas", testDeployment(2, intstr.FromInt32(0), intstr.FromInt32(5)), 0, 2, 0},
		{"recreate", func() *appsv1.Deployment {
			d := testDeployment(4, quarter, quarter)
			d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
			return d
		}(), 0, 0, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if s, u := maxSurge(tc.d), maxUnavailable(tc.d); s != tc.wantSurge || u != tc.wantUnav {
				t.Errorf("surge %d, unavailable %d; want %d, %d", s, u, tc.wantSurge, tc.wantUnav)
			}
		})
	}
}

func TestDeploymentTemplateHash(t *testing.T) {
	d := testDeployment(3, intstr.FromInt32(1), intstr.FromInt32(0))
	h := templateHash(&d.Spec.Template, nil)
	if h != templateHash(d.Spec.Template.DeepCopy(), nil) {
		t.Error("the hash of an equal template differs")
	}
	// The alphabet of rand.SafeEncodeString: no vowels, no look-alikes.
	if h == "" || strings.ContainsAny(h, "aeiou01l") {
		t.Errorf("hash %q is not in Kubernetes' alphabet", h)
	}
	zero, one := int32(0), int32(1)
	other := d.Spec.Template.DeepCopy()
	other.Spec.Containers[0].Image = "nginx:1.28"
	distinct := []string{h, templateHash(&d.Spec.Template, &one), templateHash(other, nil)}
	if len(slices.Compact(slices.Sorted(slices.Values(distinct)))) != 3 {
		t.Errorf("hashes should differ: %v", distinct)
	}
	// The label the ReplicaSet's copy carries changes the hash; the Deployment's template has none.
	labelled := d.Spec.Template.DeepCopy()
	labelled.Labels = withLabel(labelled.Labels, appsv1.DefaultDeploymentUniqueLabelKey, h)
	if templateHash(labelled, nil) == h || !equalIgnoreHash(labelled, &d.Spec.Template) {
		t.Error("the hash label should change the hash but not template equality")
	}
	if d.Spec.Template.Labels[appsv1.DefaultDeploymentUniqueLabelKey] != "" {
		t.Error("withLabel changed the Deployment's template")
	}
	// A zero collision count still goes into the hash (as in Kubernetes): it is not the same as none.
	if templateHash(&d.Spec.Template, &zero) == h {
		t.Error("collision count 0 hashed as no collision count")
	}
	// Stable across releases: the ReplicaSet names of existing Deployments must not change.
	if again := templateHash(&d.Spec.Template, nil); again != h {
		t.Errorf("hash changed between calls: %q then %q", h, again)
	}
}

func TestDeploymentEqualIgnoreHashAndFindNewReplicaSet(t *testing.T) {
	d := testDeployment(3, intstr.FromInt32(1), intstr.FromInt32(0))
	withTemplate := func(image string, hash string) func(*appsv1.ReplicaSet) {
		return func(rs *appsv1.ReplicaSet) {
			rs.Spec.Template = *d.Spec.Template.DeepCopy()
			rs.Spec.Template.Spec.Containers[0].Image = image
			if hash != "" {
				rs.Spec.Template.Labels = withLabel(rs.Spec.Template.Labels, appsv1.DefaultDeploymentUniqueLabelKey, hash)
			}
		}
	}
	old := deploymentRS("web-old", 3, 3, time.Hour, withTemplate("nginx:1.26", "aaa"))
	current := deploymentRS("web-cur", 0, 0, time.Minute, withTemplate("nginx:1.27", "bbb"))
	duplicate := deploymentRS("web-dup", 0, 0, time.Second, withTemplate("nginx:1.27", "ccc"))
	otherLabel := deploymentRS("web-lbl", 0, 0, 2*time.Hour, withTemplate("nginx:1.27", "ddd"), func(rs *appsv1.ReplicaSet) {
		rs.Spec.Template.Labels["extra"] = "x"
	})
	cases := []struct {
		name   string
		rsList []*appsv1.ReplicaSet
		want   string
	}{
		{"none", []*appsv1.ReplicaSet{old}, ""},
		{"the hash label is ignored", []*appsv1.ReplicaSet{old, current}, "web-cur"},
		{"other labels are not", []*appsv1.ReplicaSet{otherLabel}, ""},
		{"the oldest of two matches", []*appsv1.ReplicaSet{duplicate, current, old}, "web-cur"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := findNewReplicaSet(d, tc.rsList)
			if (got == nil && tc.want != "") || (got != nil && got.Name != tc.want) {
				t.Errorf("got %v, want %q", got, tc.want)
			}
			if got != nil {
				if olds := oldReplicaSets(tc.rsList, got); len(olds) != len(tc.rsList)-1 || slices.Contains(olds, got) {
					t.Errorf("old replica sets %v", olds)
				}
			}
		})
	}
}

func TestDeploymentSetNewReplicaSetAnnotations(t *testing.T) {
	d := testDeployment(4, intstr.FromString("25%"), intstr.FromString("25%"))
	d.Annotations = map[string]string{"team": "web", corev1.LastAppliedConfigAnnotation: "{}", revisionAnnotation: "7"}
	cases := []struct {
		name        string
		rs          *appsv1.ReplicaSet
		newRevision int64
		exists      bool
		want        map[string]string
		wantChanged bool
	}{
		{name: "a new replica set", rs: deploymentRS("n", 0, 0, 0), newRevision: 3,
			want: map[string]string{"team": "web", revisionAnnotation: "3", desiredReplicasAnnotation: "4", maxReplicasAnnotation: "5"}, wantChanged: true},
		{name: "up to date", rs: deploymentRS("n", 4, 4, 0, annotated("team", "web", revisionAnnotation, "3")), newRevision: 3, exists: true,
			want: map[string]string{"team": "web", revisionAnnotation: "3"}},
		{name: "rolled back to: the old revision goes to the history", rs: deploymentRS("n", 0, 0, 0, annotated("team", "web", revisionAnnotation, "1")),
			newRevision: 3, exists: true, want: map[string]string{"team": "web", revisionAnnotation: "3", revisionHistoryAnnotation: "1"}, wantChanged: true},
		{name: "rolled back to twice", rs: deploymentRS("n", 0, 0, 0, annotated("team", "web", revisionAnnotation, "3", revisionHistoryAnnotation, "1")),
			newRevision: 5, exists: true, want: map[string]string{"team": "web", revisionAnnotation: "5", revisionHistoryAnnotation: "1,3"}, wantChanged: true},
		{name: "a revision is never lowered", rs: deploymentRS("n", 0, 0, 0, annotated("team", "web", revisionAnnotation, "9")),
			newRevision: 3, exists: true, want: map[string]string{"team": "web", revisionAnnotation: "9"}},
		{name: "a changed deployment annotation is copied", rs: deploymentRS("n", 0, 0, 0, annotated("team", "ops", revisionAnnotation, "3")),
			newRevision: 3, exists: true, want: map[string]string{"team": "web", revisionAnnotation: "3"}, wantChanged: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			changed := setNewReplicaSetAnnotations(d, tc.rs, tc.newRevision, tc.exists)
			if changed != tc.wantChanged || !mapsEqual(tc.rs.Annotations, tc.want) {
				t.Errorf("changed %v, annotations %v; want %v, %v", changed, tc.rs.Annotations, tc.wantChanged, tc.want)
			}
		})
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

func TestDeploymentMaxRevisionAndHistory(t *testing.T) {
	rss := []*appsv1.ReplicaSet{
		deploymentRS("a", 0, 0, 0, annotated(revisionAnnotation, "2")),
		deploymentRS("b", 0, 0, 0, annotated(revisionAnnotation, "10")),
		deploymentRS("c", 0, 0, 0, annotated(revisionAnnotation, "junk")),
		deploymentRS("d", 0, 0, 0),
	}
	if got := maxRevision(rss); got != 10 {
		t.Errorf("max revision %d, want 10 (numeric, not lexical)", got)
	}
	if got := maxRevision(nil); got != 0 {
		t.Errorf("max revision of none %d", got)
	}
	long := strings.Repeat("1234,", 399) + "1234" // 1999 characters
	if got := appendRevisionHistory(long, "99"); len(got) > maxRevisionHistoryChars || !strings.HasSuffix(got, ",99") {
		t.Errorf("history of %d characters ending %q", len(got), got[len(got)-5:])
	}
}

func TestDeploymentNewRSReplicas(t *testing.T) {
	d := testDeployment(4, intstr.FromInt32(1), intstr.FromInt32(1))
	cases := []struct {
		name   string
		newRS  *appsv1.ReplicaSet
		oldRSs []*appsv1.ReplicaSet
		want   int32
	}{
		{"surge room for one", deploymentRS("new", 0, 0, 0), []*appsv1.ReplicaSet{deploymentRS("old", 4, 4, time.Hour)}, 1},
		{"no room", deploymentRS("new", 1, 0, 0), []*appsv1.ReplicaSet{deploymentRS("old", 4, 4, time.Hour)}, 1},
		{"room after the old shrank", deploymentRS("new", 1, 0, 0), []*appsv1.ReplicaSet{deploymentRS("old", 3, 3, time.Hour)}, 2},
		{"never beyond spec.replicas", deploymentRS("new", 3, 3, 0), []*appsv1.ReplicaSet{deploymentRS("old", 0, 0, time.Hour)}, 4},
		{"old pods still being deleted count against the surge", deploymentRS("new", 1, 0, 0),
			[]*appsv1.ReplicaSet{deploymentRS("old", 3, 3, time.Hour, func(rs *appsv1.ReplicaSet) { rs.Status.Replicas = 4 })}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			all := append(slices.Clone(tc.oldRSs), tc.newRS)
			if got := newRSReplicas(d, all, tc.newRS); got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
		})
	}
	recreate := testDeployment(4, intstr.FromInt32(1), intstr.FromInt32(1))
	recreate.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	if got := newRSReplicas(recreate, nil, deploymentRS("new", 0, 0, 0)); got != 4 {
		t.Errorf("recreate: %d", got)
	}
}

// TestDeploymentProportionalSizes: a rollout of 10 (surge 3) has 8 old and 5 new replicas, both sized for a maximum
// of 13, when spec.replicas changes.
func TestDeploymentProportionalSizes(t *testing.T) {
	rollout := func() []*appsv1.ReplicaSet {
		return []*appsv1.ReplicaSet{
			deploymentRS("old", 8, 8, time.Hour, annotated(maxReplicasAnnotation, "13", desiredReplicasAnnotation, "10")),
			deploymentRS("new", 5, 0, time.Minute, annotated(maxReplicasAnnotation, "13", desiredReplicasAnnotation, "10")),
		}
	}
	cases := []struct {
		name     string
		replicas int32
		rss      []*appsv1.ReplicaSet
		want     map[string]int32
		wantOp   string
	}{
		{"up to 20", 20, rollout(), map[string]int32{"old": 14, "new": 9}, "up"},
		{"down to 5", 5, rollout(), map[string]int32{"old": 5, "new": 3}, "down"},
		{"down to 0", 0, rollout(), map[string]int32{"old": 0, "new": 0}, "down"},
		{"unchanged", 10, rollout(), map[string]int32{"old": 8, "new": 5}, ""},
		{"rounding leftover to the largest, newer first on ties", 4, []*appsv1.ReplicaSet{
			deploymentRS("a", 2, 2, time.Hour, annotated(maxReplicasAnnotation, "5")),
			deploymentRS("b", 2, 2, time.Minute, annotated(maxReplicasAnnotation, "5")),
		}, map[string]int32{"a": 3, "b": 4}, "up"},
		{"no annotation: the status size is the base", 20, []*appsv1.ReplicaSet{
			deploymentRS("old", 8, 8, time.Hour), deploymentRS("new", 5, 0, time.Minute)}, map[string]int32{"old": 14, "new": 9}, "up"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := testDeployment(tc.replicas, intstr.FromInt32(3), intstr.FromInt32(1))
			d.Status.Replicas = 13
			sizes, op := proportionalSizes(d, tc.rss)
			var total int32
			for _, v := range sizes {
				total += v
			}
			if op != tc.wantOp || len(sizes) != len(tc.want) {
				t.Fatalf("sizes %v, operation %q; want %v, %q", sizes, op, tc.want, tc.wantOp)
			}
			for k, v := range tc.want {
				if sizes[k] != v {
					t.Errorf("sizes %v, want %v", sizes, tc.want)
					break
				}
			}
			if tc.replicas > 0 && tc.wantOp != "" && total != tc.replicas+3 {
				t.Errorf("total %d, want replicas plus surge %d", total, tc.replicas+3)
			}
		})
	}
}

func TestDeploymentReplicaSetsToCleanUp(t *testing.T) {
	rev := func(r string) func(*appsv1.ReplicaSet) { return annotated(revisionAnnotation, r) }
	deleting := func(rs *appsv1.ReplicaSet) { rs.DeletionTimestamp = &metav1.Time{Time: deployNow} }
	unobserved := func(rs *appsv1.ReplicaSet) { rs.Generation, rs.Status.ObservedGeneration = 2, 1 }
	cases := []struct {
		name  string
		old   []*appsv1.ReplicaSet
		limit int32
		want  []string
	}{
		{"within the limit", []*appsv1.ReplicaSet{deploymentRS("a", 0, 0, 0, rev("1"))}, 1, nil},
		{"lowest revisions first, not oldest", []*appsv1.ReplicaSet{
			deploymentRS("a", 0, 0, 3*time.Hour, rev("3")), deploymentRS("b", 0, 0, 2*time.Hour, rev("1")),
			deploymentRS("c", 0, 0, time.Hour, rev("2"))}, 1, []string{"b", "c"}},
		{"numeric revisions", []*appsv1.ReplicaSet{deploymentRS("a", 0, 0, 0, rev("10")), deploymentRS("b", 0, 0, 0, rev("9"))}, 1, []string{"b"}},
		{"one with replicas is kept, not replaced by the next", []*appsv1.ReplicaSet{
			deploymentRS("a", 2, 2, 0, rev("1")), deploymentRS("b", 0, 0, 0, rev("2")), deploymentRS("c", 0, 0, 0, rev("3"))}, 1, []string{"b"}},
		{"pods still reported", []*appsv1.ReplicaSet{
			deploymentRS("a", 0, 0, 0, rev("1"), func(rs *appsv1.ReplicaSet) { rs.Status.Replicas = 1 }), deploymentRS("b", 0, 0, 0, rev("2"))}, 1, nil},
		{"scale-down not yet observed", []*appsv1.ReplicaSet{deploymentRS("a", 0, 0, 0, rev("1"), unobserved), deploymentRS("b", 0, 0, 0, rev("2"))}, 1, nil},
		{"ones being deleted neither count nor go again", []*appsv1.ReplicaSet{
			deploymentRS("a", 0, 0, 0, rev("1"), deleting), deploymentRS("b", 0, 0, 0, rev("2")), deploymentRS("c", 0, 0, 0, rev("3"))}, 1, []string{"b"}},
		{"limit zero", []*appsv1.ReplicaSet{deploymentRS("a", 0, 0, 0, rev("1")), deploymentRS("b", 0, 0, 0, rev("2"))}, 0, []string{"a", "b"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, rs := range replicaSetsToCleanUp(tc.old, tc.limit) {
				got = append(got, rs.Name)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestDeploymentRolloutStatus(t *testing.T) {
	progressing := func(reason string, updated time.Time) appsv1.DeploymentCondition {
		return appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: reason,
			LastUpdateTime: metav1.NewTime(updated), LastTransitionTime: metav1.NewTime(updated.Add(-time.Hour))}
	}
	cases := []struct {
		name            string
		status          appsv1.DeploymentStatus // the stored status
		newRS           *appsv1.ReplicaSet
		oldRSs          []*appsv1.ReplicaSet
		want            appsv1.DeploymentStatus // counts only
		wantAvailable   corev1.ConditionStatus
		wantProgressing string
		wantRecheck     bool
	}{
		{name: "complete", status: appsv1.DeploymentStatus{Conditions: []appsv1.DeploymentCondition{progressing(reasonRSUpdated, deployNow)}},
			newRS: deploymentRS("new", 3, 3, 0), oldRSs: []*appsv1.ReplicaSet{deploymentRS("old", 0, 0, time.Hour)},
			want:          appsv1.DeploymentStatus{Replicas: 3, UpdatedReplicas: 3, ReadyReplicas: 3, AvailableReplicas: 3},
			wantAvailable: corev1.ConditionTrue, wantProgressing: reasonNewRSAvailable},
		{name: "progress made", status: appsv1.DeploymentStatus{Replicas: 3, UpdatedReplicas: 0, AvailableReplicas: 3,
			Conditions: []appsv1.DeploymentCondition{progressing(reasonNewRSCreated, deployNow.Add(-time.Minute))}},
			newRS: deploymentRS("new", 1, 0, 0), oldRSs: []*appsv1.ReplicaSet{deploymentRS("old", 3, 3, time.Hour)},
			want:          appsv1.DeploymentStatus{Replicas: 4, UpdatedReplicas: 1, ReadyReplicas: 3, AvailableReplicas: 3, UnavailableReplicas: 1},
			wantAvailable: corev1.ConditionTrue, wantProgressing: reasonRSUpdated, wantRecheck: true},
		{name: "stuck, deadline ahead: look again", status: appsv1.DeploymentStatus{Replicas: 4, UpdatedReplicas: 1, ReadyReplicas: 3, AvailableReplicas: 3, UnavailableReplicas: 1,
			Conditions: []appsv1.DeploymentCondition{progressing(reasonRSUpdated, deployNow.Add(-time.Minute))}},
			newRS: deploymentRS("new", 1, 0, 0), oldRSs: []*appsv1.ReplicaSet{deploymentRS("old", 3, 3, time.Hour)},
			want:          appsv1.DeploymentStatus{Replicas: 4, UpdatedReplicas: 1, ReadyReplicas: 3, AvailableReplicas: 3, UnavailableReplicas: 1},
			wantAvailable: corev1.ConditionTrue, wantProgressing: reasonRSUpdated, wantRecheck: true},
		{name: "stuck past the deadline", status: appsv1.DeploymentStatus{Replicas: 4, UpdatedReplicas: 1, ReadyReplicas: 3, AvailableReplicas: 3,
			Conditions: []appsv1.DeploymentCondition{progressing(reasonRSUpdated, deployNow.Add(-11*time.Minute))}},
			newRS: deploymentRS("new", 1, 0, 0), oldRSs: []*appsv1.ReplicaSet{deploymentRS("old", 3, 3, time.Hour)},
			want:          appsv1.DeploymentStatus{Replicas: 4, UpdatedReplicas: 1, ReadyReplicas: 3, AvailableReplicas: 3, UnavailableReplicas: 1},
			wantAvailable: corev1.ConditionTrue, wantProgressing: reasonTimedOut},
		{name: "below the availability floor", status: appsv1.DeploymentStatus{Conditions: []appsv1.DeploymentCondition{progressing(reasonNewRSCreated, deployNow)}},
			newRS: deploymentRS("new", 3, 1, 0),
			want:  appsv1.DeploymentStatus{Replicas: 3, UpdatedReplicas: 3, ReadyReplicas: 1, AvailableReplicas: 1, UnavailableReplicas: 2},
			// No progress over the stored status (which counts nothing)? It counts more ready: progress.
			wantAvailable: corev1.ConditionFalse, wantProgressing: reasonRSUpdated, wantRecheck: true},
		{name: "no new replica set yet (Recreate)", status: appsv1.DeploymentStatus{Replicas: 3, AvailableReplicas: 3,
			Conditions: []appsv1.DeploymentCondition{progressing(reasonRSUpdated, deployNow)}},
			oldRSs:        []*appsv1.ReplicaSet{deploymentRS("old", 0, 0, time.Hour)},
			want:          appsv1.DeploymentStatus{},
			wantAvailable: corev1.ConditionFalse, wantProgressing: reasonRSUpdated, wantRecheck: true}, // old replicas went: progress
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := testDeployment(3, intstr.FromInt32(1), intstr.FromInt32(0))
			d.Status = tc.status
			all := append(slices.Clone(tc.oldRSs), tc.newRS)
			got := rolloutStatus(all, tc.newRS, d, deployNow)
			counts := got
			counts.Conditions, counts.ObservedGeneration = nil, 0
			if !reflect.DeepEqual(counts, tc.want) {
				t.Errorf("counts %+v, want %+v", counts, tc.want)
			}
			if got.ObservedGeneration != d.Generation {
				t.Errorf("observedGeneration %d", got.ObservedGeneration)
			}
			if c := deploymentCondition(got, appsv1.DeploymentAvailable); c == nil || c.Status != tc.wantAvailable {
				t.Errorf("Available %+v, want %s", c, tc.wantAvailable)
			}
			if c := deploymentCondition(got, appsv1.DeploymentProgressing); c == nil || c.Reason != tc.wantProgressing {
				t.Errorf("Progressing %+v, want %s", c, tc.wantProgressing)
			}
			// Once written, the status asks for a look at the deadline unless the rollout is over.
			d.Status = got
			if recheck := untilDeadline(d, &got, deployNow); (recheck > 0) != tc.wantRecheck {
				t.Errorf("recheck in %v, want one: %v", recheck, tc.wantRecheck)
			}
		})
	}
}

func TestDeploymentSetDeploymentCondition(t *testing.T) {
	then, now := deployNow.Add(-time.Hour), deployNow
	status := appsv1.DeploymentStatus{}
	setDeploymentCondition(&status, newDeploymentCondition(appsv1.DeploymentAvailable, corev1.ConditionTrue, reasonMinimumAvailable, "a", then))
	setDeploymentCondition(&status, newDeploymentCondition(appsv1.DeploymentAvailable, corev1.ConditionTrue, reasonMinimumAvailable, "b", now))
	if c := status.Conditions[0]; c.Message != "a" || !c.LastUpdateTime.Time.Equal(then) {
		t.Errorf("same status and reason should leave the condition alone: %+v", c)
	}
	setDeploymentCondition(&status, newDeploymentCondition(appsv1.DeploymentAvailable, corev1.ConditionTrue, "Other", "c", now))
	if c := status.Conditions[0]; len(status.Conditions) != 1 || c.Reason != "Other" || !c.LastTransitionTime.Time.Equal(then) || !c.LastUpdateTime.Time.Equal(now) {
		t.Errorf("a new reason keeps the transition time: %+v", status.Conditions)
	}
	setDeploymentCondition(&status, newDeploymentCondition(appsv1.DeploymentAvailable, corev1.ConditionFalse, reasonMinimumNotAvailable, "d", now))
	if c := status.Conditions[0]; !c.LastTransitionTime.Time.Equal(now) {
		t.Errorf("a new status moves the transition time: %+v", c)
	}
}
