package scheduler_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// The integration tests run a one-server cluster in process: its leader runs the scheduler, and the
// nodes are registered directly through the API (no agents), as simulated nodes.

const zoneKey = "topology.kubernetes.io/zone"

type nodeSpec struct {
	name, zone, cpu string
	labels          map[string]string
	taints          []corev1.Taint
	extra           corev1.ResourceList
}

func createNode(t *testing.T, c kubernetes.Interface, n nodeSpec) {
	t.Helper()
	labels := map[string]string{corev1.LabelHostname: n.name, zoneKey: n.zone}
	for k, v := range n.labels {
		labels[k] = v
	}
	alloc := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(n.cpu), corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods: resource.MustParse("110"),
	}
	for k, v := range n.extra {
		alloc[k] = v
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: n.taints},
		Status: corev1.NodeStatus{Capacity: alloc, Allocatable: alloc,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
	if _, err := c.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func pod(name string, labels map[string]string, cpu string, mutate func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.local/app:1",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}}},
	}
	if mutate != nil {
		mutate(p)
	}
	return p
}

func createPods(t *testing.T, c kubernetes.Interface, pods ...*corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		if _, err := c.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating %s: %v", p.Name, err)
		}
	}
}

// waitBound waits until each pod is bound and returns their nodes.
func waitBound(t *testing.T, c kubernetes.Interface, names ...string) map[string]string {
	t.Helper()
	nodes := map[string]string{}
	deadline := time.Now().Add(30 * time.Second)
	for _, name := range names {
		for {
			p, err := c.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
			if err == nil && p.Spec.NodeName != "" {
				nodes[name] = p.Spec.NodeName
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pod %s not bound after 30s (err %v)", name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nodes
}

// waitEvent waits for an event about a pod with a reason, and returns its message.
func waitEvent(t *testing.T, c kubernetes.Interface, podName, reason string) string {
	t.Helper()
	sel := fields.Set{"involvedObject.name": podName, "reason": reason}.AsSelector().String()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		evs, err := c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: sel})
		if err == nil && len(evs.Items) > 0 {
			return evs.Items[len(evs.Items)-1].Message
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no %s event for %s", reason, podName)
	return ""
}

func TestScheduling(t *testing.T) {
	peers := servertest.Start(t, 1)
	c := peers[0].Client
	ctx := context.Background()
	gpu := corev1.ResourceList{"example.com/gpu": resource.MustParse("2")}
	for _, n := range []nodeSpec{
		{name: "n-a1", zone: "a", cpu: "4", labels: map[string]string{"disktype": "ssd"}},
		{name: "n-a2", zone: "a", cpu: "4"},
		{name: "n-b1", zone: "b", cpu: "4", taints: []corev1.Taint{{Key: "dedicated", Value: "infra", Effect: corev1.TaintEffectNoSchedule}}},
		{name: "n-b2", zone: "b", cpu: "2"},
		{name: "n-c1", zone: "c", cpu: "4", extra: gpu},
		{name: "n-c2", zone: "c", cpu: "8", taints: []corev1.Taint{{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}}},
	} {
		createNode(t, c, n)
	}

	t.Run("mixed workload lands where the rules say", func(t *testing.T) {
		onNode := func(node string) func(*corev1.Pod) {
			return func(p *corev1.Pod) {
				p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
						{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}}
			}
		}
		spread := func(p *corev1.Pod) {
			p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: zoneKey,
				WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}
		}
		antiHost := func(p *corev1.Pod) {
			p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}}}}
		}
		createPods(t, c,
			pod("ssd", map[string]string{"app": "ssd"}, "100m", func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"disktype": "ssd"} }),
			pod("infra", nil, "100m", func(p *corev1.Pod) {
				onNode("n-b1")(p)
				p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "infra", Effect: corev1.TaintEffectNoSchedule}}
			}),
			pod("gpu", nil, "100m", func(p *corev1.Pod) {
				p.Spec.Containers[0].Resources.Requests["example.com/gpu"] = resource.MustParse("1")
				p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"example.com/gpu": resource.MustParse("1")}
			}),
			pod("web-1", map[string]string{"app": "web"}, "100m", spread),
			pod("web-2", map[string]string{"app": "web"}, "100m", spread),
			pod("web-3", map[string]string{"app": "web"}, "100m", spread),
			pod("db-1", map[string]string{"app": "db"}, "100m", antiHost),
			pod("db-2", map[string]string{"app": "db"}, "100m", antiHost),
			pod("cache", nil, "100m", func(p *corev1.Pod) {
				p.Spec.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
					TopologyKey: zoneKey, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "ssd"}}}}}}
			}),
		)
		nodes := waitBound(t, c, "ssd", "infra", "gpu", "web-1", "web-2", "web-3", "db-1", "db-2", "cache")
		for pod, want := range map[string]string{"ssd": "n-a1", "infra": "n-b1", "gpu": "n-c1"} {
			if nodes[pod] != want {
				t.Errorf("%s on %s, want %s", pod, nodes[pod], want)
			}
		}
		zoneOf := map[string]string{"n-a1": "a", "n-a2": "a", "n-b1": "b", "n-b2": "b", "n-c1": "c", "n-c2": "c"}
		if z := zoneOf[nodes["cache"]]; z != "a" {
			t.Errorf("cache in zone %q, want a (with the ssd pod)", z)
		}
		zones := map[string]bool{}
		for _, w := range []string{"web-1", "web-2", "web-3"} {
			zones[zoneOf[nodes[w]]] = true
		}
		if len(zones) != 3 {
			t.Errorf("web pods in zones %v, want one in each of three", zones)
		}
		if nodes["db-1"] == nodes["db-2"] {
			t.Errorf("db pods share node %s despite anti-affinity", nodes["db-1"])
		}
		for pod, node := range nodes {
			if node == "n-c2" || (node == "n-b1" && pod != "infra") {
				t.Errorf("%s on %s, a node whose taint it does not tolerate", pod, node)
			}
		}
		if msg := waitEvent(t, c, "ssd", "Scheduled"); msg != "Successfully assigned default/ssd to n-a1" {
			t.Errorf("Scheduled event %q", msg)
		}
	})

	t.Run("unschedulable pod gets the reasons and schedules once a node appears", func(t *testing.T) {
		createPods(t, c, pod("late", nil, "100m", func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"pool": "late"} }))
		// A node is rejected for its first failing filter; the taint filter runs before node affinity.
		want := "0/6 nodes are available: 1 node(s) had untolerated taint {dedicated: infra}, " +
			"1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, 4 node(s) didn't match Pod's node affinity/selector."
		if msg := waitEvent(t, c, "late", "FailedScheduling"); msg != want {
			t.Errorf("FailedScheduling %q, want %q", msg, want)
		}
		// The event and the condition are separate writes: the condition may land a moment after the event.
		var cond *corev1.PodCondition
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			p, err := c.CoreV1().Pods("default").Get(ctx, "late", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for i := range p.Status.Conditions {
				if p.Status.Conditions[i].Type == corev1.PodScheduled {
					cond = &p.Status.Conditions[i]
				}
			}
			if cond != nil {
				break
			}
		}
		if cond == nil || cond.Status != corev1.ConditionFalse || cond.Reason != "Unschedulable" || cond.Message != want {
			t.Errorf("PodScheduled condition %+v", cond)
		}
		createNode(t, c, nodeSpec{name: "n-late", zone: "a", cpu: "2", labels: map[string]string{"pool": "late"}})
		if node := waitBound(t, c, "late")["late"]; node != "n-late" {
			t.Errorf("late on %s, want n-late", node)
		}
	})

	t.Run("resources: the aggregate names each shortfall", func(t *testing.T) {
		createPods(t, c, pod("huge", nil, "64", nil))
		msg := waitEvent(t, c, "huge", "FailedScheduling")
		for _, part := range []string{"0/7 nodes are available:", "Insufficient cpu", "node(s) had untolerated taint {dedicated: infra}",
			"node(s) had untolerated taint {node.kubernetes.io/not-ready: }"} {
			if !strings.Contains(msg, part) {
				t.Errorf("FailedScheduling %q lacks %q", msg, part)
			}
		}
	})

	t.Run("preemption evicts lower-priority pods and nominates the node", func(t *testing.T) {
		createNode(t, c, nodeSpec{name: "n-prio", zone: "b", cpu: "2", labels: map[string]string{"pool": "prio"}})
		if _, err := c.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "urgent"}, Value: 1000}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		prio := func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"pool": "prio"} }
		createPods(t, c, pod("low-1", nil, "1", prio), pod("low-2", nil, "1", prio))
		waitBound(t, c, "low-1", "low-2")
		time.Sleep(200 * time.Millisecond) // let the class reach the admission informer
		createPods(t, c, pod("vip", nil, "1", func(p *corev1.Pod) { prio(p); p.Spec.PriorityClassName = "urgent" }))
		waitEvent(t, c, "vip", "FailedScheduling")
		// Exactly one victim is evicted: deleted gracefully, as a node agent would then confirm.
		var victims []string
		deadline := time.Now().Add(30 * time.Second)
		for len(victims) == 0 && time.Now().Before(deadline) {
			for _, name := range []string{"low-1", "low-2"} {
				if p, err := c.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{}); err == nil && p.DeletionTimestamp != nil {
					victims = append(victims, name)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		if len(victims) != 1 {
			t.Fatalf("victims %v, want exactly one of low-1, low-2", victims)
		}
		if msg := waitEvent(t, c, victims[0], "Preempted"); !strings.Contains(msg, "on node n-prio") {
			t.Errorf("Preempted event %q", msg)
		}
		p, _ := c.CoreV1().Pods("default").Get(ctx, "vip", metav1.GetOptions{})
		for i := 0; i < 100 && p.Status.NominatedNodeName == ""; i++ {
			time.Sleep(100 * time.Millisecond)
			p, _ = c.CoreV1().Pods("default").Get(ctx, "vip", metav1.GetOptions{})
		}
		if p.Status.NominatedNodeName != "n-prio" {
			t.Errorf("nominatedNodeName %q, want n-prio", p.Status.NominatedNodeName)
		}
		zero := int64(0)
		if err := c.CoreV1().Pods("default").Delete(ctx, victims[0], metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		if node := waitBound(t, c, "vip")["vip"]; node != "n-prio" {
			t.Errorf("vip on %s, want n-prio", node)
		}
	})
}
