package auth

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/kubernetes/pkg/auth/nodeidentifier"
	"k8s.io/kubernetes/plugin/pkg/auth/authorizer/node"
	"k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac/bootstrappolicy"
)

// TestGraphFollowsGeneratedClaims: a bound pod whose generated claim's name appears in its status later
// gives its node that claim, as the library's graph populator does; an update that changes nothing the
// graph holds is skipped.
func TestGraphFollowsGeneratedClaims(t *testing.T) {
	graph := node.NewGraph()
	authz := node.NewAuthorizer(graph, nodeidentifier.NewDefaultNodeIdentifier(), bootstrappolicy.NodeRules())
	template := "gpu-template"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u1"},
		Spec: corev1.PodSpec{NodeName: "n1",
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &template}}},
	}
	mayGet := func() bool {
		decision, _, err := authz.Authorize(context.Background(), authorizer.AttributesRecord{
			User: &user.DefaultInfo{Name: "system:node:n1", Groups: []string{user.NodesGroup}},
			Verb: "get", Namespace: "ns", APIGroup: "resource.k8s.io", Resource: "resourceclaims", Name: "p-gpu-x7k2",
			ResourceRequest: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		return decision == authorizer.DecisionAllow
	}
	addPodToGraph(graph, nil, pod)
	if mayGet() {
		t.Fatal("the node may read a claim not yet generated for its pod")
	}
	withClaim := pod.DeepCopy()
	generated := "p-gpu-x7k2"
	withClaim.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: &generated}}
	addPodToGraph(graph, pod, withClaim)
	if !mayGet() {
		t.Fatal("the claim generated for the node's pod is refused to the node")
	}
}
