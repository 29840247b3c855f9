package auth

import (
	"context"
	"slices"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/authorization/union"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/kubernetes/pkg/auth/nodeidentifier"
	"k8s.io/kubernetes/plugin/pkg/auth/authorizer/node"
	"k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac"
	"k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac/bootstrappolicy"
	"k8s.io/utils/ptr"

	"github.com/skiff-dev/skiff/internal/join"
	"github.com/skiff-dev/skiff/internal/version"
)

// Authorization is who may do what, decided as kube-apiserver with --authorization-mode=Node,RBAC decides
// it, by Kubernetes' own authorizers: the public health and version paths first, then system:masters, the
// Node authorizer (a node reaches only what its pods use), and RBAC.
type Authorization struct {
	Authorizer authorizer.Authorizer
	// Rules enumerates a user's permissions (SelfSubjectRulesReview, kubectl auth can-i --list); system:masters
	// holds cluster-admin through the bootstrap policy's binding, as in Kubernetes.
	Rules authorizer.RuleResolver
}

// NewAuthorization builds the authorizers over informers of factory, which the API server starts after it
// begins serving; until RBAC's caches fill, only system:masters (the loopback client among them) and the
// public paths are allowed.
func NewAuthorization(factory informers.SharedInformerFactory) (*Authorization, error) {
	rbacInformers := factory.Rbac().V1()
	roles := &rbac.RoleGetter{Lister: rbacInformers.Roles().Lister()}
	roleBindings := &rbac.RoleBindingLister{Lister: rbacInformers.RoleBindings().Lister()}
	clusterRoles := &rbac.ClusterRoleGetter{Lister: rbacInformers.ClusterRoles().Lister()}
	clusterRoleBindings := &rbac.ClusterRoleBindingLister{Lister: rbacInformers.ClusterRoleBindings().Lister()}
	rbacAuthorizer := rbac.New(roles, roleBindings, clusterRoles, clusterRoleBindings)

	graph := node.NewGraph()
	if err := feedNodeGraph(graph, factory); err != nil {
		return nil, err
	}
	nodeAuthorizer := node.NewAuthorizer(graph, nodeidentifier.NewDefaultNodeIdentifier(), bootstrappolicy.NodeRules())
	masters := authorizerfactory.NewPrivilegedGroups(user.SystemPrivilegedGroup)

	a, err := union.New(
		union.NamedAuthorizer{AuthorizerName: "public", Authorizer: publicPathAuthorizer},
		union.NamedAuthorizer{AuthorizerName: "system:masters", Authorizer: masters},
		union.NamedAuthorizer{AuthorizerName: "Node", Authorizer: nodeAuthorizer},
		union.NamedAuthorizer{AuthorizerName: "RBAC", Authorizer: rbacAuthorizer},
	)
	if err != nil {
		return nil, err
	}
	return &Authorization{
		Authorizer: a,
		Rules:      union.NewRuleResolvers(nodeAuthorizer, rbacAuthorizer),
	}, nil
}

// publicPaths are readable without credentials, as kube-apiserver's system:public-info-viewer role allows
// (allowed here before RBAC's caches fill, so probes work from the start); the cluster CA is public too
// (agents check it against the join token before trusting it).
var publicPaths = []string{"/livez", "/readyz", "/healthz", "/version", join.CAPath, version.Path}

// selfAuthenticatingPaths are the server join's endpoints: open to anyone with any verb, because their
// handlers check the cluster token themselves (a joining server has no credential the API knows).
var selfAuthenticatingPaths = []string{join.ServerCAPath, join.ServerJoinPath}

func isPublicPath(path string) bool {
	return pathIn(path, publicPaths) || slices.Contains(selfAuthenticatingPaths, path)
}

