package scheduler

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

// TestCacheLabelIndex: the label index follows pods as they are bound, relabelled, assumed, forgotten and
// deleted, and only offers pods on known nodes.
func TestCacheLabelIndex(t *testing.T) {
	c := NewCache()
	c.SetNode(stdNode("n1", nil))
	c.SetNode(stdNode("n2", nil))
	bound := func(name, node string, lbls map[string]string) *PodInfo {
		p := makePod(name, "", "", lbls)
		p.UID = types.UID("uid-" + p.Name)
		p.Spec.NodeName = node
		return NewPodInfo(p)
	}
	a := bound("a", "n1", map[string]string{"app": "web", "tier": "front"})
	b := bound("b", "n2", map[string]string{"app": "web"})
	c.SetPod(a.Pod)
	c.SetPod(b.Pod)
	assumed := bound("c", "", map[string]string{"app": "db"})
	if err := c.Assume(assumed, "n2"); err != nil {
		t.Fatal(err)
	}

	names := func(selector string) []string {
		t.Helper()
		sel, err := labels.Parse(selector)
		if err != nil {
			t.Fatal(err)
		}
		snap := c.Snapshot()
		defer snap.Release()
		pods, ok := snap.candidates(sel)
		if !ok {
			return nil
		}
		out := []string{}
		for _, p := range pods {
			out = append(out, p.info.Pod.Name+"@"+p.node.Name())
		}
		slices.Sort(out)
		return out
	}
	check := func(what, selector string, want ...string) {
		t.Helper()
		got := names(selector)
		if want == nil {
			want = []string{}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: candidates of %q = %v, want %v", what, selector, got, want)
		}
	}
	check("bound pods", "app=web", "a@n1", "b@n2")
	check("the smaller requirement is used", "app=web,tier=front", "a@n1")
	check("in", "app in (web,db)", "a@n1", "b@n2", "c@n2")
	check("assumed pod", "app=db", "c@n2")
	if got := names("app"); got != nil {
		t.Errorf("an Exists-only selector must not be served by the index, got %v", got)
	}

	relabelled := bound("a", "n1", map[string]string{"app": "api"})
	c.SetPod(relabelled.Pod)
	check("after relabelling", "app=web", "b@n2")
	check("after relabelling", "app=api", "a@n1")
	check("after relabelling", "tier=front")
	c.Forget(assumed.Pod.UID)
	check("after forgetting the assumption", "app=db")
	c.RemoveNode("n2")
	check("pods of a removed node", "app=web")
	c.RemovePod(b.Pod.UID)
	c.RemovePod(relabelled.Pod.UID)
	if len(c.byLabel) != 0 {
		t.Errorf("index not empty after every pod left: %v", c.byLabel)
	}
}

// TestPodInfoDuringResize: a pod whose resize is pending or under way counts with the larger of its spec's
// requests and what its node allocated, as kube-scheduler counts it.
func TestPodInfoDuringResize(t *testing.T) {
	for _, tc := range []struct {
		spec, allocated string
		want            int64
	}{{"100m", "500m", 500}, {"800m", "500m", 800}, {"300m", "", 300}} {
		p := makePod("r", tc.spec, "", nil)
		p.Spec.NodeName = "n1"
		if tc.allocated != "" {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", AllocatedResources: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(tc.allocated)}}}
		}
		if got := NewPodInfo(p).Requests.MilliCPU; got != tc.want {
			t.Errorf("spec %s, allocated %q: %dm counted, want %dm", tc.spec, tc.allocated, got, tc.want)
		}
	}
}
