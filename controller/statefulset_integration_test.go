package controller_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// neverReady labels the pods that stsKubelets leave Pending.
const neverReady = "never-ready"

func statefulSet(ns, name string, replicas int32, mutate func(*appsv1.StatefulSet)) *appsv1.StatefulSet {
	set := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    &replicas,
			ServiceName: "svc",
			Selector:    &metav1.LabelSelector{MatchLabels: map[string]string{"sts": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"sts": name}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.local/web:1"}},
					TerminationGracePeriodSeconds: new(int64(1))},
			},
		},
	}
	if mutate != nil {
		mutate(set)
	}
	return set
}

// stsKubelets stand in for node agents: a bound pod of the namespace becomes Running and Ready a little
// after it is bound (unless labelled never-ready), and a pod being deleted is confirmed gone at once. Pods
// are told apart by UID, since a StatefulSet's replacement pod has the old one's name.
type stsKubelets struct {
	c     kubernetes.Interface
	delay time.Duration

	mu      sync.Mutex
	started map[types.UID]bool
}

func startStsKubelets(t *testing.T, c kubernetes.Interface, ns string, delay time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := c.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	k := &stsKubelets{c: c, delay: delay, started: map[types.UID]bool{}}
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); w.Stop(); wg.Wait() })
	wg.Go(func() {
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			switch {
			case pod.DeletionTimestamp != nil:
				zero := int64(0)
				err := c.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero,
					Preconditions: &metav1.Preconditions{UID: &pod.UID}})
				if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil {
					t.Errorf("confirming the deletion of %s: %v", pod.Name, err)
				}
			case pod.Spec.NodeName != "" && pod.Status.Phase == corev1.PodPending && pod.Labels[neverReady] == "" && k.start(pod.UID):
				wg.Go(func() {
					select {
					case <-ctx.Done():
						return
					case <-time.After(k.delay):
					}
					k.run(ctx, t, pod)
				})
			}
		}
	})
}

// start reports whether the pod was not started before, and marks it started.
func (k *stsKubelets) start(uid types.UID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.started[uid] {
		return false
	}
	k.started[uid] = true
	return true
}

// run makes the pod Running and Ready now, if it is still the same pod.
func (k *stsKubelets) run(ctx context.Context, t *testing.T, p *corev1.Pod) {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := k.c.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil || pod.UID != p.UID {
			return err
		}
		now := metav1.Now()
		pod.Status.Phase = corev1.PodRunning
		pod.Status.Conditions = slices.DeleteFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodReady })
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now})
		_, err = k.c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		t.Errorf("marking %s Ready: %v", p.Name, err)
	}
}

// setPods are the live pods of a StatefulSet by name.
func setPods(t *testing.T, c kubernetes.Interface, ns, name string) map[string]corev1.Pod {
	t.Helper()
	list, err := c.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "sts=" + name})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]corev1.Pod{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out[p.Name] = p
		}
	}
	return out
}

// describePods is "name:image:ready" of each pod, sorted.
func describePods(pods map[string]corev1.Pod) string {
	var out []string
	for _, p := range pods {
		out = append(out, fmt.Sprintf("%s:%s:%v", p.Name, strings.TrimPrefix(p.Spec.Containers[0].Image, "registry.local/"), podReady(&p)))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// waitForSetPods waits until the set's live pods are described as want.
func waitForSetPods(t *testing.T, c kubernetes.Interface, ns, name, want string) map[string]corev1.Pod {
	t.Helper()
	var pods map[string]corev1.Pod
	waitFor(t, fmt.Sprintf("%s's pods %s", name, want), func() (bool, string) {
		pods = setPods(t, c, ns, name)
		got := describePods(pods)
		return got == want, got
	})
	return pods
}

// holdSetPods checks for two seconds that the set's live pods stay described as want.
func holdSetPods(t *testing.T, c kubernetes.Interface, ns, name, want string) {
	t.Helper()
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if got := describePods(setPods(t, c, ns, name)); got != want {
			t.Fatalf("%s's pods %s, want %s", name, got, want)
		}
	}
}

// changeSet gets the StatefulSet afresh, changes it and updates it, again on a conflict (the controller
// writes its status meanwhile).
func changeSet(t *testing.T, c kubernetes.Interface, ns, name string, change func(*appsv1.StatefulSet)) (*appsv1.StatefulSet, error) {
	t.Helper()
	var out *appsv1.StatefulSet
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		set, err := c.AppsV1().StatefulSets(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(set)
		out, err = c.AppsV1().StatefulSets(ns).Update(context.Background(), set, metav1.UpdateOptions{})
		return err
	})
	return out, err
}