func pathIn(path string, paths []string) bool {
	for _, p := range paths {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

var publicPathAuthorizer = authorizer.AuthorizerFunc(func(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if a.IsResourceRequest() {
		return authorizer.DecisionNoOpinion, "", nil
	}
	if (a.GetVerb() == "get" && pathIn(a.GetPath(), publicPaths)) || slices.Contains(selfAuthenticatingPaths, a.GetPath()) {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, "", nil
})

// feedNodeGraph keeps the Node authorizer's graph of which pods run where and what they reference, and
// which PersistentVolume each claim is bound to (so a node may read the volumes of its pods' claims), and
// which node each ResourceSlice belongs to (so a node's DRA drivers may get, update and delete its own
// slices), and which node each PodCertificateRequest names (so a node may get the requests it made).
// Skiff serves no VolumeAttachments, so the library's AddGraphEventHandlers (which needs their informer too)
// is replaced by its pod, volume, slice and request parts.
func feedNodeGraph(graph *node.Graph, factory informers.SharedInformerFactory) error {
	_, err := factory.Core().V1().PersistentVolumes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { graph.AddPV(obj.(*corev1.PersistentVolume)) },
		UpdateFunc: func(oldObj, obj any) {
			old, pv := oldObj.(*corev1.PersistentVolume), obj.(*corev1.PersistentVolume)
			if !apiequality.Semantic.DeepEqual(old.Spec, pv.Spec) {
				graph.AddPV(pv)
			}
		},
		DeleteFunc: func(obj any) {
			if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tombstone.Obj
			}
			if pv, ok := obj.(*corev1.PersistentVolume); ok {
				graph.DeletePV(pv.Name)
			}
		},
	})
	if err != nil {
		return err
	}
	// A slice's node is immutable: adds and deletes are all the graph needs, as in the library.
	_, err = factory.Resource().V1().ResourceSlices().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			slice := obj.(*resourcev1.ResourceSlice)
			graph.AddResourceSlice(slice.Name, ptr.Deref(slice.Spec.NodeName, ""))
		},
		DeleteFunc: func(obj any) {
			if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tombstone.Obj
			}
			if slice, ok := obj.(*resourcev1.ResourceSlice); ok {
				graph.DeleteResourceSlice(slice.Name)
			}
		},
	})
	if err != nil {
		return err
	}
	// A request's node is immutable, as a slice's is.
	_, err = factory.Certificates().V1().PodCertificateRequests().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { graph.AddPodCertificateRequest(obj.(*certificatesv1.PodCertificateRequest)) },
		DeleteFunc: func(obj any) {
			if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tombstone.Obj
			}
			if pcr, ok := obj.(*certificatesv1.PodCertificateRequest); ok {
				graph.DeletePodCertificateRequest(pcr)
			}
		},
	})
	if err != nil {
		return err
	}
	_, err = factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { addPodToGraph(graph, nil, obj.(*corev1.Pod)) },
		UpdateFunc: func(oldObj, obj any) {
			addPodToGraph(graph, oldObj.(*corev1.Pod), obj.(*corev1.Pod))
		},
		DeleteFunc: func(obj any) {
			if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tombstone.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok && pod.Spec.NodeName != "" {
				graph.DeletePod(pod.Name, pod.Namespace)
			}
		},
	})
	return err
}

// addPodToGraph adds a bound pod's edges; an update that changes neither the node, the UID, the ephemeral
// containers nor the claims generated for the pod (the only references that can change) is skipped, as the
// library does.
func addPodToGraph(graph *node.Graph, old, pod *corev1.Pod) {
	if pod.Spec.NodeName == "" {
		return
	}
	if old != nil && old.Spec.NodeName == pod.Spec.NodeName && old.UID == pod.UID &&
		len(pod.Spec.EphemeralContainers) <= len(old.Spec.EphemeralContainers) &&
		resourceclaim.PodStatusEqual(old.Status.ResourceClaimStatuses, pod.Status.ResourceClaimStatuses) &&
		resourceclaim.PodExtendedStatusEqual(old.Status.ExtendedResourceClaimStatus, pod.Status.ExtendedResourceClaimStatus) {
		return
	}
	graph.AddPod(pod)
}
