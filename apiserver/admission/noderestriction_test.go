package admission

import (
	"context"
	"slices"
	"strings"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
)

func TestForbiddenNodeLabels(t *testing.T) {
	for _, tc := range []struct {
		name       string
		labels     map[string]string
		old        map[string]string
		wantDenied []string
	}{
		{"unchanged restricted label", map[string]string{"node-restriction.kubernetes.io/pool": "a"}, map[string]string{"node-restriction.kubernetes.io/pool": "a"}, nil},
		{"added restricted label", map[string]string{"node-restriction.kubernetes.io/pool": "a"}, nil, []string{"node-restriction.kubernetes.io/pool"}},
		{"removed restricted label", nil, map[string]string{"example.node-restriction.kubernetes.io/x": "1"}, []string{"example.node-restriction.kubernetes.io/x"}},
		{"unknown kubernetes.io label", map[string]string{"kubernetes.io/role": "master"}, nil, []string{"kubernetes.io/role"}},
		{"kubelet's own labels", map[string]string{"kubernetes.io/hostname": "n1", "topology.kubernetes.io/zone": "z"}, nil, nil},
		{"someone else's prefix", map[string]string{"example.com/rack": "r1"}, nil, nil},
	} {
		if got := forbiddenNodeLabels(tc.labels, tc.old); !slices.Equal(got, tc.wantDenied) {
			t.Errorf("%s: forbidden %v, want %v", tc.name, got, tc.wantDenied)
		}
	}
}

func TestNodeRestrictionDNSSlice(t *testing.T) {
	p := newNodeRestriction(nil, nil)
	node := &user.DefaultInfo{Name: "system:node:n1", Groups: []string{user.NodesGroup}}
	gvr := discoveryv1.SchemeGroupVersion.WithResource("endpointslices")
	gvk := discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice")
	for _, tc := range []struct {
		namespace, name string
		who             user.Info
		ok              bool
	}{
		{"kube-system", "kube-dns-n1", node, true},
		{"kube-system", "kube-dns-n2", node, false},
		{"default", "kube-dns-n1", node, false},
		{"default", "web-abc", &user.DefaultInfo{Name: "alice"}, true},
	} {
		slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: tc.name, Namespace: tc.namespace}}
		attrs := admission.NewAttributesRecord(slice, nil, gvk, tc.namespace, tc.name, gvr, "", admission.Create, &metav1.CreateOptions{}, false, tc.who)
		err := p.Validate(context.Background(), attrs, nil)
		if (err == nil) != tc.ok {
			t.Errorf("%s writing %s/%s: %v, want allowed=%v", tc.who.GetName(), tc.namespace, tc.name, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "may only write the EndpointSlice kube-system/kube-dns-n1") {
			t.Errorf("message: %v", err)
		}
	}
}

func TestNodeRestrictionResourceSlice(t *testing.T) {
	p := newNodeRestriction(nil, nil)
	node := &user.DefaultInfo{Name: "system:node:n1", Groups: []string{user.NodesGroup}}
	gvr := resourcev1.SchemeGroupVersion.WithResource("resourceslices")
	gvk := resourcev1.SchemeGroupVersion.WithKind("ResourceSlice")
	n1, n2 := "n1", "n2"
	for _, tc := range []struct {
		name     string
		op       admission.Operation
		nodeName *string
		who      user.Info
		ok       bool
	}{
		{"create own", admission.Create, &n1, node, true},
		{"create another node's", admission.Create, &n2, node, false},
		{"create a network slice", admission.Create, nil, node, false},
		{"delete own", admission.Delete, &n1, node, true},
		{"delete another node's", admission.Delete, &n2, node, false},
		{"update (the Node authorizer's)", admission.Update, &n2, node, true},
		{"a driver's controller", admission.Create, &n2, &user.DefaultInfo{Name: "alice"}, true},
	} {
		slice := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: resourcev1.ResourceSliceSpec{NodeName: tc.nodeName}}
		var attrs admission.Attributes
		if tc.op == admission.Delete {
			attrs = admission.NewAttributesRecord(nil, slice, gvk, "", "s", gvr, "", tc.op, &metav1.DeleteOptions{}, false, tc.who)
		} else {
			attrs = admission.NewAttributesRecord(slice, slice, gvk, "", "s", gvr, "", tc.op, &metav1.CreateOptions{}, false, tc.who)
		}
		if err := p.Validate(context.Background(), attrs, nil); (err == nil) != tc.ok {
			t.Errorf("%s: %v, want allowed=%v", tc.name, err, tc.ok)
		}
	}
}