// TestStatefulSetAPI checks that StatefulSets get Kubernetes' defaults, validation (422 with field paths),
// status rules and /scale.
func TestStatefulSetAPI(t *testing.T) {
	t.Parallel()
	p := servertest.Shared(t)
	c := p.Client
	ns := servertest.Namespace(t, p, "sts")
	ctx := context.Background()
	sets := c.AppsV1().StatefulSets(ns)

	t.Run("defaults", func(t *testing.T) {
		in := statefulSet(ns, "defaults", 0, nil)
		in.Spec.Replicas = nil
		in.Status.Replicas = 7 // a create cannot set status
		set, err := sets.Create(ctx, in, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s := set.Spec
		if s.Replicas == nil || *s.Replicas != 1 || s.PodManagementPolicy != appsv1.OrderedReadyPodManagement ||
			s.RevisionHistoryLimit == nil || *s.RevisionHistoryLimit != 10 {
			t.Errorf("replicas %v, podManagementPolicy %q, revisionHistoryLimit %v", s.Replicas, s.PodManagementPolicy, s.RevisionHistoryLimit)
		}
		if us := s.UpdateStrategy; us.Type != appsv1.RollingUpdateStatefulSetStrategyType || us.RollingUpdate == nil ||
			us.RollingUpdate.Partition == nil || *us.RollingUpdate.Partition != 0 {
			t.Errorf("updateStrategy %+v, want RollingUpdate with partition 0", us)
		}
		if p := s.PersistentVolumeClaimRetentionPolicy; p == nil || p.WhenDeleted != appsv1.RetainPersistentVolumeClaimRetentionPolicyType ||
			p.WhenScaled != appsv1.RetainPersistentVolumeClaimRetentionPolicyType {
			t.Errorf("persistentVolumeClaimRetentionPolicy %+v, want Retain/Retain", p)
		}
		if spec := s.Template.Spec; spec.RestartPolicy != corev1.RestartPolicyAlways || spec.DNSPolicy != corev1.DNSClusterFirst ||
			spec.SchedulerName != corev1.DefaultSchedulerName || spec.Containers[0].ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("template not defaulted as Kubernetes does: %+v", spec)
		}
		if set.Generation != 1 || set.Status.Replicas != 0 {
			t.Errorf("generation %d, status %+v", set.Generation, set.Status)
		}

		// A template change bumps generation and drops a status sent to the main resource; /status keeps
		// the spec.
		set, err = changeSet(t, c, ns, "defaults", func(set *appsv1.StatefulSet) {
			set.Spec.Template.Spec.Containers[0].Image = "registry.local/web:2"
			set.Status.CurrentRevision = "forged"
		})
		if err != nil {
			t.Fatal(err)
		}
		if set.Generation != 2 || set.Status.CurrentRevision == "forged" {
			t.Errorf("after a template update: generation %d, status %+v", set.Generation, set.Status)
		}
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			set, err := sets.Get(ctx, "defaults", metav1.GetOptions{})
			if err != nil {
				return err
			}
			set.Status.ObservedGeneration, set.Status.Replicas = 2, 1
			set.Spec.Template.Spec.Containers[0].Image = "registry.local/web:3"
			set, err = sets.UpdateStatus(ctx, set, metav1.UpdateOptions{})
			if err == nil && (set.Spec.Template.Spec.Containers[0].Image != "registry.local/web:2" || set.Generation != 2) {
				t.Errorf("after a status update: image %s, generation %d", set.Spec.Template.Spec.Containers[0].Image, set.Generation)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		// Kubernetes' status validation: counts are not negative.
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			set, err := sets.Get(ctx, "defaults", metav1.GetOptions{})
			if err != nil {
				return err
			}
			set.Status.ReadyReplicas = -1
			_, err = sets.UpdateStatus(ctx, set, metav1.UpdateOptions{})
			return err
		})
		if got := causes(t, err); !slices.Contains(got, "status.readyReplicas") {
			t.Errorf("negative readyReplicas: causes %v", got)
		}
		// Only replicas, template, updateStrategy, ordinals, minReadySeconds, revisionHistoryLimit and the
		// retention policy may change; the others are immutable, each named in the error.
		_, err = changeSet(t, c, ns, "defaults", func(set *appsv1.StatefulSet) { set.Spec.PodManagementPolicy = appsv1.ParallelPodManagement })
		if got := causes(t, err); !slices.Contains(got, "spec.podManagementPolicy") {
			t.Errorf("podManagementPolicy change: causes %v", got)
		}
		_, err = changeSet(t, c, ns, "defaults", func(set *appsv1.StatefulSet) { set.Spec.ServiceName = "other" })
		if got := causes(t, err); !slices.Contains(got, "spec.serviceName") {
			t.Errorf("serviceName change: causes %v", got)
		}
	})

	t.Run("scale", func(t *testing.T) {
		if _, err := sets.Create(ctx, statefulSet(ns, "scaled", 2, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		scale, err := sets.GetScale(ctx, "scaled", metav1.GetOptions{})
		if err != nil || scale.Spec.Replicas != 2 || scale.Status.Selector != "sts=scaled" {
			t.Fatalf("scale %+v, %v", scale, err)
		}
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			_, err := sets.UpdateScale(ctx, "scaled", &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: "scaled", Namespace: ns},
				Spec: autoscalingv1.ScaleSpec{Replicas: 4}}, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		set, err := sets.Get(ctx, "scaled", metav1.GetOptions{})
		if err != nil || *set.Spec.Replicas != 4 || set.Generation != 2 {
			t.Fatalf("after scaling to 4: %v, generation %d, %v", set.Spec.Replicas, set.Generation, err)
		}
	})

	t.Run("maxUnavailable kept", func(t *testing.T) {
		two := intstr.FromInt32(2)
		set, err := sets.Create(ctx, statefulSet(ns, "maxunavailable", 3, func(s *appsv1.StatefulSet) {
			s.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateStatefulSetStrategy{MaxUnavailable: &two}
		}), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ru := set.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxUnavailable == nil || *ru.MaxUnavailable != two {
			t.Errorf("rollingUpdate %+v, want maxUnavailable 2 (MaxUnavailableStatefulSet is on by default)", ru)
		}
	})

	t.Run("volumeClaimTemplates", func(t *testing.T) {
		set, err := sets.Create(ctx, statefulSet(ns, "claims", 1, func(s *appsv1.StatefulSet) {
			s.Spec.Template.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
			s.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}}
		}), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if vm := set.Spec.VolumeClaimTemplates[0].Spec.VolumeMode; vm == nil || *vm != corev1.PersistentVolumeFilesystem {
			t.Errorf("claim template's volumeMode %v, want Filesystem", vm)
		}
	})

	cases := []struct {
		name   string
		mutate func(*appsv1.StatefulSet)
		field  string
	}{
		{"selector does not match the template", func(s *appsv1.StatefulSet) { s.Spec.Template.Labels = map[string]string{"other": "x"} },
			"spec.template.metadata.labels"},
		{"no selector", func(s *appsv1.StatefulSet) { s.Spec.Selector = nil }, "spec.selector"},
		{"negative replicas", func(s *appsv1.StatefulSet) { s.Spec.Replicas = new(int32(-1)) }, "spec.replicas"},
		{"unknown podManagementPolicy", func(s *appsv1.StatefulSet) { s.Spec.PodManagementPolicy = "Sometimes" }, "spec.podManagementPolicy"},
		{"unknown update strategy", func(s *appsv1.StatefulSet) { s.Spec.UpdateStrategy.Type = "Sometimes" }, "spec.updateStrategy"},
		{"OnDelete with rollingUpdate", func(s *appsv1.StatefulSet) {
			s.Spec.UpdateStrategy = appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType,
				RollingUpdate: &appsv1.RollingUpdateStatefulSetStrategy{Partition: new(int32(1))}}
		}, "spec.updateStrategy.rollingUpdate"},
		{"negative partition", func(s *appsv1.StatefulSet) {
			s.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateStatefulSetStrategy{Partition: new(int32(-1))}
		}, "spec.updateStrategy.rollingUpdate.partition"},
		{"maxUnavailable 0", func(s *appsv1.StatefulSet) {
			zero := intstr.FromInt32(0)
			s.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateStatefulSetStrategy{MaxUnavailable: &zero}
		}, "spec.updateStrategy.rollingUpdate.maxUnavailable"},
		{"unknown retention policy", func(s *appsv1.StatefulSet) {
			s.Spec.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{WhenDeleted: "Keep",
				WhenScaled: appsv1.RetainPersistentVolumeClaimRetentionPolicyType}
		}, "spec.persistentVolumeClaimRetentionPolicy.whenDeleted"},
		{"serviceName not a DNS label", func(s *appsv1.StatefulSet) { s.Spec.ServiceName = "Not_A_Label" }, "spec.serviceName"},
		{"restartPolicy Never", func(s *appsv1.StatefulSet) { s.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever },
			"spec.template.spec.restartPolicy"},
		{"claim template without access modes", func(s *appsv1.StatefulSet) {
			s.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{Resources: corev1.VolumeResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}}
		}, "spec.volumeClaimTemplates[0].spec.accessModes"},
		{"mount of no volume nor claim", func(s *appsv1.StatefulSet) {
			s.Spec.Template.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "nothing", MountPath: "/data"}}
		}, "spec.template.spec.containers[0].volumeMounts[0].name"},
		// Kubernetes accepts it; Skiff's agents cannot mount it, so Skiff refuses it as it does for pods.
		{"unsupported volume type", func(s *appsv1.StatefulSet) {
			s.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				NFS: &corev1.NFSVolumeSource{Server: "nfs.example", Path: "/export"}}}}
		}, "spec.template.spec.volumes[0]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sets.Create(ctx, statefulSet(ns, "invalid", 1, tc.mutate), metav1.CreateOptions{})
			if got := causes(t, err); !slices.Contains(got, tc.field) {
				t.Errorf("causes %v, want %s among them", got, tc.field)
			}
		})
	}
}

