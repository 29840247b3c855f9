package scheduler

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestPinnedPods checks pods whose required node affinity names their nodes with matchFields on
// metadata.name, as daemon pods do: they are filtered on those nodes alone, the filters still apply there,
// and the failure message counts the other nodes as not matching node affinity.
func TestPinnedPods(t *testing.T) {
	In, NotIn := corev1.NodeSelectorOpIn, corev1.NodeSelectorOpNotIn
	pinTo := func(names ...string) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{expr("metadata.name", In, names...)}}
	}
	infra := taint("dedicated", "infra", corev1.TaintEffectNoSchedule)
	nodes := func() []*corev1.Node {
		return []*corev1.Node{
			makeNode("n-a", "4", "8Gi", "110", nil), makeNode("n-b", "4", "8Gi", "110", nil),
			makeNode("n-c", "4", "8Gi", "110", nil, infra), makeNode("n-small", "1", "8Gi", "110", nil),
		}
	}
	cases := []struct {
		name   string
		terms  []corev1.NodeSelectorTerm
		pinned []string // pinnedNodeNames
		host   string   // "" when the pod fits nowhere
		err    string
	}{
		{name: "one node", terms: []corev1.NodeSelectorTerm{pinTo("n-b")}, pinned: []string{"n-b"}, host: "n-b"},
		{name: "the pinned node is tainted", terms: []corev1.NodeSelectorTerm{pinTo("n-c")}, pinned: []string{"n-c"},
			err: fmt.Sprintf("0/4 nodes are available: 1 %s, 3 %s.", taintReason("dedicated", "infra"), reasonNodeAffinity)},
		{name: "the pinned node is too small", terms: []corev1.NodeSelectorTerm{pinTo("n-small")}, pinned: []string{"n-small"},
			err: fmt.Sprintf("0/4 nodes are available: 1 %s, 3 %s.", reasonInsufficientCPU, reasonNodeAffinity)},
		{name: "no such node", terms: []corev1.NodeSelectorTerm{pinTo("gone")}, pinned: []string{"gone"},
			err: fmt.Sprintf("0/4 nodes are available: 4 %s.", reasonNodeAffinity)},
		{name: "terms are ORed", terms: []corev1.NodeSelectorTerm{pinTo("n-c"), pinTo("n-a")}, pinned: []string{"n-a", "n-c"}, host: "n-a"},
		// (Kubernetes allows one value per matchFields requirement.)
		{name: "requirements of a term are ANDed", terms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
			expr("metadata.name", In, "n-a"), expr("metadata.name", In, "n-b")}}}, pinned: []string{},
			err: fmt.Sprintf("0/4 nodes are available: 4 %s.", reasonNodeAffinity)},
		{name: "a term without names admits any node", terms: []corev1.NodeSelectorTerm{pinTo("n-c"), exprTerm(expr("kubernetes.io/hostname", In, "n-a"))},
			host: "n-a"},
		{name: "NotIn does not pin", terms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{expr("metadata.name", NotIn, "n-a", "n-small")}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := with(makePod("p", "2", "1Gi", nil), requiredNodeAffinity(tc.terms...))
			if got := pinnedNodeNames(pod); !slices.Equal(got, tc.pinned) {
				t.Errorf("pinnedNodeNames = %v, want %v", got, tc.pinned)
			}
			if tc.host == "" && tc.err == "" {
				return
			}
			host, fitErr := decide(newTestScheduler(1, nodes(), nil), pod)
			switch {
			case tc.err == "" && (fitErr != nil || host != tc.host):
				t.Errorf("decide = %q, %v; want %s", host, fitErr, tc.host)
			case tc.err != "" && (fitErr == nil || fitErr.Error() != tc.err):
				t.Errorf("decide = %q, %v; want the error %q", host, fitErr, tc.err)
			case tc.err != "" && tc.pinned != nil:
				// Only the pinned nodes that exist were filtered.
				var filtered []string
				for name := range fitErr.Statuses {
					filtered = append(filtered, name)
				}
				slices.Sort(filtered)
				want := slices.DeleteFunc(slices.Clone(tc.pinned), func(n string) bool { return n == "gone" })
				if !slices.Equal(filtered, want) {
					t.Errorf("filtered nodes %v, want %v", filtered, want)
				}
			}
		})
	}
}