// TestStatefulSetController runs Kubernetes' StatefulSet controller on a real server with a node registered
// through the API and pods made Ready by fake kubelets.
func TestStatefulSetController(t *testing.T) {
	// A server of its own: its node would take the pods of the other tests' workloads, whose deletion then
	// waits for a kubelet that is not there.
	t.Parallel()
	p := servertest.Start(t, 1)[0]
	c := p.Client
	ns := servertest.Namespace(t, p, "sts")
	ctx := context.Background()
	dsNode(t, c, "sts-a", nil)
	startStsKubelets(t, c, ns, 300*time.Millisecond)
	sets := c.AppsV1().StatefulSets(ns)

	t.Run("OrderedReady creates pods in order, each Ready before the next", func(t *testing.T) {
		w, err := c.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "sts=web"})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		if _, err := sets.Create(ctx, statefulSet(ns, "web", 3, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Each creation is seen with the pods before it Ready.
		var created []string
		ready := map[string]bool{}
		timeout := time.After(30 * time.Second)
		for len(created) < 3 || !ready["web-2"] {
			select {
			case ev := <-w.ResultChan():
				p, ok := ev.Object.(*corev1.Pod)
				if !ok {
					continue
				}
				if ev.Type == watch.Added {
					created = append(created, p.Name)
					for _, before := range created[:len(created)-1] {
						if !ready[before] {
							t.Errorf("%s created while %s was not Ready", p.Name, before)
						}
					}
				}
				ready[p.Name] = podReady(p)
			case <-timeout:
				t.Fatalf("pods created: %v, ready: %v", created, ready)
			}
		}
		if !slices.Equal(created, []string{"web-0", "web-1", "web-2"}) {
			t.Errorf("pods created in the order %v, want web-0, web-1, web-2", created)
		}
		pods := waitForSetPods(t, c, ns, "web", "web-0:web:1:true web-1:web:1:true web-2:web:1:true")
		for name, p := range pods {
			if p.Spec.Hostname != name || p.Spec.Subdomain != "svc" || p.Labels[appsv1.StatefulSetPodNameLabel] != name ||
				p.Labels[appsv1.PodIndexLabel] != strings.TrimPrefix(name, "web-") {
				t.Errorf("%s: hostname %q, subdomain %q, labels %v", name, p.Spec.Hostname, p.Spec.Subdomain, p.Labels)
			}
		}
		waitFor(t, "web's status", func() (bool, string) {
			set, err := sets.Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			s := set.Status
			return s.Replicas == 3 && s.ReadyReplicas == 3 && s.AvailableReplicas == 3 && s.CurrentReplicas == 3 &&
				s.UpdatedReplicas == 3 && s.ObservedGeneration == set.Generation && s.CurrentRevision != "" && s.CurrentRevision == s.UpdateRevision, fmt.Sprintf("%+v", s)
		})
	})

	t.Run("OrderedReady waits for a pod that never gets Ready", func(t *testing.T) {
		if _, err := sets.Create(ctx, statefulSet(ns, "stuck", 3, func(s *appsv1.StatefulSet) { s.Spec.Template.Labels[neverReady] = "x" }), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitForSetPods(t, c, ns, "stuck", "stuck-0:web:1:false")
		holdSetPods(t, c, ns, "stuck", "stuck-0:web:1:false")
	})

	t.Run("Parallel creates all pods at once", func(t *testing.T) {
		if _, err := sets.Create(ctx, statefulSet(ns, "par", 3, func(s *appsv1.StatefulSet) {
			s.Spec.PodManagementPolicy = appsv1.ParallelPodManagement
			s.Spec.Template.Labels[neverReady] = "x"
		}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitForSetPods(t, c, ns, "par", "par-0:web:1:false par-1:web:1:false par-2:web:1:false")
	})

	t.Run("a deleted pod comes back with its name", func(t *testing.T) {
		old := setPods(t, c, ns, "web")["web-1"]
		if err := c.CoreV1().Pods(ns).Delete(ctx, "web-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a new web-1", func() (bool, string) {
			p, ok := setPods(t, c, ns, "web")["web-1"]
			return ok && p.UID != old.UID && podReady(&p), fmt.Sprintf("web-1 %s ready %v", p.UID, podReady(&p))
		})
		waitForSetPods(t, c, ns, "web", "web-0:web:1:true web-1:web:1:true web-2:web:1:true")
	})

	t.Run("rolling update with a partition updates only the ordinals at or above it", func(t *testing.T) {
		if _, err := changeSet(t, c, ns, "web", func(s *appsv1.StatefulSet) {
			s.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateStatefulSetStrategy{Partition: new(int32(2))}
			s.Spec.Template.Spec.Containers[0].Image = "registry.local/web:2"
		}); err != nil {
			t.Fatal(err)
		}
		waitForSetPods(t, c, ns, "web", "web-0:web:1:true web-1:web:1:true web-2:web:2:true")
		holdSetPods(t, c, ns, "web", "web-0:web:1:true web-1:web:1:true web-2:web:2:true")
		waitFor(t, "web's status during the partition", func() (bool, string) {
			set, err := sets.Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			s := set.Status
			return s.UpdatedReplicas == 1 && s.CurrentReplicas == 2 && s.CurrentRevision != s.UpdateRevision && s.ReadyReplicas == 3, fmt.Sprintf("%+v", s)
		})

		// Partition 0: the rest follow, from the highest ordinal down, one at a time.
		w, err := c.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "sts=web"})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		if _, err := changeSet(t, c, ns, "web", func(s *appsv1.StatefulSet) { s.Spec.UpdateStrategy.RollingUpdate.Partition = new(int32(0)) }); err != nil {
			t.Fatal(err)
		}
		var deleted []string
		timeout := time.After(30 * time.Second)
		for len(deleted) < 2 {
			select {
			case ev := <-w.ResultChan():
				if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Deleted {
					deleted = append(deleted, p.Name)
				}
			case <-timeout:
				t.Fatalf("pods replaced: %v", deleted)
			}
		}
		if !slices.Equal(deleted, []string{"web-1", "web-0"}) {
			t.Errorf("pods replaced in the order %v, want web-1, web-0", deleted)
		}
		waitForSetPods(t, c, ns, "web", "web-0:web:2:true web-1:web:2:true web-2:web:2:true")
		waitFor(t, "web rolled out", func() (bool, string) {
			set, err := sets.Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			s := set.Status
			return s.UpdatedReplicas == 3 && s.CurrentReplicas == 3 && s.CurrentRevision == s.UpdateRevision, fmt.Sprintf("%+v", s)
		})
		revs, err := c.AppsV1().ControllerRevisions(ns).List(ctx, metav1.ListOptions{LabelSelector: "sts=web"})
		if err != nil || len(revs.Items) != 2 {
			t.Fatalf("web's ControllerRevisions: %d, %v", len(revs.Items), err)
		}
	})

	t.Run("maxUnavailable replaces that many pods at a time", func(t *testing.T) {
		two := intstr.FromInt32(2)
		if _, err := sets.Create(ctx, statefulSet(ns, "wide", 4, func(s *appsv1.StatefulSet) {
			s.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateStatefulSetStrategy{MaxUnavailable: &two}
		}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitForSetPods(t, c, ns, "wide", "wide-0:web:1:true wide-1:web:1:true wide-2:web:1:true wide-3:web:1:true")
		// Watch the pods: count those not Ready (or gone) at each moment.
		list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "sts=wide"})
		if err != nil {
			t.Fatal(err)
		}
		w, err := c.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "sts=wide", ResourceVersion: list.ResourceVersion})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		worst := make(chan int, 1)
		go func() {
			ready := map[string]bool{"wide-0": true, "wide-1": true, "wide-2": true, "wide-3": true}
			most := 0
			for ev := range w.ResultChan() {
				if p, ok := ev.Object.(*corev1.Pod); ok {
					ready[p.Name] = ev.Type != watch.Deleted && p.DeletionTimestamp == nil && podReady(p)
					down := 0
					for _, r := range ready {
						if !r {
							down++
						}
					}
					most = max(most, down)
				}
			}
			worst <- most
		}()
		if _, err := changeSet(t, c, ns, "wide", func(s *appsv1.StatefulSet) { s.Spec.Template.Spec.Containers[0].Image = "registry.local/web:2" }); err != nil {
			t.Fatal(err)
		}
		waitForSetPods(t, c, ns, "wide", "wide-0:web:2:true wide-1:web:2:true wide-2:web:2:true wide-3:web:2:true")
		w.Stop()
		if n := <-worst; n != 2 {
			t.Errorf("at most %d of 4 pods were unavailable during the update, want 2 (maxUnavailable)", n)
		}
	})

	t.Run("OnDelete replaces only deleted pods", func(t *testing.T) {
		if _, err := changeSet(t, c, ns, "web", func(s *appsv1.StatefulSet) {
			s.Spec.UpdateStrategy = appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType}
			s.Spec.Template.Spec.Containers[0].Image = "registry.local/web:3"
		}); err != nil {
			t.Fatal(err)
		}
		holdSetPods(t, c, ns, "web", "web-0:web:2:true web-1:web:2:true web-2:web:2:true")
		if err := c.CoreV1().Pods(ns).Delete(ctx, "web-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitForSetPods(t, c, ns, "web", "web-0:web:2:true web-1:web:3:true web-2:web:2:true")
	})

	t.Run("scale down removes the highest ordinal first", func(t *testing.T) {
		w, err := c.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "sts=web"})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		if _, err := changeSet(t, c, ns, "web", func(s *appsv1.StatefulSet) { s.Spec.Replicas = new(int32(1)) }); err != nil {
			t.Fatal(err)
		}
		var deleted []string
		timeout := time.After(30 * time.Second)
		for len(deleted) < 2 {
			select {
			case ev := <-w.ResultChan():
				if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Deleted {
					deleted = append(deleted, p.Name)
				}
			case <-timeout:
				t.Fatalf("pods removed: %v", deleted)
			}
		}
		if !slices.Equal(deleted, []string{"web-2", "web-1"}) {
			t.Errorf("pods removed in the order %v, want web-2, web-1", deleted)
		}
		waitForSetPods(t, c, ns, "web", "web-0:web:2:true")
	})

	// The agents do not mount claims yet: the controller creates the claim of each ordinal, its pods are
	// refused (FailedCreate), and the controller goes on with other sets.
	t.Run("volumeClaimTemplates: a claim per pod, with the default class, mounted by the pod", func(t *testing.T) {
		_, err := sets.Create(ctx, statefulSet(ns, "claims", 2, func(s *appsv1.StatefulSet) {
			s.Spec.Template.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
			s.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}}
		}), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the claim data-claims-0", func() (bool, string) {
			pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data-claims-0", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			class := ""
			if pvc.Spec.StorageClassName != nil {
				class = *pvc.Spec.StorageClassName
			}
			return pvc.Labels["sts"] == "claims" && class == "local-path", fmt.Sprintf("labels %v, class %q", pvc.Labels, class)
		})
		waitFor(t, "pod claims-0 with its claim", func() (bool, string) {
			pod, err := c.CoreV1().Pods(ns).Get(ctx, "claims-0", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, v := range pod.Spec.Volumes {
				if v.Name == "data" && v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == "data-claims-0" {
					return true, ""
				}
			}
			return false, fmt.Sprintf("volumes %v", pod.Spec.Volumes)
		})
		// The controller still serves the others.
		if _, err := changeSet(t, c, ns, "web", func(s *appsv1.StatefulSet) { s.Spec.Replicas = new(int32(2)) }); err != nil {
			t.Fatal(err)
		}
		waitForSetPods(t, c, ns, "web", "web-0:web:2:true web-1:web:3:true")
	})
}
